"""Sphinx extension: a student and an instructor notebook for every chapter, linked from its page.

For each page under ``chapters/`` that is a notebook, the build writes into ``<site>/notebooks/``:

* ``NN-name-instructor.ipynb``: the chapter as it is, solutions in;
* ``NN-name-student.ipynb``: the same with every solution removed (code cells tagged ``solution``, the ``solution``
  directives around them, and the hidden guards right after a solution, which quote it). The exercise cells (tagged
  ``exercise``) stay as stubs, and the check cells after them report "not written yet" until the student fills them
  in, so the notebook runs to the end.

Both have no outputs; the code the website hides (tags ``remove-cell``, ``remove-input``, ``hide-input``) starts
collapsed in JupyterLab. ``make lab`` opens the student notebooks (tools/lab.py). Each chapter page gets a line
with links to its two notebooks.
"""

from __future__ import annotations

import html
from pathlib import Path

import jupytext
import nbformat
from lab_cache import _is_notebook
from sphinx.application import Sphinx

from transformer_lab.course import Solution, without_solutions

NOTE = {
    "student": ("**Student notebook.** Solutions are removed. Fill in each cell marked `raise NotImplementedError`"
                " and run the check cell after it; `python -m transformer_lab check N answers.py` grades a file."),
    "instructor": "**Instructor notebook.** Complete, with every solution.",
}

_HIDDEN_ON_SITE = {"remove-cell", "remove-input", "hide-input"}


def chapter_pages(srcdir: Path) -> list[Path]:
    return [p for p in sorted((srcdir / "chapters").glob("*.md")) if _is_notebook(p)]


def _with_note(nb: nbformat.NotebookNode, kind: str) -> nbformat.NotebookNode:
    nb.cells.insert(0, nbformat.v4.new_markdown_cell(NOTE[kind]))
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            if _HIDDEN_ON_SITE & set(cell.metadata.get("tags", [])):  # page set-up and claim guards: collapsed
                cell.metadata.setdefault("jupyter", {})["source_hidden"] = True
    nb.metadata.pop("jupytext", None)
    return nb


def instructor_notebook(page: Path) -> nbformat.NotebookNode:
    """The chapter as a notebook, solutions in."""
    return _with_note(jupytext.read(page), "instructor")


def student_notebook(page: Path) -> nbformat.NotebookNode:
    """The chapter as a notebook with every solution removed: code and text (transformer_lab.course), and the
    hidden guard cells right after a solution, which quote its sentences."""
    nb = jupytext.read(page)
    cells, after_solution = [], False
    for cell in without_solutions(nb):
        if isinstance(cell, Solution):
            after_solution = True
        elif not (after_solution and cell.cell_type == "code" and "remove-cell" in cell.metadata.get("tags", [])):
            cells.append(cell)
            after_solution = False
    nb.cells = cells
    return _with_note(nb, "student")


def notebook_names(page: Path) -> dict[str, str]:
    return {kind: f"{page.stem}-{kind}.ipynb" for kind in ("student", "instructor")}


def _kinds(app: Sphinx) -> tuple[str, ...]:
    """The notebooks this edition ships (tools/edition.py): the student edition has no instructor notebook."""
    return ("student",) if getattr(app.config, "tl_edition", "instructor") == "student" else ("student", "instructor")


def write_notebooks(app: Sphinx, exception) -> None:
    if exception or app.builder.format != "html":
        return
    out = Path(app.outdir) / "notebooks"
    out.mkdir(exist_ok=True)
    for page in chapter_pages(Path(app.srcdir)):
        names = notebook_names(page)
        nbformat.write(student_notebook(page), out / names["student"])
        if "instructor" in _kinds(app):
            nbformat.write(instructor_notebook(page), out / names["instructor"])


def add_links(app: Sphinx, pagename: str, templatename, context, doctree) -> None:
    page = Path(app.srcdir) / f"{pagename}.md"
    if not pagename.startswith("chapters/") or not page.is_file() or not _is_notebook(page):
        return
    names = notebook_names(page)
    chinese = (app.config.language or "").startswith("zh")
    label = ({"student": "学生版笔记本", "instructor": "教师版笔记本"} if chinese
             else {kind: f"{kind} notebook" for kind in names})
    links = " · ".join(
        f'<a href="{html.escape(context["pathto"]("notebooks/" + names[kind], 1))}" download>{label[kind]}</a>'
        for kind in _kinds(app))
    line = (f'\n<p class="tl-downloads">下载本章（英文）：{links}。</p>\n' if chinese
            else f'\n<p class="tl-downloads">Download this chapter as a {links}.</p>\n')
    body = context["body"]
    at = body.find("</h1>")
    context["body"] = body[:at + 5] + line + body[at + 5:] if at >= 0 else line + body


def download_menu(app: Sphinx, pagename: str, templatename, context, doctree) -> None:
    """The theme's download menu offers a chapter's notebooks, and the page's source only where the site copies
    it: the student edition does not (it holds the solutions)."""
    group = next((b for b in context.get("header_buttons", []) if b.get("label") == "download-buttons"), None)
    if group is None:
        return
    page = Path(app.srcdir) / f"{pagename}.md"
    notebooks = []
    if pagename.startswith("chapters/") and page.is_file() and _is_notebook(page):
        names = notebook_names(page)
        notebooks = [{"type": "link", "url": context["pathto"]("notebooks/" + names[kind], 1), "text": f"{kind} .ipynb",
                      "tooltip": f"Download the {kind} notebook", "icon": "fas fa-code",
                      "label": f"download-{kind}-notebook-button"} for kind in _kinds(app)]
    group["buttons"] = notebooks + [b for b in group["buttons"] if b.get("label") == "download-pdf-button"
                                    or (b.get("label") == "download-source-button" and app.config.html_copy_source)]


def setup(app: Sphinx) -> dict:
    app.connect("html-page-context", add_links)
    app.connect("html-page-context", download_menu, priority=502)  # after sphinx-book-theme fills the menu (501)
    app.connect("build-finished", write_notebooks)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
