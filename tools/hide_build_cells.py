"""Collapse, in JupyterLab, the code the website hides: every code cell of a chapter tagged ``remove-cell``,
``remove-input`` or ``hide-input`` gets the cell metadata ``jupyter: {source_hidden: true}``.

    python tools/hide_build_cells.py chapters/03-optimization.md [...]

The chapters open in JupyterLab through Jupytext (tools/lab.py), which writes such a cell's options as a YAML
block; this rewrites the named chapters in that form with the repository's jupytext.toml, byte for byte as a
JupyterLab save would (tests/test_jupytext_roundtrip.py). tests/test_book_pages.py requires the metadata on every
such cell.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jupytext
from jupytext.config import load_jupytext_config

HIDDEN_ON_SITE = {"remove-cell", "remove-input", "hide-input"}


def hide(page: Path) -> int:
    """Mark the page's build cells collapsed; return how many changed."""
    nb = jupytext.read(page)
    changed = 0
    for cell in nb.cells:
        if cell.cell_type == "code" and HIDDEN_ON_SITE & set(cell.metadata.get("tags", [])):
            shown = cell.metadata.setdefault("jupyter", {})
            changed += not shown.get("source_hidden")
            shown["source_hidden"] = True
    jupytext.write(nb, page, fmt="md:myst", config=load_jupytext_config(str(page.resolve().parent)))
    return changed


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(f"{arg}: {hide(Path(arg))} cell(s) collapsed")
