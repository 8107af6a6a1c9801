"""Every exercise's time and difficulty estimate (transformer_lab/exercises/estimates.py): one for each registered
exercise, matching its chapter and label; the course guide's weekly plan and load table computed from them; and
the estimate shown in the exercise's check note, in both languages."""

import re
import statistics

import pytest
from answer_key import all_exercises
from conftest import ROOT

from transformer_lab.exercises import CheckResult, registry
from transformer_lab.exercises.estimates import (
    ESTIMATES,
    MILESTONES,
    WEEKS,
    due,
    due_text,
    load_table,
    note,
    week_minutes,
)

GUIDE = (ROOT / "book" / "course-guide.md").read_text(encoding="utf8")


def test_every_registered_exercise_has_one_estimate():
    registered = {name: chapter for chapter in range(1, 9) for name in registry(chapter)}
    assert set(ESTIMATES) == set(registered)
    for name, est in ESTIMATES.items():
        assert est.chapter == registered[name], name
        assert 5 <= est.minutes <= 120 and est.difficulty in (1, 2, 3) and est.due_week in WEEKS, est


def test_estimates_name_the_exercise_the_chapter_writes():
    """The label and function of each estimate are those of one exercise in the chapter, in the book's order."""
    book = [(ex.function, ex.label) for ex in all_exercises()]
    assert book == [(e.function, e.label) for e in ESTIMATES.values()]


def test_an_exercise_is_due_no_earlier_than_its_chapter_starts():
    first_taught = {1: 1, 2: 3, 3: 4, 4: 5, 5: 7, 6: 8, 7: 9, 8: 10}  # the plan's first session on each chapter
    for est in ESTIMATES.values():
        assert first_taught[est.chapter] <= est.due_week <= first_taught[est.chapter] + 3, est


def _plan() -> dict[int, tuple[str, str]]:
    table = GUIDE[GUIDE.index("| week | session A"):]
    table = table[:table.index("\n\n")]
    rows = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        rows[int(cells[0])] = (cells[-2], cells[-1])
    return rows


def test_the_weekly_plan_shows_each_weeks_estimated_sum():
    plan = _plan()
    assert sorted(plan) == list(WEEKS)
    for week in WEEKS:
        assert plan[week] == (due_text(week), str(week_minutes(week) or "—")), week
    assert sum(week_minutes(w) for w in WEEKS) == sum(e.minutes for e in ESTIMATES.values()) + sum(
        m for _, m in MILESTONES.values())


def test_the_load_table_is_the_one_the_estimates_print():
    assert load_table() in GUIDE
    for est in ESTIMATES.values():
        assert f"{{ref}}`{est.label}` ({est.minutes})" in GUIDE


def test_the_load_is_balanced():
    """No week grossly above the others: the capstone's proposal week has at most 8 exercises, and no week
    carries more than 1.5 times the median load of the weeks that have work due."""
    loads = [week_minutes(w) for w in WEEKS if week_minutes(w)]
    assert max(loads) <= 1.5 * statistics.median(loads) and max(loads) <= 300, loads
    assert len(due(9)) <= 8 and 9 in MILESTONES


@pytest.mark.parametrize("name", ["attention_by_hand", "kv_pair_count", "next_char_probs"])
def test_the_check_note_shows_the_estimate_in_both_languages(name):
    est = ESTIMATES[name]
    for result in (CheckResult(name, False, "not written yet: replace `raise NotImplementedError` with your code"),
                   CheckResult(name, True, "matches the reference on all 3 cases"),
                   CheckResult(name, False, "output differs")):
        shown = result._repr_html_()
        assert f"about {est.minutes} min" in shown and f"约 {est.minutes} 分钟" in shown
        assert f"{est.difficulty}/3" in shown
        assert re.fullmatch(r'<div class="tl-check [^"]*">.*</div>', shown, re.S) and shown.count("<div") == 1
    assert note(name)[0].startswith(f"about {est.minutes} min") and note("no_such_exercise") is None
    assert "tl-check-estimate" not in CheckResult("no_such_exercise", True, "ok")._repr_html_()
