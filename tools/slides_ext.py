"""Sphinx extension: the chapters' reveal.js decks (tools/slides.py) built into the site and linked from each page.

After an HTML build, ``<site>/slides/NN-name.html`` is written for every chapter from its source and the
outputs its code had when the book was built: the executed notebooks MyST-NB left beside the site
(``_build/jupyter_execute``) and, for pages this build did not re-run, its execution cache; so a deck's figures are
the page's own, at their default frame. Each chapter page gets a line linking its deck; the Chinese edition's pages
link the English decks.
"""

from __future__ import annotations

import html
from pathlib import Path

from lab_cache import _is_notebook
from slides import write_decks
from sphinx.application import Sphinx


def _chinese(app: Sphinx) -> bool:
    return (app.config.language or "").startswith("zh")


def write(app: Sphinx, exception) -> None:
    if exception or app.builder.format != "html" or _chinese(app):  # the Chinese edition links the English decks
        return
    outdir = Path(app.outdir)
    cache = Path(app.srcdir) / app.env.mystnb_config.execution_cache_path  # pages this build did not re-run
    write_decks(outdir / "slides", root=Path(app.srcdir), executed=outdir.parent / "jupyter_execute", cache=cache)


def add_link(app: Sphinx, pagename: str, templatename, context, doctree) -> None:
    page = Path(app.srcdir) / f"{pagename}.md"
    if not pagename.startswith("chapters/") or not page.is_file() or not _is_notebook(page):
        return
    href = html.escape(("../" if _chinese(app) else "") + context["pathto"](f"slides/{page.stem}.html", 1))
    if _chinese(app):
        line = (f'\n<p class="tl-slides"><a href="{href}">本章幻灯片</a>（英文；reveal.js：要点、逐步展开的推导、'
                f"图和练习，附讲稿；方向键翻页，S 键打开讲者视图，F 键全屏）。</p>\n")
    else:
        line = (f'\n<p class="tl-slides"><a href="{href}">Slides for this chapter</a> (reveal.js: the key ideas, '
                f"derivations stepped, figures and exercises, with speaker notes; arrow keys to step, S for the "
                f"speaker view, F for full screen).</p>\n")
    body = context["body"]
    at = body.find("</h1>")
    context["body"] = body[:at + 5] + line + body[at + 5:] if at >= 0 else line + body


def setup(app: Sphinx) -> dict:
    app.connect("html-page-context", add_link, priority=400)  # before course_notebooks': its line lands above
    app.connect("build-finished", write)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
