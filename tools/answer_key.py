"""The instructor's answer key: every exercise's statement, stub and solution (written and code), chapter by chapter,
read from the chapters themselves, so that no solution has a second copy to keep in step.

    .venv/bin/python tools/answer_key.py                 # -> _build/answer-key/answer-key.md
    .venv/bin/python tools/answer_key.py --out DIR        # -> DIR/answer-key.md

A chapter's exercise is a ``{exercise}`` directive with a ``:label:``, a code cell tagged ``exercise`` (the stub),
a check cell, and the solution between ``{solution-start} LABEL`` and ``{solution-end}``. The key keeps the
solution's text and code cells, without the hidden cells (``remove-cell``: the page's guards), and writes MyST
roles as plain text. Each exercise also shows its time and difficulty estimate
(:mod:`transformer_lab.exercises.estimates`). The key is written under ``_build/answer-key/``, outside both
editions' sites and notebooks; never copy it into the student edition.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "_build" / "answer-key"

_EXERCISE = re.compile(r"^(?P<fence>`{3,}|:{3,})\{exercise\}[^\n]*\n(?P<body>.*?)^(?P=fence)[ \t]*$", re.S | re.M)
_LABEL = re.compile(r"^:label:\s*(\S+)\s*$", re.M)
_OPTIONS = re.compile(r"\A(?:[ \t]*:[\w-]+:[^\n]*\n)*\s*")
_CODE_CELL = re.compile(r"^(?P<fence>`{3,})\{code-cell\}[^\n]*\n(?P<body>.*?)^(?P=fence)[ \t]*$", re.S | re.M)
_STUB_DEF = re.compile(r"^def (\w+)\(", re.M)
_CELL_HEAD = re.compile(r"\A(?:---\n.*?\n---\n|(?:[ \t]*:[\w-]+:[^\n]*\n)*)", re.S)
_TAGS = re.compile(r"tags:\s*\[([^\]]*)\]")


@dataclass
class Exercise:
    """One exercise as its chapter writes it."""

    chapter: int
    label: str
    function: str | None  # the function the stub defines (None: a written exercise)
    statement: str
    stub: str
    solution: str  # the MyST between the solution's gates (text and code cells)


def _cell(block: re.Match) -> tuple[set[str], str]:
    """A code cell's tags and its source, without the cell's option lines."""
    body = block["body"]
    head = _CELL_HEAD.match(body)[0]
    tags = {t.strip().strip("'\"") for m in _TAGS.finditer(head) for t in m[1].split(",")}
    return tags, body[len(head):].strip("\n")


def _gate(kind: str, label: str | None = None) -> re.Pattern:
    name = re.escape(label) if label else r"[^\n]*"
    return re.compile(r"^(`{3,})\{solution-" + kind + r"\}[ \t]*" + name + r"[ \t]*\n.*?^\1[ \t]*$\n?", re.S | re.M)


def chapter_exercises(page: Path) -> list[Exercise]:
    """The exercises of one chapter page, in order."""
    text = page.read_text(encoding="utf-8")
    chapter = int(page.name[:2])
    found = []
    for ex in _EXERCISE.finditer(text):
        label = _LABEL.search(ex["body"])
        if label is None:
            raise ValueError(f"{page.name}: an exercise without a :label:")
        label = label[1]
        start = _gate("start", label).search(text, ex.end())
        if start is None:
            raise ValueError(f"{page.name}: exercise {label} has no {{solution-start}} {label}")
        end = _gate("end").search(text, start.end())
        if end is None:
            raise ValueError(f"{page.name}: the solution of {label} has no {{solution-end}}")
        between = text[ex.end():start.start()]
        stubs = [src for tags, src in map(_cell, _CODE_CELL.finditer(between)) if "exercise" in tags]
        stub = stubs[0] if stubs else ""
        name = _STUB_DEF.search(stub)
        found.append(Exercise(chapter, label, name[1] if name else None, _OPTIONS.sub("", ex["body"], count=1).strip(),
                              stub, text[start.end():end.start()].strip("\n")))
    return found


def all_exercises(root: Path = ROOT) -> list[Exercise]:
    """Every chapter's exercises, chapter by chapter."""
    return [ex for page in sorted((root / "chapters").glob("[0-9][0-9]-*.md")) for ex in chapter_exercises(page)]


def _solution_markdown(solution: str) -> str:
    """The solution's MyST as plain Markdown: each code cell a ``python`` block, hidden cells left out."""
    parts, pos = [], 0
    for block in _CODE_CELL.finditer(solution):
        parts.append(solution[pos:block.start()].strip())
        tags, source = _cell(block)
        if not {"remove-cell", "remove-input"} & tags:
            parts.append(f"```python\n{source}\n```")
        pos = block.end()
    parts.append(solution[pos:].strip())
    return "\n\n".join(p for p in parts if p)


def _plain(text: str, root: Path) -> str:
    from transformer_lab.course import _ROLE, _plain_role

    return _ROLE.sub(lambda m: _plain_role(m["role"], m["text"], m["target"] or m["text"], root), text)


def _title(page: Path) -> str:
    found = re.search(r"^# (.+)$", page.read_text(encoding="utf-8"), re.M)
    return found[1] if found else page.stem


def answer_key(root: Path = ROOT) -> str:
    """The answer key as one Markdown document."""
    from transformer_lab.exercises.estimates import ESTIMATES, difficulty_words

    lines = ["# Transformer Math Lab: answer key (instructor only)", "",
             "Every exercise's statement and solution, generated from the chapters by `tools/answer_key.py`. "
             "Do not give this file to students.", ""]
    for page in sorted((root / "chapters").glob("[0-9][0-9]-*.md")):
        exercises = chapter_exercises(page)
        if not exercises:
            continue
        lines += [f"## Chapter {int(page.name[:2])}: {_title(page)}", ""]
        for ex in exercises:
            est = ESTIMATES.get(ex.function or ex.label)
            lines += [f"### {ex.label}" + (f": `{ex.function}`" if ex.function else ""), ""]
            if est is not None:
                lines += [f"*About {est.minutes} minutes; difficulty {est.difficulty} of 3 "
                          f"({difficulty_words(est.difficulty)}); due in week {est.due_week}.*", ""]
            lines += ["**Exercise.**", "", _plain(ex.statement, root), ""]
            if ex.stub:
                lines += ["**Stub.**", "", f"```python\n{ex.stub}\n```", ""]
            lines += ["**Solution.**", "", _plain(_solution_markdown(ex.solution), root), ""]
    return "\n".join(lines).rstrip() + "\n"


def write(out: Path = DEFAULT_OUT, root: Path = ROOT) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "answer-key.md"
    path.write_text(answer_key(root), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for answer-key.md")
    args = parser.parse_args(argv)
    path = write(args.out)
    print(f"{path} ({path.stat().st_size // 1024} kB)")


if __name__ == "__main__":
    main()
