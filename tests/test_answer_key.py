"""The instructor's answer key (tools/answer_key.py): built from the chapters, it holds every registered exercise's
statement and solution, written and code, and it is written outside both editions' sites."""

import re

import answer_key
from conftest import ROOT

from transformer_lab.exercises import registry

_CODE = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```$", re.S | re.M)


def test_the_key_holds_every_exercise_and_its_whole_solution(tmp_path):
    path = answer_key.write(tmp_path)
    key = path.read_text(encoding="utf8")
    exercises = answer_key.all_exercises()
    assert sorted(ex.function for ex in exercises) == sorted(n for ch in range(1, 9) for n in registry(ch))
    for ex in exercises:
        head = f"### {ex.label}: `{ex.function}`"
        assert key.count(head) == 1, ex.label
        section = key[key.index(head):]
        section = section[:section.find("\n### ", 1)] if "\n### " in section[1:] else section
        assert ex.stub in section, ex.label
        code = [answer_key._cell(m)[1] for m in answer_key._CODE_CELL.finditer(ex.solution)
                if not {"remove-cell", "remove-input"} & answer_key._cell(m)[0]]
        assert code and all(c in section for c in code), f"{ex.label}: a solution cell is missing"
        prose = answer_key._CODE_CELL.sub("", ex.solution)
        lines = [line for line in prose.splitlines() if len(line) > 30 and "{" not in line and "`" not in line]
        assert all(line in section for line in lines), f"{ex.label}: a line of the written solution is missing"
    assert "{ref}" not in key and "{code-cell}" not in key and "remove-cell" not in key


def test_the_key_is_built_from_the_chapters_not_a_copy():
    """No solution is stored twice: the tool reads chapters/*.md and holds no exercise text of its own."""
    source = (ROOT / "tools" / "answer_key.py").read_text(encoding="utf8")
    assert "def attention_by_hand" not in source and "chapters" in source


def test_the_key_lands_outside_both_editions():
    out = answer_key.DEFAULT_OUT.resolve()
    assert out == (ROOT / "_build" / "answer-key").resolve()
    for site in (ROOT / "_build" / "html", ROOT / "_build" / "student", ROOT / "_build" / "zh"):
        assert not out.is_relative_to(site.resolve())
    guide = (ROOT / "book" / "course-guide.md").read_text(encoding="utf8")
    blocks = [m[1] for m in re.finditer(r"^```\{only\} instructor\n(.*?)^```$", guide, re.S | re.M)]
    visible = guide
    for block in blocks:
        visible = visible.replace(block, "")
    assert any("make answer-key" in b for b in blocks) and "make answer-key" not in visible
    assert "answer-key:" in (ROOT / "Makefile").read_text(encoding="utf8")
