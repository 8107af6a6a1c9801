"""A blank answers file for one chapter: ``python -m transformer_lab check N --template``.

The stubs are the chapter's own exercise cells (the code cells tagged ``exercise`` in ``chapters/0N-*.md``,
the same ``def name(...): raise NotImplementedError`` a student sees in the notebook), each with its checker's
one-line description, so the file and the book cannot drift apart.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from transformer_lab.exercises import registry

CHAPTERS_DIR = Path(__file__).resolve().parents[2] / "chapters"
_EXERCISE_CELL = re.compile(r"^```\{code-cell\}[^\n]*\n:tags: \[[^\]\n]*\bexercise\b[^\]\n]*\]\n\n?(.*?)^```$",
                            re.S | re.M)


def chapter_source(chapter: int) -> Path:
    """The MyST source of chapter ``chapter`` (it lives in the repository, beside the package)."""
    found = sorted(CHAPTERS_DIR.glob(f"{chapter:02d}-*.md"))
    if not found:
        raise FileNotFoundError(f"chapter {chapter}'s source chapters/{chapter:02d}-*.md is not in "
                                f"{CHAPTERS_DIR.parent}; --template reads the exercise cells from the repository")
    return found[0]


def _summary(checker) -> str:
    """The first paragraph of a checker's docstring, as plain text (no reStructuredText quotes or roles)."""
    text = (checker.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(re.sub(r":\w+:`~?([^`]+)`|``([^`]+)``", lambda m: m[1] or m[2], text).split())


def answers_template(chapter: int) -> str:
    """The text of a blank answers file for ``chapter``: one stub per exercise, in the book's order."""
    checkers = registry(chapter)
    source = chapter_source(chapter)
    cells = [m[1].rstrip() for m in _EXERCISE_CELL.finditer(source.read_text(encoding="utf-8"))]
    stubs = {d[1]: cell for cell in cells if (d := re.search(r"^def (\w+)\(", cell, re.M))}
    missing = sorted(set(checkers) - set(stubs))
    if missing:
        raise ValueError(f"{source.name} has no exercise cell defining {', '.join(missing)}")
    parts = [f'"""Answers to the exercises of chapter {chapter} ({source.stem}).\n\n'
             f"Replace each `raise NotImplementedError` with your code, then grade the file with\n"
             f'    python -m transformer_lab check {chapter} THIS_FILE.py\n"""\n\n'
             "import math\n\nimport numpy as np\nimport torch\n"]
    for name, checker in checkers.items():
        comment = textwrap.fill(_summary(checker), 116, initial_indent="# ", subsequent_indent="# ")
        parts.append(f"\n\n{comment}\n{stubs[name]}\n")
    return "".join(parts)
