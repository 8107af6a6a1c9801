"""Sphinx extension: the book's two editions, chosen by the environment variable ``TL_EDITION``.

    make book                    # the full edition (TL_EDITION unset or "instructor"): _build/html
    make book EDITION=student    # the student edition: _build/student/html (tools/build.py --edition student)

The student edition has no solutions: every ``{solution}`` block, gated ``{solution-start}`` … ``{solution-end}``
pair and code cell tagged ``solution`` is removed from the pages, once sphinx-exercise has gathered a gated
solution's content into its node (its own ``hide_solutions`` would leave the gate's end behind). Only the student
notebooks are written and linked (tools/course_notebooks.py reads ``tl_edition``), text marked
``{only} instructor`` is left out, and the pages' sources are not copied into the site. The checkers' hidden
cases are in neither edition: they are drawn from the instructor's key at grading time (``check --hidden KEY``).
"""

from __future__ import annotations

import os

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.errors import ConfigError

EDITIONS = ("instructor", "student")


def _choose(app: Sphinx, config) -> None:
    if config.tl_edition not in EDITIONS:
        raise ConfigError(f"TL_EDITION must be one of {', '.join(EDITIONS)}, got {config.tl_edition!r}")
    app.tags.add(config.tl_edition)
    if config.tl_edition == "student":
        config.html_copy_source = False  # a page's source holds its solutions (and the guards that quote them)


def _strip_solutions(app: Sphinx, doctree: nodes.document) -> None:
    """In the student edition: remove the solutions' nodes (a gated solution's content and its code cells)."""
    if app.config.tl_edition != "student":
        return
    from sphinx_exercise.nodes import solution_node

    for node in list(doctree.findall(solution_node)):
        node.parent.remove(node)
    for node in list(doctree.findall(nodes.Element)):
        tags = node.get("cell_metadata", {}).get("tags", []) if hasattr(node, "get") else []
        if "solution" in tags and node.parent is not None:
            node.parent.remove(node)


def setup(app: Sphinx) -> dict:
    app.add_config_value("tl_edition", os.environ.get("TL_EDITION", "instructor"), "env")
    app.connect("config-inited", _choose, priority=400)
    app.connect("doctree-read", _strip_solutions)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
