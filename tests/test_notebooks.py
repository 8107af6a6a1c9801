"""Every page of the book executes top to bottom in a fresh kernel, within the time budget."""

import time

import jupytext
import pytest
from conftest import ROOT
from nbclient import NotebookClient

BUDGET_S = 60  # "well under a minute on 2 CPU cores"; chapters aim at < 45 s


def is_notebook(path) -> bool:
    return "kernelspec:" in path.read_text(encoding="utf8")[:2000]


PAGES = [p for d in ("book", "chapters") for p in sorted((ROOT / d).glob("*.md")) if is_notebook(p)]


@pytest.mark.notebooks
@pytest.mark.timeout(300)
@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_page_executes_in_a_fresh_kernel(page):
    nb = jupytext.read(page)
    client = NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(page.parent)}})
    t0 = time.perf_counter()
    client.execute()  # raises CellExecutionError naming the cell on any error
    took = time.perf_counter() - t0
    print(f"{page.name}: {took:.1f} s")
    assert took < BUDGET_S, f"{page.name} took {took:.0f} s to execute (budget {BUDGET_S} s)"
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors


def test_pages_found():
    assert ROOT / "book" / "intro.md" in PAGES
