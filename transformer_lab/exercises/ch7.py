"""Chapter 7 (numerical analysis) exercises: automatic checks.

* ``overflow_point(pattern, dtype)`` -- the ``a`` at which ``sum_i exp(a * pattern_i)`` reaches the format's
  largest finite number: where a naive softmax of ``a * pattern`` starts to fail
* ``stable_logsumexp(x)`` -- log sum exp over the last dimension, finite for logits of any size (``-inf`` for a
  fully masked row)
* ``layer_norm_rows(x, weight, bias, eps)`` -- LayerNorm over the last dimension, as ``nn.LayerNorm``
* ``two_pass_variance(x)`` -- the population variance over the last dimension, in ``x``'s dtype, accurate in
  float32 even when the mean is large (where ``E[x^2] - E[x]^2`` cancels catastrophically)
* ``score_variance(d_k, mu_q, mu_k, sigma_q, sigma_k)`` -- Var(q . k) for independent entries with those means and
  standard deviations, a SymPy expression
* ``depth_rms(arrangement, W1, W2, x, w)`` -- (2, n_layer + 1): the rms of x_0 … x_{n_layer} through n_layer
  blocks of an arrangement (plain, residual, post-LN, pre-LN) and of the gradients of sum(x_{n_layer} * w) with
  respect to each
* ``update_effect(arrangement, W1, W2, dW1, dW2, x)`` -- (n_layer + 1,): rms(x_l(W + dW) - x_l(W)) / rms(x_l(W))
  at every depth l, how far a change of every weight moves the stream (the amplification effect)
* ``trick_reason(trick)`` -- "floating point", "optimisation" or "neither": the chapter's sorting of the tricks

Each checker runs groups of cases; when a group fails, the message adds a hint about what that group tests (a
hint may first look at the answer, so that it names the mistake actually made). A group may set its own
tolerances (float32 cases cannot be held to float64's).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from transformer_lab.exercises import CheckResult, check_expression, check_function, describe_difference, generator
from transformer_lab.exercises.forbid import LAYER_NORM, LOGSUMEXP, VARIANCE

D = torch.float64


def _same_dtype(atol: float, rtol: float):
    """A ``compare`` for ``check_function``: the output must have the reference's dtype, then its values."""
    def compare(got, expected):
        if isinstance(got, torch.Tensor) and isinstance(expected, torch.Tensor) and got.dtype != expected.dtype:
            return (f"output must have x's dtype ({str(expected.dtype).replace('torch.', '')}), "
                    f"got {str(got.dtype).replace('torch.', '')}")
        return describe_difference(got, expected, atol=atol, rtol=rtol)
    return compare


def _worst_ratio_error(fn, reference, cases, factor=lambda case: 1.0) -> float:
    """The largest ``|fn / (factor * reference) - 1|`` over ``cases`` (inf if ``fn`` raises or gives another
    shape): how far an answer is from the reference, or from a typical mistake ``factor * reference``."""
    worst = 0.0
    for case in cases:
        try:
            got = torch.as_tensor(fn(*(v.clone() if isinstance(v, torch.Tensor) else v for v in case.values())))
        except Exception:  # a student's bug: no diagnosis
            return math.inf
        expected = reference(**case).double() * factor(case)
        if got.shape != expected.shape or not torch.isfinite(got).all():
            return math.inf
        worst = max(worst, ((got.double() - expected).abs() / expected.abs().clamp_min(1e-30)).max().item())
    return worst


def _groups(name: str, fn, reference, groups, *, atol: float, rtol: float, shape_hint: str,
            same_dtype: bool = False, forbidden: dict[str, str] | None = None) -> CheckResult:
    """Run ``check_function`` group by group; a failure names the group and adds its hint (``shape_hint`` when
    the output has the wrong shape, whatever the group). ``same_dtype`` also requires the reference's dtype;
    ``forbidden`` names the PyTorch operators the exercise asks for by hand (they raise while ``fn`` runs).

    A group is ``(label, cases, hint)`` or ``(label, cases, hint, {"atol": ..., "rtol": ...})``; a hint is a
    string, or a function ``hint(fn, cases) -> str`` that looks at the answer to name the mistake."""
    total = 0
    for label, cases, hint, *tol in groups:
        tol = {"atol": atol, "rtol": rtol, **(tol[0] if tol else {})}
        compare = _same_dtype(**tol) if same_dtype else None
        result = check_function(name, fn, reference, cases, compare=compare, forbidden=forbidden, **tol)
        if not result.passed:
            if result.message.startswith(("not written yet", "expected a function", "raised ForbiddenCall")) or (
                    " should take " in result.message and "argument(s), in this order" in result.message):
                return result
            if result.message.startswith("output has shape"):
                hint = shape_hint
            elif result.message.startswith("output must have x's dtype"):
                hint = "compute in x's own dtype, or convert the result back with .to(x.dtype)"
            elif callable(hint):
                hint = hint(fn, cases)
            return CheckResult(name, False, f"{label}: {result.message}. Hint: {hint}")
        total += len(cases)
    return CheckResult(name, True, f"matches the reference on all {total} cases ({', '.join(g[0] for g in groups)})")


# ---------------------------------------------------------------- 0. where the naive softmax overflows
def _ref_overflow_point(pattern, dtype):
    """The ``a > 0`` with ``log sum_i exp(a p_i) = log(finfo(dtype).max)``, by bisection in float64 (the left
    side grows with ``a`` for ``0 <= p_i <= 1``, ``max p = 1``, and is ``>= a``, so the root lies in
    ``[0, log max]``)."""
    log_max = math.log(torch.finfo(dtype).max)
    p = pattern.double()
    lo, hi = 0.0, log_max
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if torch.logsumexp(mid * p, 0).item() < log_max else (lo, mid)
    return (lo + hi) / 2


def _overflow_hint(fn, cases):
    """Name the slip: log2 or the dtype's max itself, float32's max for every format, or one term only. An
    alternative is tried only where it differs from the reference on the group's cases (for one logit, log(max)
    is the answer); an answer within 1e-3 of the reference that is not one of them is a precision slip."""
    def matches(alternative, values):
        return all(math.isclose(v, alternative(c), rel_tol=1e-6) for v, c in zip(values, cases, strict=True))

    try:
        got = [float(fn(c["pattern"].clone(), c["dtype"])) for c in cases]
    except Exception:  # a student's bug: no diagnosis
        got = None
    reference = [_ref_overflow_point(c["pattern"], c["dtype"]) for c in cases]
    log_max = lambda c: math.log(torch.finfo(c["dtype"]).max)  # noqa: E731
    slips = [
        (lambda c: math.log2(torch.finfo(c["dtype"]).max),
         "exp overflows where a exceeds the natural logarithm of the largest number: math.log, not math.log2"),
        (lambda c: math.log(torch.finfo(torch.float32).max),
         "each format has its own largest number: torch.finfo(dtype).max, not float32's"),
        (log_max, "a = log(max) is where the largest term e^a alone overflows; the other terms count too: the sum "
                  "reaches max when log sum_i e^{a p_i} = log(max)"),
        (lambda c: log_max(c) - math.log(len(c["pattern"])),
         "log(max) - log(n) treats all n terms as equal to the largest; here they are not: solve "
         "log sum_i e^{a p_i} = log(max) for a (bisection between 0 and log(max) works: the left side grows with a)"),
    ]
    if got is not None:
        for alternative, hint in slips:
            if matches(alternative, got) and not matches(alternative, reference):
                return hint
        if all(math.isfinite(v) and abs(v - r) < 1e-3 for v, r in zip(got, reference, strict=True)):
            return ("close, but not to 1e-6: compute in float64 (float32 carries about 7 significant digits, too "
                    "few near a = 88.7)")
    return ("the answer is the a with log sum_i e^{a p_i} = log(torch.finfo(dtype).max), the natural logarithm; "
            "solve it numerically (bisection between 0 and log(max) works: the left side grows with a)")


def check_overflow_point(fn) -> CheckResult:
    """``fn(pattern (n,) float64 with entries in [0, 1] and max 1, dtype) -> float``: the ``a`` at which the exact
    sum ``sum_i exp(a * pattern_i)`` reaches ``torch.finfo(dtype).max``, to 1e-6."""
    P = torch.tensor([1.0, 0.9, 0.6, 0.2, 0.0], dtype=D)  # the figure's pattern
    groups = [
        ("one logit", [{"pattern": torch.tensor([1.0], dtype=D), "dtype": dt} for dt in (torch.float16, torch.float32)],
         _overflow_hint),
        ("four equal logits", [{"pattern": torch.ones(4, dtype=D), "dtype": torch.float16}], _overflow_hint),
        ("the figure's pattern", [{"pattern": P, "dtype": dt} for dt in
                                  (torch.float16, torch.bfloat16, torch.float32, torch.float64)], _overflow_hint),
        ("64 logits between 0 and 1", [{"pattern": torch.linspace(0, 1, 64, dtype=D), "dtype": torch.float16}],
         _overflow_hint),
    ]
    return _groups("overflow_point", fn, _ref_overflow_point, groups, atol=1e-6, rtol=1e-9,
                   shape_hint="return one number, the value of a (a float)")


# ---------------------------------------------------------------- 1. log-sum-exp
def _ref_logsumexp(x):
    return torch.logsumexp(x, dim=-1)


def _lse_hint(base: str):
    """The group's hint ``base``, unless the answer names another slip: a float32 result for float64 logits, or
    ``log sum exp(x - m)`` without the shift ``m = max(x)`` added back, or a near miss (a float32 step)."""
    def hint(fn, cases):
        try:
            got = [torch.as_tensor(fn(*(v.clone() for v in c.values()))) for c in cases]
        except Exception:  # a student's bug: no diagnosis
            return base
        if any(g.dtype != c["x"].dtype for g, c in zip(got, cases, strict=True)):
            return ("the result has another dtype than x: compute in x's own dtype (float64 here; float32 carries "
                    "only about 7 significant digits)")
        shifted = [_ref_logsumexp(c["x"]) - c["x"].amax(dim=-1) for c in cases]
        if all(g.shape == s.shape and torch.allclose(g.double(), s, atol=1e-9, rtol=1e-9)
               for g, s in zip(got, shifted, strict=True)):
            return "add the shift m back: LSE(x) = m + log sum_i exp(x_i - m), with m = max(x) of the row"
        if all(g.shape == c["x"].shape[:-1] and torch.allclose(g.double(), _ref_logsumexp(c["x"]), atol=1e-5,
                                                               rtol=1e-5) for g, c in zip(got, cases, strict=True)):
            return ("close, but not to 1e-9: keep every step in x's dtype (float64 here); a float32 step carries "
                    "only about 7 significant digits")
        return base
    return hint


def check_stable_logsumexp(fn) -> CheckResult:
    """``fn(x (..., n)) -> (...)``: log(sum(exp(x))) over the last dimension, without overflow or underflow."""
    g = generator(7)
    groups = [
        ("ordinary logits", [{"x": torch.randn(5, generator=g, dtype=D)},
                             {"x": torch.randn(3, 4, 6, generator=g, dtype=D) * 3}],
         _lse_hint("LSE(x) = log(sum_i exp(x_i)) over the last dimension; the result has one dimension fewer "
                   "than x")),
        ("a single logit", [{"x": torch.tensor([[2.5], [-7.0]], dtype=D)}],
         "with one entry, LSE(x) = x"),
        ("huge logits", [{"x": torch.tensor([[1000.0, 999.0, -5.0], [710.0, 0.0, 710.0]], dtype=D)},
                         {"x": torch.tensor([1000.0, -1000.0], dtype=D)}],
         _lse_hint("exp(1000) overflows float64; subtract m = max(x) first and add it back: "
                   "LSE(x) = m + LSE(x - m)")),
        ("very negative logits", [{"x": torch.tensor([-1000.0, -1001.0, -1002.0], dtype=D)}],
         "exp(-1000) underflows to 0 and log(0) = -inf; the max shift makes the largest term exactly 1"),
        ("rows of very different sizes", [{"x": torch.tensor([[1000.0, 999.0], [-1000.0, -1001.0]], dtype=D)}],
         "shift each row by its own maximum (x.amax(dim=-1, keepdim=True)), not by the maximum of the whole "
         "tensor: exp(-1000 - 1000) underflows to 0"),
        ("masked entries (-inf)", [{"x": torch.tensor([[0.0, -math.inf, 1.0], [-math.inf, 3.0, -math.inf]], dtype=D)}],
         "exp(-inf) = 0 is fine; only the maximum must be finite"),
        ("a fully masked row (all -inf)",
         [{"x": torch.tensor([[-math.inf, -math.inf, -math.inf], [0.0, 1.0, -math.inf]], dtype=D)}],
         "a fully masked row is an empty sum, LSE = log 0 = -inf; but its maximum is -inf and -inf - (-inf) is NaN: "
         "shift such a row by 0 instead (m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)))"),
    ]
    return _groups("stable_logsumexp", fn, _ref_logsumexp, groups, forbidden=LOGSUMEXP, atol=1e-9, rtol=1e-9,
                   shape_hint="sum over the last dimension and drop it: x (..., n) gives (...); a keepdim=True "
                              "step needs a .squeeze(-1) at the end")


def _large_mean_hint(square: str, ratio: float):
    """The hint for float32 rows with a large mean: cancellation if the answer is far off, Welford-like
    running updates (an error growing with mean / spread) if it is close but not close enough."""
    def hint(fn, cases):
        reference = _ref_layer_norm if "weight" in cases[0] else _ref_variance
        if _worst_ratio_error(fn, reference, cases) > 1e-2:
            return (f"the mean is {ratio:g} times the spread: E[x^2] - E[x]^2 subtracts two float32 numbers near "
                    f"{square} whose difference is mostly rounding; compute the mean first, then the mean of "
                    "(x - mean)^2 (two passes)")
        return ("close, but not as accurate as two passes: a running (Welford) update in float32 makes errors that "
                f"grow with mean / spread ({ratio:g} here); compute the mean first, then the mean of (x - mean)^2")
    return hint


def _ln_unit_hint(fn, cases):
    C = cases[0]["x"].shape[-1]
    sample = lambda case: math.sqrt((C - 1) / C)  # noqa: E731  dividing by C - 1 shrinks xhat by this factor
    if _worst_ratio_error(fn, _ref_layer_norm, cases, sample) < 1e-6:
        return "the population variance divides by C, not C - 1 (torch.var needs correction=0)"
    return ("normalise each row over its last dimension (dim=-1): subtract its mean, divide by the square root of "
            "its population variance (divide by C, not C - 1)")


# ---------------------------------------------------------------- 2. LayerNorm
def _ref_layer_norm(x, weight, bias, eps):
    """``F.layer_norm`` in float64 (for float32 inputs too), returned in ``x``'s dtype."""
    return F.layer_norm(x.double(), (x.shape[-1],), weight.double(), bias.double(), eps).to(x.dtype)


def _ln_eps_outside(x, weight, bias, eps):
    """The typical slip ``sqrt(var) + eps``, for diagnosis only."""
    x = x.double()
    return (x - x.mean(-1, keepdim=True)) / (x.var(-1, keepdim=True, correction=0).sqrt() + eps) * weight + bias


def _ln_eps_hint(fn, cases):
    if _worst_ratio_error(fn, _ln_eps_outside, cases) < 1e-6:
        return "eps goes inside the square root: sqrt(var + eps), not sqrt(var) + eps"
    return ("add eps to the variance, inside the square root: (x - mean) / sqrt(var + eps), with eps itself (not "
            "eps^2, and not left out)")


def check_layer_norm_rows(fn) -> CheckResult:
    """``fn(x (..., C), weight (C,), bias (C,), eps) -> (..., C)``: (x - mean) / sqrt(var + eps) * weight + bias,
    with the population variance (divide by C) over the last dimension; float64 cases to 1e-8, and float32 rows
    whose mean is 1000 times their spread to 1e-3 (a one-pass variance fails there)."""
    g = generator(8)

    def case(shape, eps=0.0, scale=1.0, offset=0.0):
        C = shape[-1]
        return {"x": torch.randn(shape, generator=g, dtype=D) * scale + offset,
                "weight": torch.randn(C, generator=g, dtype=D), "bias": torch.randn(C, generator=g, dtype=D),
                "eps": eps}

    groups = [
        ("unit weight, zero bias, eps = 0",
         [{"x": torch.randn(3, 8, generator=g, dtype=D), "weight": torch.ones(8, dtype=D),
           "bias": torch.zeros(8, dtype=D), "eps": 0.0}],
         _ln_unit_hint),
        ("random weight and bias, eps = 0", [case((4, 6)), case((2, 3, 16), scale=5.0, offset=3.0)],
         "after normalising, multiply by weight and add bias, feature by feature"),
        ("eps > 0", [case((5, 4), eps=1e-5), case((5, 4), eps=0.5)], _ln_eps_hint),
        ("constant rows (zero variance)", [{"x": torch.full((2, 5), 3.0, dtype=D), "weight": torch.ones(5, dtype=D),
                                            "bias": torch.arange(5, dtype=D), "eps": 1e-5}],
         "a constant row normalises to 0, so the output is the bias; eps keeps the division finite"),
        ("float32 rows with a large mean",
         [{"x": (torch.randn(4, 64, generator=g, dtype=D) + 1e3).float(),
           "weight": torch.randn(64, generator=g).float(), "bias": torch.randn(64, generator=g).float(), "eps": 1e-5}],
         _large_mean_hint("1e6", 1e3),
         {"atol": 1e-3, "rtol": 1e-4}),  # float32: a two-pass answer is within 2e-4 of float64, one pass is not
    ]
    return _groups("layer_norm_rows", fn, _ref_layer_norm, groups, forbidden=LAYER_NORM, atol=1e-8, rtol=1e-8,
                   shape_hint="the output has the shape of x; keep the reduced dimension (keepdim=True) for the "
                              "mean and variance so they broadcast over the C features")


# ---------------------------------------------------------------- 3. two-pass variance
def _ref_variance(x):
    return x.double().var(dim=-1, correction=0).to(x.dtype)


def _variance_hint(fn, cases):
    sample = lambda case: case["x"].shape[-1] / (case["x"].shape[-1] - 1)  # noqa: E731  n / (n - 1)
    if _worst_ratio_error(fn, _ref_variance, cases, sample) < 1e-6:
        return "the population variance divides by n, not n - 1"
    return ("the population variance of each row: the mean over the last dimension of (x - mean)^2, with the "
            "row's own mean (keepdim=True so it broadcasts), not its square root")


def check_two_pass_variance(fn) -> CheckResult:
    """``fn(x (..., n)) -> (...)``: (1/n) sum_i (x_i - mean)^2 over the last dimension, in x's dtype, accurate to
    a relative 1e-4 in float32 even when the mean is 10^4 times the spread."""
    g = generator(9)
    groups = [
        ("float64 rows", [{"x": torch.randn(4, 10, generator=g, dtype=D) * 2 + 1},
                          {"x": torch.randn(7, generator=g, dtype=D)}],
         _variance_hint),
        ("one value per row", [{"x": torch.randn(3, 1, generator=g, dtype=D)}],
         "a single value has variance 0"),
        ("constant rows", [{"x": torch.full((2, 6), 0.1, dtype=torch.float32)}],
         "the variance of a constant row is exactly 0 (never negative)"),
        ("float32 with a large mean", [{"x": (torch.randn(3, 1000, generator=g, dtype=D) + 1e4).float()},
                                       {"x": (torch.rand(2, 500, generator=g, dtype=D) * 0.01 + 300.0).float()}],
         _large_mean_hint("1e8", 1e4)),
    ]
    return _groups("two_pass_variance", fn, _ref_variance, groups, forbidden=VARIANCE, atol=1e-7, rtol=1e-4,
                   same_dtype=True,
                   shape_hint="average over the last dimension and drop it: x (..., n) gives (...); keep the "
                              "dimension only for the mean you subtract")


# ---------------------------------------------------------------- 6. Var(q . k) with means (SymPy)
def _score_symbols():
    """d_k (a positive integer), mu_q, mu_k (real), sigma_q, sigma_k (positive)."""
    import sympy as sp

    return (sp.Symbol("d_k", integer=True, positive=True), *sp.symbols("mu_q mu_k", real=True),
            *sp.symbols("sigma_q sigma_k", positive=True))


def _ref_score_variance(d_k, mu_q, mu_k, sigma_q, sigma_k):
    """d_k (sigma_q^2 sigma_k^2 + mu_q^2 sigma_k^2 + sigma_q^2 mu_k^2): d_k independent terms, each
    Var(q_i k_i) = E[q_i^2] E[k_i^2] - (mu_q mu_k)^2 (derived with sympy.stats in the tests)."""
    return d_k * (sigma_q**2 * sigma_k**2 + mu_q**2 * sigma_k**2 + sigma_q**2 * mu_k**2)


def check_score_variance(fn) -> CheckResult:
    """``fn(d_k, mu_q, mu_k, sigma_q, sigma_k) -> sympy expression``: Var(sum_i q_i k_i), entries independent."""
    import sympy as sp

    d_k, mu_q, mu_k, sq, sk = _score_symbols()
    cases = [{"d_k": d_k, "mu_q": mu_q, "mu_k": mu_k, "sigma_q": sq, "sigma_k": sk},
             {"d_k": d_k, "mu_q": sp.Integer(0), "mu_k": mu_k, "sigma_q": sq, "sigma_k": sk}]
    one = lambda a, b, s, t: s**2 * t**2 + a**2 * t**2 + s**2 * b**2  # noqa: E731  one term's variance
    hints = [
        (lambda d_k, mu_q, mu_k, sigma_q, sigma_k: d_k * sigma_q**2 * sigma_k**2,
         "that is the mean-0 result; with means, E[q_i^2] = sigma_q^2 + mu_q^2, so Var(q_i k_i) = "
         "E[q_i^2] E[k_i^2] - (mu_q mu_k)^2 has cross terms"),
        (lambda d_k, mu_q, mu_k, sigma_q, sigma_k: d_k * (sigma_q**2 + mu_q**2) * (sigma_k**2 + mu_k**2),
         "that is E[(q_i k_i)^2] summed: subtract each term's squared mean (mu_q mu_k)^2"),
        (lambda d_k, mu_q, mu_k, sigma_q, sigma_k: d_k**2 * one(mu_q, mu_k, sigma_q, sigma_k),
         "the terms are independent, so their variances add: d_k times one term's, not d_k^2 times (that would "
         "be perfectly correlated terms)"),
        (lambda d_k, mu_q, mu_k, sigma_q, sigma_k: one(mu_q, mu_k, sigma_q, sigma_k),
         "that is one term's variance, or the variance of q.k / sqrt(d_k): the question asks for the unscaled sum "
         "of d_k terms"),
        (lambda d_k, mu_q, mu_k, sigma_q, sigma_k: sp.sqrt(d_k) * one(mu_q, mu_k, sigma_q, sigma_k),
         "the variance grows like d_k; its square root, the standard deviation, like sqrt(d_k)"),
        (lambda d_k, mu_q, mu_k, sigma_q, sigma_k: d_k * (sigma_q * sigma_k + mu_q * sigma_k + sigma_q * mu_k) ** 2,
         "Var(q_i k_i) = E[q_i^2] E[k_i^2] - (E[q_i] E[k_i])^2: expand E[q_i^2] = sigma_q^2 + mu_q^2 and "
         "E[k_i^2] = sigma_k^2 + mu_k^2, do not square a sum of standard deviations"),
    ]
    return check_expression("score_variance", fn, _ref_score_variance, cases, hints=hints)


# ---------------------------------------------------------------- 7. signals and gradients through depth
def _profile(xs, grads) -> torch.Tensor:
    rms = lambda t: t.detach().double().pow(2).mean().sqrt()  # noqa: E731  sqrt(mean(t^2)) over all entries
    return torch.stack([torch.stack([rms(t) for t in xs]), torch.stack([rms(g) for g in grads])])


def _run_stack(arrangement, W1, W2, x, w):
    """``[x_0, …, x_{n_layer}]`` through the package's blocks (:func:`residual.make_block`) around
    ``F_l(v) = relu(v W1[l]) W2[l]``, and the gradients of ``sum(x_{n_layer} * w)`` with respect to each."""
    from transformer_lab.residual import make_block

    xs = [x.detach().clone().requires_grad_()]
    for l in range(W1.shape[0]):
        F = lambda v, l=l: torch.relu(v @ W1[l]) @ W2[l]  # noqa: E731
        xs.append(make_block(arrangement, x.shape[-1], F).to(x.dtype)(xs[-1]))
    return xs, torch.autograd.grad((xs[-1] * w).sum(), xs)


def _ref_depth_rms(arrangement, W1, W2, x, w):
    """(2, n_layer + 1) float64: row 0 rms(x_l), row 1 rms(d sum(x_{n_layer} w) / d x_l), l = 0 … n_layer."""
    return _profile(*_run_stack(arrangement, W1, W2, x, w))


def _depth_cases() -> list[dict]:
    """The checker's cases: each arrangement, He-initialised W1 and W2 scaled to a branch gain, float64."""
    g = generator(13)
    cases = []
    for arrangement, n_layer, gain in (("pre-ln", 4, 1.0), ("post-ln", 4, 1.0), ("residual", 3, 0.5),
                                       ("plain", 3, 1.25), ("pre-ln", 6, 0.3)):
        C = 12
        cases.append({"arrangement": arrangement,
                      "W1": torch.randn(n_layer, C, C, generator=g, dtype=D) * math.sqrt(2 / C),  # He
                      "W2": torch.randn(n_layer, C, C, generator=g, dtype=D) * (gain / math.sqrt(C)),
                      "x": torch.randn(10, C, generator=g, dtype=D) + 0.5,  # mean 0.5: rms and std differ
                      "w": torch.randn(10, C, generator=g, dtype=D)})
    return cases


_DEPTH_HINTS = {
    "post-ln": "post-LN normalises the sum: x_{l+1} = LN(x_l + F(x_l))",
    "pre-ln": "pre-LN normalises only what enters the branch: x_{l+1} = x_l + F(LN(x_l))",
}


def _depth_mistakes(arrangement, W1, W2, x, w) -> list[tuple[torch.Tensor, str]]:
    """(what a typical mistake returns, its hint) for one case."""
    xs, grads = _run_stack(arrangement, W1, W2, x, w)
    std = lambda ts: torch.stack([t.detach().double().std() for t in ts])  # noqa: E731
    token_rms = lambda ts: torch.stack([t.detach().double().pow(2).mean(-1).sqrt().mean() for t in ts])  # noqa: E731
    norm = lambda ts: torch.stack([t.detach().double().norm() for t in ts])  # noqa: E731
    right = _profile(xs, grads)
    out = [(torch.stack([std(xs), std(grads)]), "the rms is sqrt(mean(t**2)) over all entries, not the standard "
                                                "deviation (which subtracts the mean and divides by N - 1)"),
           (torch.stack([norm(xs), norm(grads)]), "divide by the number of entries: rms = norm / sqrt(numel)"),
           (torch.stack([token_rms(xs), token_rms(grads)]), "one rms over all entries of x_l, not the mean of each "
                                                            "token's rms"),
           (_profile(*_run_stack(arrangement, W1, W2, x, torch.ones_like(w))),
            "the loss is sum(x_{n_layer} * w): its gradient at the top is w, not a tensor of ones"),
           (torch.stack([right[0], right[1].flip(0)]), "index l is depth l in both rows: the gradient at the input "
                                                       "x_0 comes first")]
    if arrangement in _DEPTH_HINTS:
        other = "pre-ln" if arrangement == "post-ln" else "post-ln"
        out.append((_ref_depth_rms(other, W1, W2, x, w), _DEPTH_HINTS[arrangement] + f", not the {other} order"))
        out.append((_ref_depth_rms("residual", W1, W2, x, w), _DEPTH_HINTS[arrangement] + ": the LayerNorm is missing"))
    return out


def _stack_by_stack(name: str, fn, reference, cases: list[dict], compare, mistakes, *, atol: float) -> CheckResult:
    """Check ``fn`` one stack (case) at a time; on the first that fails, the hint of the computed mistake
    ``mistakes(**case)`` (pairs of a wrong result and its hint) that the answer equals, if any."""
    for n, case in enumerate(cases, start=1):
        result = check_function(name, fn, reference, [case], compare=compare)
        if result.passed:
            continue
        if result.message.startswith(("not written yet", "expected a function")) or "in this order" in result.message:
            return result
        message = result.message.replace("(on case 1:", f"(on case {n}:")
        try:
            got = torch.as_tensor(fn(*(v.clone() if isinstance(v, torch.Tensor) else v for v in case.values())),
                                  dtype=D)
            for wrong, hint in mistakes(**case):
                if got.shape == wrong.shape and torch.allclose(got, wrong.double(), rtol=1e-6, atol=atol):
                    return CheckResult(name, False, f"{message}; hint: {hint}")
        except Exception:  # the message already says what differs
            pass
        return CheckResult(name, False, message)
    return CheckResult(name, True, f"matches the reference on all {len(cases)} stacks")


def check_depth_rms(fn) -> CheckResult:
    """``fn(arrangement, W1 (n_layer, C, C), W2 (n_layer, C, C), x (N, C), w (N, C)) -> (2, n_layer + 1)``: rms
    of every x_l and of every d sum(x_{n_layer} w) / d x_l, l = 0 … n_layer, through n_layer blocks around
    F_l(v) = relu(v W1[l]) W2[l]."""
    cases = _depth_cases()

    def compare(got, expected):
        if isinstance(got, torch.Tensor) and got.shape == (expected.shape[1], 2):
            return (f"output has shape {tuple(got.shape)}, expected {tuple(expected.shape)}: row 0 the activations, "
                    "row 1 the gradients")
        msg = describe_difference(got, expected, atol=1e-9, rtol=1e-6)
        if msg and msg.startswith("output has shape"):
            msg += (f": two rows of n_layer + 1 = {expected.shape[1]}, x_0 (the input) and the output of each of the "
                    f"{expected.shape[1] - 1} blocks")
        return msg

    return _stack_by_stack("depth_rms", fn, _ref_depth_rms, cases, compare, _depth_mistakes, atol=1e-9)


# ---------------------------------------------------------------- 7b. what a weight update does through depth
def _run_forward(arrangement, W1, W2, x) -> list[torch.Tensor]:
    """``[x_0, …, x_{n_layer}]`` through the package's blocks around ``F_l(v) = relu(v W1[l]) W2[l]``, no graph."""
    from transformer_lab.residual import make_block

    xs = [x.detach().double()]
    with torch.no_grad():
        for l in range(W1.shape[0]):
            F = lambda v, l=l: torch.relu(v @ W1[l].double()) @ W2[l].double()  # noqa: E731
            xs.append(make_block(arrangement, x.shape[-1], F).double()(xs[-1]))
    return xs


def _ref_update_effect(arrangement, W1, W2, dW1, dW2, x):
    """(n_layer + 1,) float64: rms(x_l(W + dW) - x_l(W)) / rms(x_l(W)), l = 0 … n_layer (entry 0 is 0)."""
    before = _run_forward(arrangement, W1, W2, x)
    after = _run_forward(arrangement, W1 + dW1, W2 + dW2, x)
    rms = lambda t: t.pow(2).mean().sqrt()  # noqa: E731  over all entries
    return torch.stack([rms(b - a) / rms(a) for a, b in zip(before, after, strict=True)])


def _update_cases() -> list[dict]:
    """Each arrangement around He-initialised weights of a branch gain, float64; a change of every weight by a
    relative ``delta``, of W2 alone, of W1 alone (large, so that dividing by the changed stream shows)."""
    g = generator(14)
    cases = []
    for arrangement, n_layer, gain, d1, d2 in (("pre-ln", 4, 1.0, 0.01, 0.01), ("post-ln", 4, 1.0, 0.01, 0.01),
                                               ("pre-ln", 5, 1.0, 0.0, 0.05), ("post-ln", 3, 1.0, 0.2, 0.0),
                                               ("residual", 3, 0.5, 0.03, 0.03), ("plain", 3, 1.25, 0.1, 0.02)):
        C = 12
        W1 = torch.randn(n_layer, C, C, generator=g, dtype=D) * math.sqrt(2 / C)  # He
        W2 = torch.randn(n_layer, C, C, generator=g, dtype=D) * (gain / math.sqrt(C))
        cases.append({"arrangement": arrangement, "W1": W1, "W2": W2,
                      "dW1": d1 * torch.randn(n_layer, C, C, generator=g, dtype=D) * math.sqrt(2 / C),
                      "dW2": d2 * torch.randn(n_layer, C, C, generator=g, dtype=D) * (gain / math.sqrt(C)),
                      "x": torch.randn(10, C, generator=g, dtype=D) + 0.5})  # mean 0.5: rms and std differ
    return cases


def _update_mistakes(arrangement, W1, W2, dW1, dW2, x) -> list[tuple[torch.Tensor, str]]:
    """(what a typical mistake returns, its hint) for one case."""
    before = _run_forward(arrangement, W1, W2, x)
    after = _run_forward(arrangement, W1 + dW1, W2 + dW2, x)
    rms = lambda t: t.pow(2).mean().sqrt()  # noqa: E731
    right = _ref_update_effect(arrangement, W1, W2, dW1, dW2, x)
    out = [
        (torch.stack([(rms(b) / rms(a) - 1).abs() for a, b in zip(before, after, strict=True)]),
         "the change is rms(x_l(W + dW) - x_l(W)), the rms of the difference, not the difference of the two rms's: "
         "an update can move the stream a lot and keep its size (post-LN keeps it at 1 whatever the weights)"),
        (torch.stack([rms(b) / rms(a) - 1 for a, b in zip(before, after, strict=True)]),
         "the change is rms(x_l(W + dW) - x_l(W)), the rms of the difference, not the difference of the two rms's"),
        (torch.stack([rms(b - a) / rms(b) for a, b in zip(before, after, strict=True)]),
         "divide by the rms of the unchanged stream, x_l(W), not of the changed one"),
        (torch.stack([rms(b - a) for a, b in zip(before, after, strict=True)]),
         "a relative change: divide the rms of the difference by rms(x_l(W))"),
        (torch.stack([((b - a).pow(2).mean(-1) / a.pow(2).mean(-1)).sqrt().mean()
                      for a, b in zip(before, after, strict=True)]),
         "one rms over all entries of x_l for the difference and one for the stream, not the mean of each token's "
         "ratio"),
        (_ref_update_effect(arrangement, W1, W2, dW1, torch.zeros_like(dW2), x),
         "change every weight matrix: W2 + dW2 as well as W1 + dW1"),
        (_ref_update_effect(arrangement, W1, W2, torch.zeros_like(dW1), dW2, x),
         "change every weight matrix: W1 + dW1 as well as W2 + dW2"),
        (_ref_update_effect(arrangement, W1, W2, dW2, dW1, x),
         "dW1 is the change of W1 and dW2 that of W2: the new weights are W1 + dW1 and W2 + dW2"),
        (torch.stack([rms(b - a) / rms(a)
                      for a, b in zip(before, _run_forward(arrangement, dW1, dW2, x), strict=True)]),
         "dW1, dW2 are changes: the new weights are W1 + dW1 and W2 + dW2, not dW1 and dW2"),
        (right.flip(0), "index l is depth l: entry 0 is the input x_0, which no weight changes (0)"),
    ]
    if arrangement in _DEPTH_HINTS:
        other = "pre-ln" if arrangement == "post-ln" else "post-ln"
        out.append((_ref_update_effect(other, W1, W2, dW1, dW2, x),
                    _DEPTH_HINTS[arrangement] + f", not the {other} order"))
        out.append((_ref_update_effect("residual", W1, W2, dW1, dW2, x),
                    _DEPTH_HINTS[arrangement] + ": the LayerNorm is missing"))
    return out


def check_update_effect(fn) -> CheckResult:
    """``fn(arrangement, W1, W2, dW1, dW2 (n_layer, C, C), x (N, C)) -> (n_layer + 1,)``: the relative change
    rms(x_l(W + dW) - x_l(W)) / rms(x_l(W)) at every depth l = 0 … n_layer, through n_layer blocks around
    F_l(v) = relu(v W1[l]) W2[l]; float64 cases to a relative 1e-6."""
    cases = _update_cases()

    def compare(got, expected):
        if isinstance(got, torch.Tensor) and got.dim() == 0:
            return (f"expected a tensor of n_layer + 1 = {expected.shape[0]} relative changes, one per depth, got a "
                    "single number: the change at every x_l, not only at the output")
        msg = describe_difference(got, expected, atol=1e-12, rtol=1e-6)
        if msg and msg.startswith("output has shape"):
            msg += (f": n_layer + 1 = {expected.shape[0]} entries, x_0 (the input, whose change is 0) and the output "
                    f"of each of the {expected.shape[0] - 1} blocks")
        return msg

    return _stack_by_stack("update_effect", fn, _ref_update_effect, cases, compare, _update_mistakes, atol=1e-12)


# ---------------------------------------------------------------- 8. the tricks, sorted
FP, OPT, NEITHER = "floating point", "optimisation", "neither"
TRICKS = {  # the chapter's table (tests/test_exercises_ch7.py reads the page's table and compares), then three more
    "max-shift": FP, "1/sqrt(d_k)": OPT, "LayerNorm": OPT, "residual connections": OPT, "pre-LN": OPT,
    "0.02/sqrt(2 n_layer) initialisation": OPT, "warm-up": OPT, "float32 statistics": FP, "loss scaling": FP,
    "dropout": NEITHER, "weight tying": NEITHER, "skipping masked blocks": NEITHER,
    "tanh-GELU as x*sigmoid(2u)": NEITHER,
    "gradient clipping": OPT, "log_softmax instead of log(softmax)": FP, "label smoothing": NEITHER,
}
_TRICK_HINTS = {
    "max-shift": "without it e^z overflows and log 0 appears; in exact arithmetic the shift changes nothing",
    "1/sqrt(d_k)": "the max-shift already prevents overflow: the scale keeps the softmax out of saturation, where "
                   "its gradient vanishes, which would hold with exact numbers too",
    "LayerNorm": "it fixes the scale of what enters each sub-layer, a reason that holds in exact arithmetic; the "
                 "floating-point benefit is only indirect",
    "residual connections": "an identity path for the gradient through depth: a scale argument, not a rounding one",
    "pre-LN": "a clean identity path and less amplification of weight updates: about optimisation",
    "0.02/sqrt(2 n_layer) initialisation": "it stops the stream's variance from growing with depth, in exact "
                                           "arithmetic too",
    "warm-up": "small updates while gradients are large and updates amplified: the scale of updates",
    "float32 statistics": "a long sum accumulates rounding errors and float16's range is small: pure floating point",
    "loss scaling": "float16 gradients below 2^-25 round to 0: a range problem that exact numbers would not have",
    "dropout": "a regulariser against over-fitting; it does nothing for stability",
    "weight tying": "fewer parameters, a shared embedding geometry: architecture, not stability",
    "skipping masked blocks": "the skipped scores would be discarded anyway; the reason is speed",
    "tanh-GELU as x*sigmoid(2u)": "the same function, computed faster; the reason is speed",
    "gradient clipping": "it bounds the size of an update, in exact arithmetic too: the scale of updates",
    "log_softmax instead of log(softmax)": "softmax can round a probability to 0 and log 0 = -inf; log_softmax never "
                                           "forms it: a floating-point reason",
    "label smoothing": "it softens the targets against over-confidence: a regulariser, like dropout",
}
_SYNONYMS = {"floating point": FP, "floating-point": FP, "fp": FP, "optimisation": OPT, "optimization": OPT,
             "scale": OPT, "neither": NEITHER, "other": NEITHER, "none": NEITHER}


def _ref_trick_reason(trick):
    return TRICKS[trick]


def check_trick_reason(fn) -> CheckResult:
    """``fn(trick) -> "floating point" | "optimisation" | "neither"`` for every trick of :data:`TRICKS`."""
    if not callable(fn):
        return CheckResult("trick_reason", False, f"expected a function, got {type(fn).__name__}")
    wrong = []
    for trick in TRICKS:
        result = check_function("trick_reason", fn, _ref_trick_reason, [{"trick": trick}],
                                compare=lambda got, expected: None)  # runs fn: a crash or a stub is reported
        if not result.passed:
            return result
        got = fn(trick)
        if not isinstance(got, str) or got.strip().lower() not in _SYNONYMS:
            return CheckResult("trick_reason", False, f"{trick!r}: the answer must be one of 'floating point', "
                                                      f"'optimisation' or 'neither', got {got!r}")
        if _SYNONYMS[got.strip().lower()] != TRICKS[trick]:
            wrong.append(f"{trick!r} is not {_SYNONYMS[got.strip().lower()]!r} ({_TRICK_HINTS[trick]})")
    if wrong:
        return CheckResult("trick_reason", False, f"{len(wrong)} of {len(TRICKS)} sorted differently from the "
                                                  f"chapter's criterion: " + "; ".join(wrong))
    return CheckResult("trick_reason", True, f"matches the reference: all {len(TRICKS)} tricks sorted as the chapter's "
                                             "criterion sorts them")


EXERCISES = {
    "overflow_point": check_overflow_point,
    "stable_logsumexp": check_stable_logsumexp,
    "layer_norm_rows": check_layer_norm_rows,
    "two_pass_variance": check_two_pass_variance,
    "score_variance": check_score_variance,
    "depth_rms": check_depth_rms,
    "update_effect": check_update_effect,
    "trick_reason": check_trick_reason,
}
