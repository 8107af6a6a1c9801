"""Execute pages of the book in a fresh kernel, with this shell's environment, and say which cell failed.

    python tools/run_page.py chapters/03-optimization.md [...]
    ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 TL_SEED_OFFSET=1 python tools/run_page.py PAGE

A quick check while writing a page, without Sphinx: the kernel inherits the environment, so the second form runs
the page as another machine would (PyTorch's portable kernels, every seed shifted by one), as the tests do.
Prints each page's wall time; exits non-zero if any page failed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jupytext
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def run(page: Path) -> bool:
    nb = jupytext.read(page)
    client = NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(page.resolve().parent)}})
    t0 = time.perf_counter()
    try:
        client.execute()
    except CellExecutionError as exc:
        print(f"FAILED {page} after {time.perf_counter() - t0:.1f} s:\n{exc}")
        return False
    print(f"ok {page} in {time.perf_counter() - t0:.1f} s")
    return True


def main(pages: list[str]) -> int:
    if not pages:
        print(__doc__)
        return 2
    return 0 if all([run(Path(p)) for p in pages]) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
