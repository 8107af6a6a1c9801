"""How promptly each interactive figure of the book redraws, against the 100 ms a moved control should take.

Executes each chapter in a fresh kernel, then times one redraw (draw + render, best of ``--repeats``, CPU time of
the redrawing thread) of every interactive figure the chapter made, and prints it as a ratio of the target: below
1.0x is within it. A measurement of this machine, not a check: the tests only bound a redraw at ten times the target.

    python benchmarks/redraw.py [--repeats 10] [chapters/03-optimization.md ...]
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

from transformer_lab.viz import REDRAW_TARGET_S

ROOT = Path(__file__).resolve().parent.parent


def redraws(page: Path, repeats: int) -> dict[str, float]:
    """{draw function: CPU seconds of one redraw} for every interactive figure of ``page``, executed afresh."""
    nb = jupytext.read(page)
    nb.cells.append(nbformat.v4.new_code_cell(
        f"from transformer_lab.viz import redraw_times as _rt\nprint(_rt(globals(), repeats={repeats}))"))
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(page.resolve().parent)}}).execute()
    return ast.literal_eval(nb.cells[-1].outputs[0]["text"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pages", nargs="*", type=Path, help="pages to measure (default: every chapter)")
    parser.add_argument("--repeats", type=int, default=10, help="redraws per figure, the best one counts")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    pages = args.pages or sorted((ROOT / "chapters").glob("*.md"))
    print(f"one redraw per interactive figure, CPU ms of the redrawing thread (best of {args.repeats}), "
          f"as a ratio of the {REDRAW_TARGET_S * 1000:.0f} ms target")
    worst = 0.0
    for page in pages:
        for name, seconds in redraws(page, args.repeats).items():
            worst = max(worst, seconds / REDRAW_TARGET_S)
            print(f"  {page.stem:<24} {name:<32} {seconds * 1000:7.1f} ms = {seconds / REDRAW_TARGET_S:4.2f}x")
    print(f"slowest: {worst:.2f}x the target")


if __name__ == "__main__":
    main()
