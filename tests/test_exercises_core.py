"""The exercise-check machinery every chapter uses: messages that say what differs, the file checker, the CLI."""

import importlib
import sys
import types

import numpy as np
import pytest
import sympy as sp
import torch

from transformer_lab import exercises
from transformer_lab.cli import main
from transformer_lab.exercises import (
    CHAPTERS,
    CheckResult,
    check_expression,
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


@pytest.mark.parametrize(("message", "chinese"), [
    ("matches the reference on all 5 cases", "在全部 5 个用例上与参考答案一致"),
    ("matches the reference on all 9 cases (one logit, huge logits)", "在全部 9 个用例上与参考答案一致"),
    ("matches the reference on all 3 stacks", "在全部 3 个用例上与参考答案一致"),
    ("matches the reference on 1 case", "在这个用例上与参考答案一致"),
    ("right on all 7 layers", "通过了全部检查"),
])
def test_a_passing_verdict_reads_in_both_languages(message, chinese):
    shown = CheckResult("f", True, message)._repr_html_()
    assert f'lang="zh" style="display: none">{chinese}</span>' in shown and message.split(" (")[0] in shown


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
    assert main(["check", str(fake_chapter), str(broken)]) == 1  # graded in its own process: ✗ with the reason
    assert "cell 1 of the submission raised SyntaxError" in capsys.readouterr().out
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


def test_check_expression_accepts_an_equal_expression_in_another_form():
    """A derivation's answer is a SymPy expression, equal when simplify says so; symbols match by name, so a
    student's plain ``Symbol("t")`` is the book's ``Symbol("t", integer=True, positive=True)``."""
    beta, t, g = sp.Symbol("beta_1", positive=True), sp.Symbol("t", integer=True, positive=True), sp.Symbol("g")
    reference = lambda: (1 - beta**t) * g  # noqa: E731
    assert check_expression("m", lambda: g - g * beta**t, reference).passed
    assert check_expression("m", lambda: sp.expand((1 - sp.Symbol("beta_1") ** sp.Symbol("t")) * sp.Symbol("g")),
                            reference).passed
    x = sp.Symbol("x")
    assert check_expression("square", lambda x: x**2, lambda x: x * x, [{"x": x}]).passed
    assert check_expression("one", lambda: 1, lambda: sp.Integer(1)).passed
    assert check_expression("eye", lambda: sp.eye(2) * x, lambda: sp.Matrix([[x, 0], [0, x]])).passed


def test_check_expression_says_what_differs_and_gives_the_mistakes_hint():
    beta, t, g = sp.Symbol("beta_1", positive=True), sp.Symbol("t", integer=True, positive=True), sp.Symbol("g")
    reference = lambda: (1 - beta**t) * g  # noqa: E731
    off_by_one = lambda: (1 - beta ** (t + 1)) * g  # noqa: E731
    result = check_expression("m", off_by_one, reference, hints=[(off_by_one, "t, not t + 1")])
    assert not result.passed and "simplifies to g*(1 - beta_1**(t + 1)), expected g*(1 - beta_1**t)" in result.message
    assert "at beta_1 = " in result.message and result.message.endswith("Hint: t, not t + 1")
    assert "no arguments" not in result.message
    other = check_expression("m", lambda: g, reference, hints=[(off_by_one, "t, not t + 1")])
    assert not other.passed and "Hint" not in other.message
    x = sp.Symbol("x")
    matrix = check_expression("M", lambda: sp.Matrix([[x, 0], [0, 2 * x]]), lambda: sp.Matrix([[x, 0], [0, x]]))
    assert "in entry (1, 1) simplifies to 2*x, expected x" in matrix.message
    assert "should be a 2×2 matrix" in check_expression("M", lambda: x, lambda: sp.eye(2) * x).message
    assert "shape (1, 2), expected (2, 1)" in check_expression("M", lambda: sp.Matrix([[x, x]]),
                                                               lambda: sp.Matrix([x, x])).message


def test_check_expression_refuses_what_is_not_an_exact_expression_in_the_allowed_symbols():
    x, y = sp.symbols("x y")
    reference = lambda: x / 2  # noqa: E731
    assert "the string 'x/2', not a SymPy expression" in check_expression("h", lambda: "x/2", reference).message
    assert "floating-point" in check_expression("h", lambda: 0.5 * x, reference).message
    assert "floating-point" in check_expression("h", lambda: 0.5, reference).message
    assert "should be a SymPy expression, got Tensor" in check_expression("h", lambda: torch.ones(2),
                                                                          reference).message
    assert "uses y, which it may not contain (allowed: x)" in check_expression("h", lambda: y / 2, reference).message
    assert "allowed: x, y" in check_expression("h", lambda: sp.Symbol("z"), reference, symbols=[x, y]).message
    assert check_expression("h", lambda: x / 2 + 0 * y, reference, symbols=[x, y]).passed
    assert "the equation" in check_expression("h", lambda: sp.Eq(y, x / 2), reference, symbols=[x, y]).message

    def stub():
        raise NotImplementedError

    assert check_expression("h", stub, reference).message.startswith("not written yet")


def test_check_expression_decides_by_random_points_where_simplify_cannot(monkeypatch):
    """The fallback: with a simplify that leaves every difference as it is, an identity still passes (it vanishes
    at every random rational point, in exact arithmetic) and a non-identity is caught at a point."""
    monkeypatch.setattr(sp, "simplify", lambda e: e)
    x = sp.Symbol("x", positive=True)
    assert sp.simplify(sp.sin(x) ** 2 + sp.cos(x) ** 2 - 1) != 0  # the stand-in really decides nothing
    assert check_expression("pyth", lambda: sp.sin(x) ** 2 + sp.cos(x) ** 2, lambda: 1 + 0 * x, symbols=[x]).passed
    assert check_expression("log", lambda: sp.log(x) + sp.log(2), lambda: sp.log(2 * x)).passed
    near = check_expression("near", lambda: sp.sin(x) ** 2 + sp.cos(x) ** 2 + x / 10**20, lambda: sp.Integer(1),
                            symbols=[x])
    assert not near.passed and "at x = " in near.message


def test_check_expression_takes_a_list_for_a_column_vector():
    x, y = sp.symbols("x y")
    assert check_expression("v", lambda: [x, y], lambda: sp.Matrix([x, y])).passed
    assert "entry (1, 0) simplifies to x, expected y" in check_expression("v", lambda: [x, x],
                                                                          lambda: sp.Matrix([x, y])).message


def test_check_expression_hints_whatever_the_mistake_names_its_parameters():
    beta, t = sp.Symbol("beta_1", positive=True), sp.Symbol("t", integer=True, positive=True)
    result = check_expression("bias", lambda beta1, t: beta1**t, lambda beta1, t: 1 - beta1**t,
                              [{"beta1": beta, "t": t}], hints=[(lambda b, n: b**n, "1 minus that")])
    assert result.message.endswith("Hint: 1 minus that"), result.message


def test_forbidden_operators_raise_inside_the_block_only():
    """An exercise's forbidden operator raises by any route inside ``forbidding``, and works again after it."""
    from transformer_lab.exercises.forbid import FORBIDDEN, SOFTMAX, ForbiddenCall, forbidding

    z = torch.randn(3, 4)
    with forbidding(SOFTMAX):
        assert dict(FORBIDDEN.get()) == SOFTMAX
        for route in (lambda: torch.softmax(z, -1), lambda: z.softmax(-1), lambda: torch.nn.Softmax(-1)(z)):
            with pytest.raises(ForbiddenCall, match=r"torch\.softmax"):
                route()
        torch.exp(z - z.amax(-1, keepdim=True))  # what an answer by hand uses stays allowed
    assert FORBIDDEN.get() == () and torch.softmax(z, -1).shape == z.shape
