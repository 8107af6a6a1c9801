"""The exercise-check machinery every chapter uses: messages that say what differs, the file checker, the CLI."""

import importlib
import sys
import types

import numpy as np
import pytest
import torch

from transformer_lab import exercises
from transformer_lab.cli import main
from transformer_lab.exercises import (
    CHAPTERS,
    CheckResult,
    check_file,
    check_function,
    describe_difference,
    distinct_digits,
    registry,
)


def reference_double(x):
    return 2 * x


CASES = [{"x": torch.arange(6.0).reshape(2, 3)}, {"x": torch.randn(4)}]


def test_equal_values_pass():
    assert describe_difference(torch.ones(3), torch.ones(3)) is None
    assert describe_difference((1, np.zeros(2)), (1, np.zeros(2))) is None
    r = check_function("double", reference_double, reference_double, CASES)
    assert r.passed and "all 2 cases" in r.message and str(r).startswith("✓")


def test_messages_name_the_difference():
    assert describe_difference(torch.ones(2, 3), torch.ones(3, 2)) == "output has shape (2, 3), expected (3, 2)"
    msg = describe_difference(torch.tensor([1.0, 2.0, 3.5]), torch.tensor([1.0, 2.0, 3.0]))
    assert "1 of 3 entries" in msg and "worst at (2,)" in msg and "got 3.5" in msg and "expected 3" in msg
    assert "NaN" in describe_difference(torch.tensor([float("nan")]), torch.tensor([0.0]))
    assert "2 items" in describe_difference((1,), (1, 2))
    assert "first at (1,)" in describe_difference(torch.tensor([1, 5]), torch.tensor([1, 2]))
    assert describe_difference(torch.tensor([float("-inf")]), torch.tensor([float("-inf")])) is None


def test_wrong_answers_are_rejected_with_a_reason():
    r = check_function("double", lambda x: 3 * x, reference_double, CASES)
    assert not r.passed and "differs" in r.message and "case 1" in r.message
    r = check_function("double", lambda x: x.T, reference_double, CASES)
    assert not r.passed and "shape (3, 2), expected (2, 3)" in r.message
    r = check_function("double", lambda x: 1 / 0, reference_double, CASES)
    assert not r.passed and "ZeroDivisionError" in r.message


def test_stub_and_signature_and_non_function():
    def stub(x):
        raise NotImplementedError

    assert "not written yet" in check_function("double", stub, reference_double, CASES).message
    wrong_arity = check_function("double", lambda a, b: a, reference_double, CASES)
    assert "should take 1 argument(s), in this order: (x)" in wrong_arity.message
    assert "expected a function" in check_function("double", 42, reference_double, CASES).message


def test_inputs_are_protected_from_in_place_changes():
    def sneaky(x):
        x.mul_(2)
        return x

    case = {"x": torch.ones(3)}
    check_function("double", sneaky, reference_double, [case])
    assert torch.equal(case["x"], torch.ones(3))


def test_html_view():
    assert "tl-check-fail" in CheckResult("f", False, "a < b")._repr_html_()
    assert "a &lt; b" in CheckResult("f", False, "a < b")._repr_html_()


@pytest.fixture
def fake_chapter(monkeypatch):
    module = types.ModuleType("transformer_lab.exercises.chfake")
    module.EXERCISES = {"double": lambda fn: check_function("double", fn, reference_double, CASES)}
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(exercises.CHAPTERS, 99, "chfake")
    return 99


def test_check_file_and_cli(fake_chapter, tmp_path, capsys):
    good, bad, missing, broken = (tmp_path / n for n in ("good.py", "bad.py", "missing.py", "broken.py"))
    good.write_text("def double(x):\n    return x + x\n")
    bad.write_text("def double(x):\n    return x\n")
    missing.write_text("def triple(x):\n    return 3 * x\n")
    broken.write_text("def double(x) return x\n")
    assert [r.passed for r in check_file(fake_chapter, good)] == [True]
    assert main(["check", str(fake_chapter), str(good)]) == 0
    assert main(["check", str(fake_chapter), str(bad)]) == 1
    assert main(["check", str(fake_chapter), str(missing)]) == 1
    assert "defines no function named 'double'" in capsys.readouterr().out
    assert main(["check", str(fake_chapter), str(broken)]) == 2
    assert "could not be imported: SyntaxError" in capsys.readouterr().err
    assert main(["check", str(fake_chapter), str(tmp_path / "nope.py")]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["check", "42", str(good)]) == 2
    assert "no chapter 42" in capsys.readouterr().err


MIN_WRONG, MIN_RIGHT = 4, 2


@pytest.mark.parametrize("chapter", sorted(CHAPTERS))
def test_every_exercise_keeps_a_catalogue_of_typical_answers(chapter):
    """Issue 11: each checker is tested on at least four typical wrong answers it must reject and two correct
    alternatives it must accept, kept as ``CATALOGUE`` in ``tests/test_exercises_chN.py``."""
    module = importlib.import_module(f"test_exercises_ch{chapter}")
    catalogue = module.CATALOGUE
    assert set(catalogue) == set(registry(chapter)), "every exercise, and only those, has a catalogue"
    for name, entry in catalogue.items():
        assert len(entry["wrong"]) >= MIN_WRONG, f"chapter {chapter}, {name}: {len(entry['wrong'])} wrong answers"
        assert len(entry["right"]) >= MIN_RIGHT, f"chapter {chapter}, {name}: {len(entry['right'])} right answers"


def test_student_functions_are_called_by_position_whatever_their_parameter_names():
    def reference(logits, top_k):
        return logits * top_k

    cases = [{"logits": torch.ones(2), "top_k": 3}]
    assert check_function("x", lambda a, b: a * b, reference, cases).passed
    result = check_function("x", lambda a: a, reference, cases)
    assert not result.passed and "2 argument(s), in this order: (logits, top_k)" in result.message


def test_messages_print_enough_digits_and_name_a_wrong_type():
    assert distinct_digits(0.001, 0.0010000003) == ("0.001", "0.0010000003")
    msg = describe_difference(torch.tensor([0.001]), torch.tensor([0.0010001], dtype=torch.float64), atol=0, rtol=0)
    assert "got 0.001, expected 0.0010001" in msg
    assert describe_difference(3.0, 3) == "output must be an int, got float 3.0"
    assert describe_difference(True, 3) == "output must be an int, got bool True"
    assert "must hold integers" in describe_difference(torch.tensor([1.0]), torch.tensor([1]))
    assert describe_difference(3, 3) is None and describe_difference(np.int64(3), 3) is None


def test_a_comparison_that_raises_is_a_verdict_not_a_crash():
    """Issue 11's reviews found checkers whose hint code raised on unforeseen answers (a ragged list, an int
    where a tensor was expected): whatever a comparison raises, the student gets a ✗ with the reason."""
    def fragile(got, expected):
        return None if torch.as_tensor(got).shape == expected.shape else "shape"

    result = check_function("x", lambda x: [[1.0, 2.0], [3.0]], reference_double, CASES, compare=fragile)
    assert not result.passed and "could not be compared" in result.message and "list" in result.message
