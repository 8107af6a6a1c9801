"""The book's exercises as an nbgrader course: one assignment per chapter (every chapter).

    export_course(Path("course"))                 # all chapters
    export_course(Path("course"), chapters=[8])   # -> course/source/ch08/ch08.ipynb, course/nbgrader_config.py

A chapter's exercises are written in its MyST page (``chapters/NN-name.md``, read with jupytext): a stub cell
tagged ``exercise``, a check cell, then the solution between ``{solution-start}`` and ``{solution-end}``. The
assignment notebook holds the chapter's ``## Exercises`` section, where

* each stub becomes an nbgrader *solution* cell: the stub's ``def`` line, then the solution's body between
  ``### BEGIN SOLUTION`` and ``### END SOLUTION`` (``nbgrader generate_assignment`` turns it back into a stub);
* its check cell becomes a locked, graded *autograder test* cell worth :data:`POINTS`, which asserts that the
  chapter's checker passes;
* written solutions are removed, and so are the hidden ``remove-cell`` cells (the page's ``claim()`` guards).

The rest of the chapter stays in the book: autograding runs every cell of every submission, and a whole chapter
executes for up to a minute, renders every figure's frames and has hidden cells that define names its visible
ones use, all for nothing graded. A locked first cell imports what the exercises use (never the book's own
version of a function the student writes), so a submission runs in seconds after ``import torch``.

:func:`without_solutions` is also what ``tools/course_notebooks.py`` uses to write the student notebooks.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import jupytext
import nbformat
from nbformat import NotebookNode

BOOK = Path(__file__).resolve().parents[1]  # the repository: chapters/ lives beside the package
COURSE_ID = "transformer-math-lab"
POINTS = 1  # each exercise's autograder test cell
SCHEMA_VERSION = 3  # nbgrader's cell-metadata schema

# A solution written as one directive (``` or ```` fenced), and the gated pair around a longer one.
_SOLUTION_BLOCK = re.compile(r"^(`{3,}|:{3,})\{solution\}.*?^\1[ \t]*$\n?", re.S | re.M)
_GATE = re.compile(r"^(`{3,})\{solution-(start|end)\}.*?^\1[ \t]*$\n?", re.S | re.M)
_EXERCISE = re.compile(r"^(`{3,}|:{3,})\{exercise\}[^\n]*\n(?P<body>.*?)^\1[ \t]*$", re.S | re.M)
_OPTION = re.compile(r"\A(?:[ \t]*:[\w-]+:[^\n]*\n)*\s*")  # a directive's ":label: x" lines
_HEADING = re.compile(r"^## ", re.M)
_EXERCISES = re.compile(r"^## Exercises[ \t]*$", re.M)

CONFIG = '''"""nbgrader's configuration for this course, written by `python -m transformer_lab export-course`."""

import os

c = get_config()  # noqa: F821  (nbgrader provides it)
c.CourseDirectory.course_id = "{course_id}"
c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(c.CourseDirectory.root, "gradebook.db")
c.Execute.timeout = 60  # seconds per cell; each checker takes well under 10 s
c.Execute.startup_timeout = 120  # seconds for the kernel to start on a busy hub
'''


@dataclass
class Solution:
    """The code cells between one ``{solution-start}`` and its ``{solution-end}``."""

    cells: list[NotebookNode] = field(default_factory=list)


def without_solutions(nb: NotebookNode) -> list[NotebookNode | Solution]:
    """The cells of a chapter with every solution taken out: the text and cells between ``{solution-start}`` and
    ``{solution-end}`` (even where a gate sits mid-cell), one-directive ``{solution}`` blocks, and code cells
    tagged ``solution``. Each gated region leaves a :class:`Solution` holding its code cells in its place."""
    out: list[NotebookNode | Solution] = []
    region: Solution | None = None
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            if region is not None:
                region.cells.append(cell)
            elif "solution" not in cell.metadata.get("tags", []):
                out.append(cell)
            continue
        kept, pos = [], 0
        for gate in _GATE.finditer(cell.source):
            if region is None:
                kept.append(cell.source[pos:gate.start()])
            region = Solution() if gate[2] == "start" else None
            if region is not None:
                out.append(region)
            pos = gate.end()
        if region is None:
            kept.append(cell.source[pos:])
        cell.source = _SOLUTION_BLOCK.sub("", "".join(kept)).strip()
        if cell.source:
            out.append(cell)
    return out


# ---------------------------------------------------------------- one chapter as an nbgrader notebook
def _nbgrader(cell: NotebookNode, grade_id: str, *, solution=False, grade=False, locked=False) -> NotebookNode:
    cell.metadata = {"nbgrader": {"grade": grade, "grade_id": grade_id, "locked": locked,
                                  "schema_version": SCHEMA_VERSION, "solution": solution, "task": False}}
    if grade:
        cell.metadata["nbgrader"]["points"] = POINTS
    cell.id = grade_id
    return cell


def _function(source: str, name: str | None = None) -> tuple[ast.Module, ast.FunctionDef]:
    tree = ast.parse(source)
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and name in (None, n.name)]
    if len(defs) != 1:
        raise ValueError(f"expected one function{f' {name}' if name else ''} in the cell:\n{source}")
    return tree, defs[0]


def _lines(source: str, first: int, last: int) -> str:
    """Lines ``first`` to ``last`` of ``source`` (1-based, inclusive), as ast numbers them."""
    return "\n".join(source.splitlines()[first - 1:last])


def _body_start(fn: ast.FunctionDef) -> ast.stmt:
    """The first statement of ``fn`` after its docstring."""
    docstring = isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant)
    return fn.body[1] if docstring and len(fn.body) > 1 else fn.body[0]


def solution_cell(stub: str, solution: Solution) -> tuple[str, str]:
    """The function ``stub`` defines and its nbgrader solution source: the stub's ``def`` line (and docstring),
    then the solution's imports, helpers and body between ``### BEGIN SOLUTION`` and ``### END SOLUTION``.
    The solution cell's other top-level lines (a check call, a demonstration) are left out."""
    _, stub_fn = _function(stub)
    code = [c for c in solution.cells if c.cell_type == "code"
            and not {"remove-cell", "remove-input"} & set(c.metadata.get("tags", []))]
    sources = [c.source for c in code if any(isinstance(n, ast.FunctionDef) and n.name == stub_fn.name
                                             for n in ast.parse(c.source).body)]
    if len(sources) != 1:
        raise ValueError(f"the solution of {stub_fn.name} should define it in one code cell, found {len(sources)}")
    tree, fn = _function(sources[0], stub_fn.name)
    if ast.dump(fn.args) != ast.dump(stub_fn.args):
        raise ValueError(f"the solution of {stub_fn.name} has another signature than its stub")
    indent = " " * _body_start(stub_fn).col_offset
    helpers = [_lines(sources[0], n.lineno, n.end_lineno) for n in tree.body
               if isinstance(n, ast.Import | ast.ImportFrom | ast.ClassDef)
               or (isinstance(n, ast.FunctionDef) and n is not fn)]
    body = textwrap.dedent(_lines(sources[0], _body_start(fn).lineno, fn.end_lineno))
    inner = "\n\n".join([*helpers, body]) if helpers else body
    head = _lines(stub, stub_fn.lineno, _body_start(stub_fn).lineno - 1)
    return stub_fn.name, (f"{head}\n{indent}### BEGIN SOLUTION\n{textwrap.indent(inner, indent)}\n"
                          f"{indent}### END SOLUTION")


def _test_source(chapter: int, name: str) -> str:
    from transformer_lab.exercises import registry  # torch: only when a course is exported

    checker = registry(chapter).get(name)
    if checker is None:
        raise ValueError(f"exercise {name} of chapter {chapter} has no checker in its exercises module")
    module = checker.__module__.rsplit(".", 1)[1]  # ch1
    return (f"from transformer_lab.exercises import {module}\n\n_r = {module}.{checker.__name__}({name})\n"
            f"print(_r)\nassert _r.passed, _r.message")


def _imports(nb: NotebookNode, code: list[str], exercises: set[str]) -> list[str]:
    """The chapter's top-level imports of the names ``code`` uses, once each, in order; never an import of a name
    the student writes (``exercises``), which would hand over the book's reference."""
    used = {n.id for source in code for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)} - exercises
    seen: dict[str, None] = {}
    for cell in nb.cells:
        try:
            tree = ast.parse(cell.source) if cell.cell_type == "code" else ast.Module(body=[])
        except SyntaxError:  # a cell with IPython magics
            continue
        for node in tree.body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                node.names = [a for a in node.names if (a.asname or a.name).split(".")[0] in used]
                seen |= {ast.unparse(node): None} if node.names else {}
    return list(seen)


def _exercise_text(markdown: str, book: Path = BOOK) -> str:
    """MyST's ``{exercise}`` directive and its roles as plain Markdown, which Jupyter and nbgrader's formgrader
    show."""
    text = _EXERCISE.sub(lambda m: "**Exercise.** " + _OPTION.sub("", m["body"], count=1).rstrip(), markdown)
    return _ROLE.sub(lambda m: _plain_role(m["role"], m["text"], m["target"] or m["text"], book), text)


_ROLE = re.compile(r"\{(?P<role>ref|doc|cite|cite:t|cite:p)\}`(?P<text>[^`<]*?)\s*(?:<(?P<target>[^`>]+)>)?`")


def _plain_role(role: str, text: str, target: str, book: Path) -> str:
    """``{ref}`` as the section's title and chapter, ``{doc}`` as the page's title, ``{cite}`` as "Author (year)"."""
    if role.startswith("cite"):
        bib = (book / "book" / "references.bib").read_text(encoding="utf-8")
        entry = re.search(r"@\w+\{" + re.escape(target) + r",(.*?)\n\}", bib, re.S)
        if entry is None:
            return target
        author, year = (re.search(rf"\b{k}\s*=\s*\{{(.*?)\}}", entry[1], re.S) for k in ("author", "year"))
        names = [a.split(",")[0].strip() for a in author[1].split(" and ")]
        who = names[0] + (" et al." if len(names) > 2 else f" and {names[1]}" if len(names) == 2 else "")
        return f"{who} ({year[1]})"
    if text and text != target:  # {ref}`words <label>`, {doc}`words <page>`
        return text
    if role == "doc":
        page = next(iter(sorted(book.glob(f"*/{Path(target).name}.md"))), None)
        title = re.search(r"^# (.+)$", page.read_text(encoding="utf-8"), re.M) if page else None
        return f"*{title[1] if title else target}*"
    for page in sorted(book.glob("chapters/*.md")):
        found = re.search(rf"^\({re.escape(target)}\)=\n(?:\([^)\n]+\)=\n)*#+ (.+)$", page.read_text(encoding="utf-8"),
                          re.M)
        if found:
            return f"*{found[1]}* (chapter {int(page.name[:2])})"
    return target


def _is_markdown(part: NotebookNode | Solution) -> bool:
    return not isinstance(part, Solution) and part.cell_type == "markdown"


def _section(cells: list, page: Path) -> list:
    """The cells of the ``## Exercises`` section, its first and last Markdown cells cut at the headings."""
    start = next((i for i, c in enumerate(cells) if _is_markdown(c) and _EXERCISES.search(c.source)), None)
    if start is None:
        raise ValueError(f"{page.name} has no '## Exercises' section")
    first = cells[start]
    first.source = first.source[_EXERCISES.search(first.source).start():]
    section = [first]
    for cell in cells[start + 1:]:
        heading = _HEADING.search(cell.source) if _is_markdown(cell) else None
        if heading:
            cell.source = cell.source[:heading.start()].strip()
            section += [cell] if cell.source else []
            break
        section.append(cell)
    return section


def assignment_notebook(chapter: int, book: Path = BOOK) -> NotebookNode:
    """Chapter ``chapter``'s exercises as an nbgrader source notebook (see the module docstring)."""
    pages = sorted((book / "chapters").glob(f"{chapter:02d}-*.md"))
    if len(pages) != 1:
        raise FileNotFoundError(f"no chapter {chapter} page in {book / 'chapters'}")
    page = pages[0]
    nb = jupytext.read(page)
    title = next((m[1] for c in nb.cells if c.cell_type == "markdown"
                  for m in [re.search(r"^# (.+)$", c.source, re.M)] if m), page.stem)
    all_stubs = sum("exercise" in c.metadata.get("tags", []) for c in nb.cells)
    parts = _section(without_solutions(nb), page)
    cells = []
    pending, names = None, set()
    for part in parts:
        if isinstance(part, Solution):
            if pending is None:  # a written solution (no stub before it): already out of the text
                continue
            name, source = solution_cell(pending.source, part)
            cells += [_nbgrader(nbformat.v4.new_code_cell(source), name, solution=True),
                      _nbgrader(nbformat.v4.new_code_cell(_test_source(chapter, name)), f"test_{name}",
                                grade=True, locked=True)]
            names.add(name)
            pending = None
        elif "exercise" in part.metadata.get("tags", []):
            pending = part
        elif part.cell_type == "markdown":
            cells.append(nbformat.v4.new_markdown_cell(_exercise_text(part.source)))
        elif pending is None and "remove-cell" not in part.metadata.get("tags", []):
            cells.append(nbformat.v4.new_code_cell(part.source))
        # else: the stub's own check cell, replaced by the test cell
    if len(names) != all_stubs:
        raise ValueError(f"{page.name} has {all_stubs} exercise stubs, {len(names)} of them followed by a solution "
                         f"in its Exercises section")
    code = [c.source for c in cells if c.cell_type == "code"]
    cells[:0] = [nbformat.v4.new_markdown_cell(
                     f"# Chapter {chapter}: {title} (exercises)\n\nWrite each function where it says `YOUR CODE "
                     f"HERE`; the cell after it checks your answer. The chapter itself is in the book."),
                 _nbgrader(nbformat.v4.new_code_cell("\n".join(_imports(nb, code, names))), "setup", locked=True)]
    for i, cell in enumerate(cells):
        if "nbgrader" not in cell.metadata:  # graded cells are named by their grade_id
            cell.id = f"cell-{i}"
    out = nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": nb.metadata["kernelspec"]})
    nbformat.validate(out)
    return out


def chapter_numbers(book: Path = BOOK) -> list[int]:
    """The numbers of the book's chapters (``chapters/NN-name.md``)."""
    return sorted(int(p.name[:2]) for p in (book / "chapters").glob("[0-9][0-9]-*.md"))


def export_course(dest: Path, chapters=None, *, book: Path = BOOK) -> Path:
    """Write an nbgrader course folder at ``dest``: ``source/chNN/chNN.ipynb`` for each of ``chapters`` (default:
    all; replaced if there) and ``nbgrader_config.py`` (kept if there, so a lecturer's edits survive). Returns
    ``dest``."""
    known = chapter_numbers(book)
    if not known:
        raise FileNotFoundError(f"no chapters in {book / 'chapters'}: the course is exported from the book's "
                                f"repository (a clone with chapters/ beside transformer_lab/)")
    chapters = known if chapters is None else list(chapters)
    unknown = [n for n in chapters if n not in known]
    if unknown or not chapters:
        raise ValueError(f"the chapters are {', '.join(map(str, known))}; got {unknown or 'none'}")
    notebooks = {n: assignment_notebook(n, book) for n in chapters}  # all read before anything is written
    dest = Path(dest)
    for n, nb in notebooks.items():
        folder = dest / "source" / f"ch{n:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, folder / f"ch{n:02d}.ipynb")
    config = dest / "nbgrader_config.py"
    if not config.exists():
        config.write_text(CONFIG.format(course_id=COURSE_ID), encoding="utf-8")
    return dest
