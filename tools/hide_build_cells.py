"""Collapse, in JupyterLab, the code the website hides: every code cell of a chapter tagged ``remove-cell``,
``remove-input`` or ``hide-input`` gets the cell metadata ``jupyter: {source_hidden: true}``.

    python tools/hide_build_cells.py chapters/03-optimization.md [...]

The chapters open in JupyterLab through Jupytext (tools/lab.py), which writes such a cell's options as a YAML
block; this rewrites the named chapters in that form, byte for byte as a JupyterLab save would
(tests/test_jupytext_roundtrip.py). tests/test_book_pages.py requires the metadata on every such cell.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jupytext

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
    text = jupytext.writes(nb, fmt="md:myst")
    # as the repository's jupytext.toml writes it: no version stamp in the header
    page.write_text("".join(line for line in text.splitlines(keepends=True) if "jupytext_version:" not in line))
    return changed


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(f"{arg}: {hide(Path(arg))} cell(s) collapsed")
