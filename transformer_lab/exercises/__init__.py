"""Automatic checks for the book's exercises: one API for every chapter.

Each chapter module ``exercises/chN.py`` holds ``check_<name>(fn) -> CheckResult`` functions and a registry
``EXERCISES = {"function_name": check_function, ...}`` naming the function a student writes for each exercise.
A check never raises on a wrong answer: it returns a :class:`CheckResult` whose message says what differs
(which shape, which entries, by how much), so a notebook with unfilled stubs still runs to the end.

Grade a whole file of answers with ``python -m transformer_lab check N answers.py``.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import html
import importlib
import importlib.util
import inspect
import math
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from transformer_lab.exercises.forbid import forbidding
from transformer_lab.page import bilingual

CHAPTERS = {1: "ch1", 2: "ch2", 3: "ch3", 4: "ch4", 5: "ch5", 6: "ch6", 7: "ch7", 8: "ch8"}


@dataclass(frozen=True)
class CheckResult:
    """The verdict on one exercise: ``passed`` and a message a student can act on."""

    name: str
    passed: bool
    message: str

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        return f"{'✓' if self.passed else '✗'} {self.name}: {self.message}"

    __repr__ = __str__

    def _repr_html_(self) -> str:
        """The verdict as a notebook (and the website) shows it: `code` in the message as ``<code>``; an exercise
        still at its stub gets a neutral note saying where to check it, not a red failure."""
        if not self.passed and self.message.startswith(_NOT_WRITTEN):
            return (f'<div class="tl-check tl-check-todo"><strong>✎ {html.escape(self.name)}</strong>: ' + bilingual(
                "write your answer in place of <code>raise NotImplementedError</code>, then run this in Jupyter to "
                "check your answer.",
                "在 <code>raise NotImplementedError</code> 处写下你的答案，然后在 Jupyter 中运行这一格来检查它。")
                + self._estimate_html() + "</div>")
        cls = "tl-check-pass" if self.passed else "tl-check-fail"
        mark = "✓" if self.passed else "✗"
        message = _CODE.sub(lambda m: f"<code>{m[1]}</code>", html.escape(self.message))
        if self.passed:
            n = _MATCHES.match(self.message)
            chinese = ("通过了全部检查" if n is None else "在这个用例上与参考答案一致" if n[1] == "1"
                       else f"在全部 {n[1]} 个用例上与参考答案一致")
            message = bilingual(message, chinese)
        return (f'<div class="tl-check {cls}"><strong>{mark} {html.escape(self.name)}</strong>: {message}'
                f'{self._estimate_html()}</div>')

    def _estimate_html(self) -> str:
        """The exercise's time and difficulty estimate (:mod:`transformer_lab.exercises.estimates`), on a line of
        its own; empty for a name with no estimate."""
        from transformer_lab.exercises.estimates import note

        shown = note(self.name)
        return "" if shown is None else f'<br><small class="tl-check-estimate">{bilingual(*shown)}</small>'


_MATCHES = re.compile(r"matches the reference on (?:all )?(\d+) (?:cases?|stacks?)")
"""A passing verdict's usual message; on a Chinese page its details (which cases) are left out, and any other
passing message reads "passed every check"."""


_NOT_WRITTEN = "not written yet"
_CODE = re.compile(r"`([^`]+)`")  # `code` in a message, shown as <code> in HTML


_HIDDEN_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("hidden_key", default=None)


def generator(seed: int) -> torch.Generator:
    """A seeded generator, so that every checker draws the same cases every time: the *public* cases a student
    sees in the notebook. Inside :func:`hidden_cases` the seed is mixed with the instructor's key, so the same
    checkers draw other inputs (their hand-written edge cases stay)."""
    key = _HIDDEN_KEY.get()
    if key is not None:
        seed = int.from_bytes(hashlib.sha256(f"{key}\x00{seed}".encode()).digest()[:8], "little") >> 1
    return torch.Generator().manual_seed(seed)


@contextlib.contextmanager
def hidden_cases(key: str):
    """Run checkers on the *hidden* cases drawn from ``key``, a secret of the instructor's (``check --hidden``):
    an answer written to fit the public cases fails them, a correct one passes both."""
    if not isinstance(key, str) or not key:
        raise ValueError("the hidden cases need a non-empty key (a secret string of the instructor's)")
    token = _HIDDEN_KEY.set(key)
    try:
        yield
    finally:
        _HIDDEN_KEY.reset(token)


def randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    """Standard normal float64 numbers of ``shape`` from ``gen``, times ``scale``: the checkers' random inputs."""
    return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale


def _as_array(x: Any) -> np.ndarray | None:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().to(torch.float64).numpy() if x.is_floating_point() else x.detach().cpu().numpy()
    if isinstance(x, np.ndarray | float | int | np.number):
        return np.asarray(x)
    return None


def describe_difference(got: Any, expected: Any, *, atol: float = 1e-6, rtol: float = 1e-5,
                        what: str = "output") -> str | None:
    """``None`` if ``got`` matches ``expected`` within tolerance, else a sentence saying what differs.

    Handles tensors, arrays, numbers and (nested) tuples/lists of them; reports the first mismatch of
    type, length, shape, or values (the worst entry, its index and both values).
    """
    if isinstance(expected, tuple | list):
        if not isinstance(got, tuple | list):
            return f"{what} should be a {type(expected).__name__} of {len(expected)} items, got {type(got).__name__}"
        if len(got) != len(expected):
            return f"{what} should have {len(expected)} items, got {len(got)}"
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            msg = describe_difference(g, e, atol=atol, rtol=rtol, what=f"{what}[{i}]")
            if msg:
                return msg
        return None
    wrong_type = _integer_mismatch(got, expected, what)
    if wrong_type:
        return wrong_type
    e, g = _as_array(expected), _as_array(got)
    if e is None:
        return None if got == expected else f"{what} should be {expected!r}, got {got!r}"
    if g is None:
        return f"{what} should be a {type(expected).__name__}, got {type(got).__name__}"
    if g.shape != e.shape:
        return f"{what} has shape {tuple(g.shape)}, expected {tuple(e.shape)}"
    if e.dtype == bool or np.issubdtype(e.dtype, np.integer):
        bad = np.argwhere(g != e)
        if len(bad):
            idx = tuple(int(i) for i in bad[0])
            return f"{what} differs in {len(bad)} of {e.size} entries; first at {idx}: got {g[idx]}, expected {e[idx]}"
        return None
    g = g.astype(np.float64)
    nan_g, nan_e = np.isnan(g), np.isnan(e)
    if (nan_g != nan_e).any():
        idx = tuple(int(i) for i in np.argwhere(nan_g != nan_e)[0])
        return f"{what} has NaN where it should not (or misses one) at {idx}: got {g[idx]}, expected {e[idx]}"
    with np.errstate(invalid="ignore"):
        err = np.where(nan_e, 0.0, np.abs(g - e))
        err = np.where(np.isinf(e) & (g == e), 0.0, err)
    bad = err > atol + rtol * np.abs(np.where(np.isinf(e), 0, e))
    if bad.any():
        idx = tuple(int(i) for i in np.unravel_index(np.argmax(np.where(bad, err, -1)), e.shape)) if e.ndim else ()
        shown_g, shown_e = distinct_digits(g[idx], e[idx])
        return (f"{what} differs in {int(bad.sum())} of {e.size} entries; worst at {idx}: got {shown_g}, "
                f"expected {shown_e} (|diff| = {err[idx]:.3g}, tolerance {atol:g} + {rtol:g}·|expected|)")
    return None


def distinct_digits(got: float, expected: float) -> tuple[str, str]:
    """``got`` and ``expected`` printed with the fewest significant digits (at least 6) that tell them apart, so
    that a message never reads "got 0.001, expected 0.001"."""
    for digits in range(6, 18):
        a, b = f"{got:.{digits}g}", f"{expected:.{digits}g}"
        if a != b:
            return a, b
    return repr(float(got)), repr(float(expected))


def _integer_mismatch(got: Any, expected: Any, what: str) -> str | None:
    """A sentence when ``expected`` is an integer (a Python int, or an integer tensor or array) and ``got`` is
    not: a float that happens to equal it is still the wrong type for a count or an index."""
    if isinstance(expected, bool | np.bool_):
        return None
    if isinstance(expected, int | np.integer):
        if isinstance(got, bool) or not isinstance(got, int | np.integer):
            return f"{what} must be an int, got {type(got).__name__} {got!r}"
        return None
    e_int = (isinstance(expected, torch.Tensor) and not expected.is_floating_point() and expected.dtype != torch.bool
             ) or (isinstance(expected, np.ndarray) and np.issubdtype(expected.dtype, np.integer))
    g_float = (isinstance(got, torch.Tensor) and got.is_floating_point()) or (
        isinstance(got, np.ndarray) and np.issubdtype(got.dtype, np.floating))
    if e_int and g_float:
        return f"{what} must hold integers (like {expected.dtype}), got {got.dtype}"
    return None


def check_function(name: str, fn: Callable, reference: Callable, cases: Iterable[dict], *,
                   atol: float = 1e-6, rtol: float = 1e-5, compare: Callable | None = None,
                   forbidden: Mapping[str, str] | None = None) -> CheckResult:
    """Call ``fn`` and ``reference`` on each case and compare the results.

    A case is a dict of the reference's arguments by name; ``fn`` gets them by position, so a student's function
    passes whatever it names its parameters (only the reference's keyword-only parameters go by name).
    ``compare(got, expected) -> str | None`` replaces :func:`describe_difference` where an exercise needs its
    own notion of "equal" (e.g. a sample's statistics). Inputs are cloned so ``fn`` cannot change them.
    ``forbidden`` names the PyTorch operators the exercise asks the student to write: they raise while ``fn``
    runs (:mod:`transformer_lab.exercises.forbid`).
    """
    if not callable(fn):
        return CheckResult(name, False, f"expected a function, got {type(fn).__name__}")
    params = inspect.signature(reference).parameters
    keyword = {p for p in params if params[p].kind is inspect.Parameter.KEYWORD_ONLY}
    required = [p for p in params if params[p].default is inspect.Parameter.empty and p not in keyword]
    try:
        inspect.signature(fn).bind(*[None] * len(required), **{p: None for p in keyword
                                                                if params[p].default is inspect.Parameter.empty})
    except TypeError:
        want = ", ".join(params)
        return CheckResult(name, False, f"{getattr(fn, '__name__', 'function')} should take {len(required)} "
                                        f"argument(s), in this order: ({want})")
    except ValueError:  # builtins without a signature: just try them
        pass
    n = 0
    for n, case in enumerate(cases, start=1):
        shown = ", ".join(f"{k}={_short(v)}" for k, v in case.items()) or "no arguments"
        try:
            args = _clone(case)  # by position, in the reference's order: the student may name them as they like
            with forbidding(forbidden):
                got = fn(*(args[p] for p in params if p in args and p not in keyword),
                         **{p: args[p] for p in keyword if p in args})
        except NotImplementedError:
            return CheckResult(name, False, "not written yet: replace `raise NotImplementedError` with your code")
        except Exception as exc:  # a student's bug: report it, do not crash the notebook
            return CheckResult(name, False, f"raised {type(exc).__name__}: {exc} (on case {n}: {shown})")
        expected = reference(**_clone(case))
        try:
            msg = (compare or (lambda g, e: describe_difference(g, e, atol=atol, rtol=rtol)))(got, expected)
        except Exception as exc:  # an answer of an unforeseen form: a verdict, never a crash of the checker
            msg = (f"the answer ({type(got).__name__}) could not be compared with the expected "
                   f"{type(expected).__name__}: {type(exc).__name__}: {exc}")
        if msg:
            return CheckResult(name, False, f"{msg} (on case {n}: {shown})")
    return CheckResult(name, True, f"matches the reference on {'all ' if n > 1 else ''}{n} case{'s' if n != 1 else ''}")


def _clone(case: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v.copy() if isinstance(v, np.ndarray) else v
            for k, v in case.items()}


def _short(v: Any) -> str:
    if isinstance(v, torch.Tensor | np.ndarray):
        return f"{type(v).__name__}{tuple(v.shape)}"
    if isinstance(v, float):
        return f"{v:g}" if math.isfinite(v) else str(v)
    return repr(v) if len(repr(v)) < 40 else type(v).__name__


def registry(chapter: int) -> dict[str, Callable[[Callable], CheckResult]]:
    """The exercises of a chapter: ``{function name the student writes: its checker}``."""
    if chapter not in CHAPTERS:
        raise ValueError(f"no chapter {chapter}; chapters are {sorted(CHAPTERS)}")
    try:
        module = importlib.import_module(f"{__name__}.{CHAPTERS[chapter]}")
    except ModuleNotFoundError as exc:
        raise ValueError(f"chapter {chapter} has no exercises yet") from exc
    return module.EXERCISES


def check_file(chapter: int, path: str | Path) -> list[CheckResult]:
    """Import a student's answers file and run every checker of ``chapter`` on the functions it defines."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"answers file not found: {path}")
    exercises = registry(chapter)
    spec = importlib.util.spec_from_file_location(f"answers_ch{chapter}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ValueError(f"{path} could not be imported: {type(exc).__name__}: {exc}") from exc
    finally:
        sys.modules.pop(spec.name, None)
    results = []
    for fname, checker in exercises.items():
        fn = getattr(module, fname, None)
        if fn is None:
            results.append(CheckResult(fname, False, f"{path.name} defines no function named {fname!r}"))
        else:
            results.append(checker(fn))
    return results


def check_expression(name: str, fn: Callable, reference: Callable, cases: Iterable[dict] = ({},), *,
                     symbols: Iterable | None = None, hints: Iterable[tuple[Callable, str]] = ()) -> CheckResult:
    """Check a derivation: ``fn`` returns a SymPy expression (or matrix) that must equal ``reference``'s.

    ``cases`` are argument dicts as in :func:`check_function` (the default: one call with no arguments). Equal means
    ``sympy.simplify(got − expected) == 0``; where simplify leaves a difference it cannot reduce, the two must agree
    at several random rational points (exact arithmetic, evaluated to 50 digits), which decides identities such as
    a sum of logarithms simplify does not combine. Symbols are matched by name (a student's ``Symbol("t")`` is the
    book's ``Symbol("t", positive=True)``); ``symbols`` names those an answer may use (default: the expected
    answer's). ``hints`` are ``(mistake, hint)`` pairs: a hint is added when the answer equals ``mistake``'s on every
    case. A float in the answer is refused: a derivation's answer is exact. A column vector may be given as a list.
    """
    cases = list(cases)
    allowed = None if symbols is None else list(symbols)
    result = check_function(name, fn, reference, cases, compare=lambda got, expected: _expression_difference(
        got, expected, allowed))
    if cases == [{}]:  # no arguments: "on case 1: no arguments" says nothing
        result = CheckResult(name, result.passed, result.message.replace(" (on case 1: no arguments)", ""))
    if result.passed or result.message.startswith("not written yet"):
        return result
    for mistake, hint in hints:
        same = check_function(name, fn, _by_position(mistake, reference), cases,
                              compare=lambda got, expected: _expression_difference(got, expected, allowed))
        if same.passed:
            return CheckResult(name, False, f"{result.message}. Hint: {hint}")
    return result


def _by_position(mistake: Callable, reference: Callable) -> Callable:
    """``mistake`` called as ``reference`` is: its arguments by position (keyword-only ones by name), whatever
    ``mistake`` names its parameters."""
    params = inspect.signature(reference).parameters
    keyword = [p for p in params if params[p].kind is inspect.Parameter.KEYWORD_ONLY]

    def call(**kwargs):
        return mistake(*(kwargs[p] for p in params if p in kwargs and p not in keyword),
                       **{p: kwargs[p] for p in keyword if p in kwargs})

    call.__signature__ = inspect.signature(reference)
    return call


_POINTS = 6  # random rational points where an undecided difference must vanish


def _expression_difference(got: Any, expected: Any, allowed: list | None) -> str | None:
    """``None`` when the SymPy answer ``got`` equals ``expected``, else a sentence saying how it differs."""
    import sympy as sp

    if isinstance(got, str):
        return (f"the answer is the string {got!r}, not a SymPy expression: build it from SymPy symbols "
                f"(sp.Symbol, sp.symbols) and functions (sp.log, sp.exp, …)")
    if isinstance(got, sp.core.relational.Relational):
        return f"the answer is the equation {got}; return the expression itself (its right-hand side)"
    if isinstance(got, float):
        got = sp.Float(got)  # refused below with the exact-numbers message
    if isinstance(got, list | tuple) and isinstance(expected, sp.MatrixBase) and expected.shape[1] == 1:
        got = sp.Matrix(got)  # a vector answer may be a list of its entries
    if isinstance(got, bool) or not isinstance(got, sp.Basic | sp.MatrixBase | int):
        return f"the answer should be a SymPy expression, got {type(got).__name__} {_short(got)}"
    got, expected = sp.sympify(got), sp.sympify(expected)
    if isinstance(expected, sp.MatrixBase) != isinstance(got, sp.MatrixBase):
        want = f"a {expected.shape[0]}×{expected.shape[1]} matrix" if isinstance(expected, sp.MatrixBase) else (
            "a scalar expression")
        return f"the answer should be {want}, got {type(got).__name__}"
    if isinstance(expected, sp.MatrixBase) and got.shape != expected.shape:
        return f"the answer has shape {got.shape}, expected {expected.shape}"
    if got.atoms(sp.Float):
        return (f"the answer {got} holds floating-point numbers; a derivation is exact: write sp.Rational(1, 3) or "
                f"sp.Integer(1)/3, sp.sqrt(2), sp.pi, not 0.333…, 1.414…, 3.14…")
    known = {str(s): s for s in (expected.free_symbols if allowed is None else allowed)}
    unknown = sorted(str(s) for s in got.free_symbols if str(s) not in known)
    if unknown:
        return (f"the answer uses {', '.join(unknown)}, which it may not contain (allowed: "
                f"{', '.join(sorted(known)) or 'no symbols'})")
    got = got.xreplace({s: known[str(s)] for s in got.free_symbols})  # same name ⇒ the book's symbol
    pairs = zip(got, expected, strict=True) if isinstance(expected, sp.MatrixBase) else [(got, expected)]
    for i, (g, e) in enumerate(pairs):
        where = f" in entry {divmod(i, expected.shape[1])}" if isinstance(expected, sp.MatrixBase) else ""
        witness = _counterexample(g, e, sorted(known.values(), key=str))
        if witness is not None:
            at = f" (at {witness})" if witness else ""
            return f"the answer{where} simplifies to {sp.simplify(g)}, expected {sp.simplify(e)}{at}"
    return None


def _counterexample(got: Any, expected: Any, symbols: list) -> str | None:
    """``None`` when ``got`` equals ``expected``; else where they differ, as text (``"t = 2: got 3, expected
    0.5"``; empty when there are no symbols to show)."""
    import random

    import sympy as sp

    difference = sp.simplify(got - expected)
    if difference == 0:
        return None
    rng, tried, checked = random.Random(0), 0, 0
    while checked < _POINTS and tried < 20 * _POINTS:
        tried += 1
        point = {s: _random_value(s, rng) for s in symbols}
        value = sp.N(difference.subs(point), 50)
        if not value.is_finite:  # a pole of either side: draw another point
            continue
        checked += 1
        if abs(value) > 1e-30 * max(1, abs(sp.N(expected.subs(point), 50))):
            shown = ", ".join(f"{s} = {v}" for s, v in point.items())
            return shown and f"{shown}: got {sp.N(got.subs(point), 6)}, expected {sp.N(expected.subs(point), 6)}"
    return None if checked else "no point where both sides are finite"


def _random_value(symbol: Any, rng: Any) -> Any:
    """A random exact value in ``symbol``'s domain: a whole number 1…6 for an integer symbol, a rational in (0, 1)
    for a positive one (e.g. β₁), else a rational in (−1, 1)."""
    import sympy as sp

    if symbol.is_integer:
        return sp.Integer(rng.randint(1, 6))
    value = sp.Rational(rng.randint(1, 96), 97)
    return value if symbol.is_positive or symbol.is_nonnegative or rng.random() < 0.5 else -value
