"""Chapter 3 (optimization) exercises: automatic checks.

* ``adam_step(param, grad, exp_avg, exp_avg_sq, step, *, lr, betas, eps, weight_decay)`` — one AdamW update
* ``warmup_cosine_lr(step, max_lr, min_lr, warmup, total)`` — the learning-rate schedule
* ``gradient_descent(A, theta0, lr, steps)`` — the iterates of gradient descent on ½ θᵀAθ
* ``heavy_ball(A, theta0, lr, beta, steps)`` — the iterates of heavy-ball momentum on ½ θᵀAθ
* ``inverted_dropout(x, keep, p)`` — dropout with a given keep-mask
* ``dropout(x, p, training, generator)`` — dropout drawing its own mask
* ``expected_dropout_loss(w, X, y, p)`` — a linear model's squared error averaged over dropout masks
* ``sgd_epoch(X, y, w, lr, batch_size, seed)`` — one epoch of mini-batch SGD on least squares
* ``expected_first_moment(beta1, t, g, m0)`` — E[m_t] from any start m₀ (a SymPy derivation)
* ``sgd_step_limit(L, G, sigma2)`` — the descent lemma with a mini-batch gradient (a SymPy derivation)
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import numpy as np
import sympy as sp
import torch

from transformer_lab.exercises import CheckResult, check_expression, check_function, distinct_digits, generator
from transformer_lab.optim import AdamW, WarmupCosine

D = torch.float64


def _check(name: str, fn, reference, cases: list[dict], hints: list[tuple[Callable, str]], **tol) -> CheckResult:
    """:func:`check_function`'s verdict, with a hint appended when ``fn`` equals a known typical mistake
    ``(mistake, hint)`` on every case where ``fn`` returns (agreeing on a few cases by coincidence gives no hint),
    or when it returns float32 numbers."""
    result = check_function(name, fn, reference, cases, **tol)
    if result.passed:
        return result
    for mistake, hint in hints:
        if _same_as(fn, mistake, cases, tol):
            return CheckResult(result.name, False, f"{result.message}. Hint: {hint}")
    failed = re.search(r"on case (\d+):", result.message)
    if failed and _low_precision(fn, reference, cases[int(failed[1]) - 1]):
        return CheckResult(result.name, False, f"{result.message}. Hint: your result is in single precision "
                                               "(float32 rounds at about 1e-7); the inputs are float64: keep them "
                                               "so (torch.zeros(...) and torch.tensor(...) default to float32: pass "
                                               "dtype=torch.float64; avoid .float() and np.float32)")
    return result


def _same_as(fn, mistake, cases: list[dict], tol: dict) -> bool:
    """True when ``fn`` agrees with ``mistake`` on every case where ``fn`` returns, and there is at least one."""
    compared = 0
    for case in cases:
        try:
            r = check_function("hint", fn, mistake, [case], **tol)
        except Exception:  # the mistake itself fails on this case; fn did not
            return False
        if not r.passed and not r.message.startswith("raised"):
            return False
        compared += r.passed
    return compared > 0


def _low_precision(fn, reference, case: dict) -> bool:
    """Whether ``fn`` returns (among its outputs) a float32/float16 tensor or NumPy number for ``case``."""
    seen = []
    check_function("dtype", fn, reference, [case], compare=lambda got, expected: seen.append(got))
    outs = [o for got in seen for o in (got if isinstance(got, tuple | list) else (got,))]
    return any((isinstance(o, torch.Tensor) and o.dtype in (torch.float32, torch.float16, torch.bfloat16))
               or isinstance(o, np.float32 | np.float16) for o in outs)


# ---------------------------------------------------------------- 1. one AdamW step
def _ref_adam_step(param, grad, exp_avg, exp_avg_sq, step, *, lr, betas, eps, weight_decay):
    p = torch.nn.Parameter(param.clone())
    opt = AdamW([p], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    opt.state[p] = {"step": step - 1, "exp_avg": exp_avg.clone(), "exp_avg_sq": exp_avg_sq.clone()}
    p.grad = grad.clone()
    opt.step()
    return p.detach(), opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"]


def check_adam_step(fn) -> CheckResult:
    """``fn(...) -> (param, exp_avg, exp_avg_sq)`` after step number ``step`` (1 for the first step)."""
    g = generator(3)

    def case(shape, step, scale=1.0, **kw):
        hyper = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1) | kw
        first = step == 1  # the state starts at zero
        return {"param": torch.randn(shape, generator=g, dtype=D),
                "grad": torch.randn(shape, generator=g, dtype=D) * scale,
                "exp_avg": torch.zeros(shape, dtype=D) if first else torch.randn(shape, generator=g, dtype=D) * 0.1,
                "exp_avg_sq": torch.zeros(shape, dtype=D) if first else torch.rand(shape, generator=g, dtype=D) * 0.01,
                "step": step, **hyper}

    cases = [case((5,), 1), case((3, 4), 7), case((2, 3), 2, betas=(0.8, 0.95), weight_decay=0.0),
             case((4,), 1000, scale=1e-3, lr=3e-4)]
    tol = dict(atol=1e-12, rtol=1e-9)
    return _check("adam_step", fn, _ref_adam_step, cases, _ADAM_HINTS, **tol)


def _adam_variant(*, correct="mv", coupled=False, decay_last=False, eps_inside=False, shift=0, hat_state=False,
                  decay_without_lr=False, no_decay=False, eps_on_raw_v=False):
    def step_fn(param, grad, exp_avg, exp_avg_sq, step, *, lr, betas, eps, weight_decay):
        b1, b2 = betas
        step = step + shift  # shift ≠ 0: the bias-correction exponent off by one
        weight_decay = 0.0 if no_decay else weight_decay
        if coupled:  # Adam + L2: the decay goes through the moments
            grad = grad + weight_decay * param
        shrink = 1 - (1 if decay_without_lr else lr) * weight_decay
        decayed = param if coupled or decay_last else param * shrink
        m, v = b1 * exp_avg + (1 - b1) * grad, b2 * exp_avg_sq + (1 - b2) * grad**2
        m_hat = m / (1 - b1**step) if "m" in correct else m
        v_hat = v / (1 - b2**step) if "v" in correct else v
        denom = (v_hat + eps).sqrt() if eps_inside else v_hat.sqrt() + eps
        new = decayed - lr * m_hat / denom
        if eps_on_raw_v:  # Kingma–Ba's "efficient" form: η√(1 − β₂ᵗ)/(1 − β₁ᵗ) · m/(√v + ε)
            new = decayed - lr * math.sqrt(1 - b2**step) / (1 - b1**step) * m / (v.sqrt() + eps)
        new = new * (1 - lr * weight_decay) if decay_last else new
        return (new, m_hat, v_hat) if hat_state else (new, m, v)
    return step_fn


_ADAM_HINTS = [
    (_adam_variant(correct=""), "divide m by (1 − β₁ᵗ) and v by (1 − β₂ᵗ) (bias correction, t = step)"),
    (_adam_variant(correct="m"), "correct v too: v̂ = v/(1 − β₂ᵗ). Correcting only m divides by the tiny √v early on "
                                 "(a first step of about η/√(1 − β₂) ≈ 31.6η for β₂ = 0.999)"),
    (_adam_variant(correct="v"), "correct m too: m̂ = m/(1 − β₁ᵗ)"),
    (_adam_variant(shift=1), "t in the bias correction is `step` itself (1 on the first step), not step + 1"),
    (_adam_variant(shift=-1), "t in the bias correction is `step` itself (1 on the first step), not step − 1"),
    (_adam_variant(coupled=True), "that is Adam with an L2 penalty (λθ added to the gradient); AdamW decays the "
                                  "parameter directly, θ ← θ(1 − ηλ), and keeps the decay out of m and v"),
    (_adam_variant(decay_last=True), "apply the decay θ(1 − ηλ) to the parameter before the Adam update"),
    (_adam_variant(eps_inside=True), "ε is added after the square root: √v̂ + ε, not √(v̂ + ε)"),
    (_adam_variant(hat_state=True), "return the raw averages m, v (the state the next step starts from), not the "
                                    "bias-corrected m̂, v̂"),
    (_adam_variant(decay_without_lr=True), "the decoupled decay is θ(1 − ηλ): λ is multiplied by the learning rate, "
                                           "not θ(1 − λ)"),
    (_adam_variant(no_decay=True), "weight_decay is ignored: AdamW first shrinks the parameter, θ ← θ(1 − ηλ)"),
    (_adam_variant(eps_on_raw_v=True), "that is Kingma and Ba's \"efficient\" form, η√(1 − β₂ᵗ)/(1 − β₁ᵗ)·m/(√v + ε), "
                                       "which adds ε to √v, not to √v̂; here, as in PyTorch, ε is added to √v̂"),
]


# ---------------------------------------------------------------- 2. the schedule
def _ref_warmup_cosine_lr(step, max_lr, min_lr, warmup, total):
    return WarmupCosine(max_lr, min_lr, warmup, total)(step)


def check_warmup_cosine_lr(fn) -> CheckResult:
    """``fn(step, max_lr, min_lr, warmup, total) -> float``: linear warm-up, cosine decay, then the floor."""
    sched = dict(max_lr=1e-3, min_lr=1e-4, warmup=10, total=110)
    cases = [dict(step=s, **sched) for s in (0, 4, 9, 10, 35, 60, 109, 110, 500)]
    cases += [dict(step=s, max_lr=6e-4, min_lr=0.0, warmup=0, total=50) for s in (0, 25, 50)]
    tol = dict(atol=1e-12, rtol=1e-9, compare=_compare_float)
    return _check("warmup_cosine_lr", fn, _ref_warmup_cosine_lr, cases, _SCHEDULE_HINTS, **tol)


def _cosine(step, max_lr, min_lr, warmup, total, *, span=None, one_plus=True):
    progress = (step - warmup) / (span if span is not None else total - warmup)
    c = math.cos(math.pi * min(progress, 1.0))
    return min_lr + (max_lr - min_lr) * ((1 + c) / 2 if one_plus else c)


_SCHEDULE_HINTS = [
    (lambda step, max_lr, min_lr, warmup, total: max_lr * step / warmup if step < warmup
     else _cosine(step, max_lr, min_lr, warmup, total),
     "the warm-up is max_lr·(step + 1)/warmup, so that step 0 is not wasted at learning rate 0"),
    (lambda step, max_lr, min_lr, warmup, total: max_lr * (step + 1) / warmup if step < warmup
     else _cosine(step, max_lr, min_lr, warmup, total, span=total),
     "the cosine's progress is (step − warmup)/(total − warmup), which runs from 0 to 1 over the decay"),
    (lambda step, max_lr, min_lr, warmup, total: max_lr * (step + 1) / warmup if step < warmup
     else _cosine(step, max_lr, min_lr, warmup, total, one_plus=False),
     "the cosine factor is ½(1 + cos(π·progress)), which goes from 1 to 0, not cos(π·progress)"),
    (lambda step, max_lr, min_lr, warmup, total: max_lr * (step + 1) / warmup if step < warmup
     else _cosine(step, max_lr, 0.0, warmup, total),
     "the cosine decays to min_lr, not to 0"),
    (lambda step, max_lr, min_lr, warmup, total: max_lr * (step + 1) / warmup if step < warmup
     else min_lr + _cosine(step, max_lr, 0.0, warmup, total) if step <= total else min_lr,
     "the cosine spans max_lr − min_lr: min_lr + ½(max_lr − min_lr)(1 + cos(π·progress)), which starts at max_lr"),
    (lambda step, max_lr, min_lr, warmup, total: max_lr * (step + 1) / warmup if step <= warmup and warmup
     else _cosine(step, max_lr, min_lr, warmup, total),
     "the ramp covers steps 0, …, warmup − 1 (step < warmup) and reaches max_lr at warmup − 1; at step = warmup "
     "the cosine starts from max_lr"),
    (lambda step, max_lr, min_lr, warmup, total: max_lr * (step + 1) / warmup if step < warmup
     else min_lr + (max_lr - min_lr) * (1 + math.cos(math.pi * (step - warmup) / (total - warmup))) / 2,
     "stay at min_lr after step total: the cosine must not keep going (and climb back) past the end"),
]


def _compare_float(got, expected):
    try:
        got = float(got)
    except (TypeError, ValueError):
        return f"should return a number, got {type(got).__name__}"
    if abs(got - expected) > 1e-12 + 1e-9 * abs(expected):
        shown_got, shown_expected = distinct_digits(got, expected)
        return f"learning rate {shown_got}, expected {shown_expected}"
    return None


# ---------------------------------------------------------------- 3. gradient descent = Euler steps of the flow
def _ref_gradient_descent(A, theta0, lr, steps):
    out = [theta0]
    for _ in range(steps):
        out.append(out[-1] - lr * (A @ out[-1]))  # θ_{k+1} = θ_k − η ∇L(θ_k), ∇L = Aθ for symmetric A
    return torch.stack(out)


def check_gradient_descent(fn) -> CheckResult:
    """``fn(A (d, d) symmetric, theta0 (d,), lr, steps) -> (steps + 1, d)``: θ₀, θ₁, …, θ_steps."""
    g = generator(4)
    M = torch.randn(3, 3, generator=g, dtype=D)
    cases = [{"A": torch.diag(torch.tensor([1.0, 10.0], dtype=D)), "theta0": torch.tensor([1.0, 1.0], dtype=D),
              "lr": 0.05, "steps": 20},
             {"A": M @ M.T + torch.eye(3, dtype=D), "theta0": torch.randn(3, generator=g, dtype=D), "lr": 0.02,
              "steps": 15},
             {"A": torch.tensor([[2.0]], dtype=D), "theta0": torch.tensor([3.0], dtype=D), "lr": 1.1, "steps": 5}]
    tol = dict(atol=1e-10, rtol=1e-9)
    hints = [(lambda A, theta0, lr, steps: _ref_gradient_descent(A, theta0, 2 * lr, steps),
              "the gradient of ½ θᵀAθ is Aθ (symmetric A), not 2Aθ"),
             (lambda A, theta0, lr, steps: _ref_gradient_descent(A, theta0, -lr, steps),
              "step against the gradient: θ − η∇L, not θ + η∇L"),
             (lambda A, theta0, lr, steps: _aliased(_ref_gradient_descent(A, theta0, lr, steps + 1), skip=1),
              _ALIAS_HINT),
             (lambda A, theta0, lr, steps: _aliased(_ref_gradient_descent(A, theta0, lr, steps), skip=0),
              _ALIAS_HINT)]
    return _check("gradient_descent", fn, _ref_gradient_descent, cases, hints, **tol)


def _aliased(rows: torch.Tensor, *, skip: int) -> torch.Tensor:
    """What stacking one tensor changed in place gives: ``rows[-1]`` in every row (``skip=1``: one row fewer) or in
    every row but the first (``skip=0``)."""
    out = rows[: len(rows) - skip].clone()
    out[1 - skip:] = rows[-1]
    return out


_ALIAS_HINT = ("the rows repeat one value: you appended the same tensor each step and changed it in place "
               "(θ -= …); make a new tensor each step (θ = θ − …) or append θ.clone()")


# ---------------------------------------------------------------- 4. heavy-ball momentum
def _ref_heavy_ball(A, theta0, lr, beta, steps):
    out, v = [theta0], torch.zeros_like(theta0)
    for _ in range(steps):
        v = beta * v + A @ out[-1]  # v_{k+1} = β v_k + ∇L(θ_k), v_0 = 0
        out.append(out[-1] - lr * v)  # θ_{k+1} = θ_k − η v_{k+1}
    return torch.stack(out)


def _heavy_ball_variant(*, ema=False, stale=False, nesterov=False, scaled=False):
    def run(A, theta0, lr, beta, steps):
        out, v = [theta0], torch.zeros_like(theta0)
        for _ in range(steps):
            theta = out[-1]
            g = A @ (theta - lr * beta * v) if nesterov else A @ theta
            new_v = beta * v + (1 - beta) * g if ema else beta * (v + g) if scaled else beta * v + g
            out.append(theta - lr * (v if stale else new_v))
            v = new_v
        return torch.stack(out)
    return run


def check_heavy_ball(fn) -> CheckResult:
    """``fn(A (d, d) symmetric, theta0 (d,), lr, beta, steps) -> (steps + 1, d)``: θ₀, θ₁, …, θ_steps of
    v ← βv + Aθ, θ ← θ − ηv from v = 0."""
    g = generator(6)
    M = torch.randn(3, 3, generator=g, dtype=D)
    cases = [{"A": torch.diag(torch.tensor([1.0, 25.0], dtype=D)), "theta0": torch.tensor([-2.2, 0.8], dtype=D),
              "lr": 0.05, "beta": 0.9, "steps": 30},
             {"A": M @ M.T + torch.eye(3, dtype=D), "theta0": torch.randn(3, generator=g, dtype=D), "lr": 0.02,
              "beta": 0.5, "steps": 15},
             {"A": torch.tensor([[2.0]], dtype=D), "theta0": torch.tensor([3.0], dtype=D), "lr": 0.3, "beta": 0.0,
              "steps": 4}]
    tol = dict(atol=1e-10, rtol=1e-9)
    hints = [(_heavy_ball_variant(ema=True), "heavy ball sums the gradients, v ← βv + g; v ← βv + (1 − β)g is an "
                                             "average (Adam's m), a step (1 − β) times shorter"),
             (_heavy_ball_variant(stale=True), "update v first, then step with the new v: θ ← θ − η(βv + g)"),
             (_heavy_ball_variant(nesterov=True), "that is Nesterov's momentum (gradient at the look-ahead point); "
                                                  "heavy ball takes the gradient at θ_k"),
             (_heavy_ball_variant(scaled=True), "the new gradient enters unscaled: v ← βv + g, not β(v + g)"),
             (_ref_gradient_descent_beta, "β is ignored: that is plain gradient descent"),
             (lambda A, theta0, lr, beta, steps: _aliased(_ref_heavy_ball(A, theta0, lr, beta, steps + 1), skip=1),
              _ALIAS_HINT),
             (lambda A, theta0, lr, beta, steps: _aliased(_ref_heavy_ball(A, theta0, lr, beta, steps), skip=0),
              _ALIAS_HINT)]
    return _check("heavy_ball", fn, _ref_heavy_ball, cases, hints, **tol)


def _ref_gradient_descent_beta(A, theta0, lr, beta, steps):
    return _ref_gradient_descent(A, theta0, lr, steps)


# ---------------------------------------------------------------- 5. inverted dropout
def _ref_inverted_dropout(x, keep, p):
    return x * keep.to(x.dtype) / (1 - p)


def check_inverted_dropout(fn) -> CheckResult:
    """``fn(x, keep (bool, shape of x), p) -> x ⊙ keep / (1 − p)``: expectation-preserving dropout."""
    g = generator(5)
    cases = []
    for shape, p in (((8,), 0.5), ((3, 4), 0.1), ((2, 2, 5), 0.9)):
        cases.append({"x": torch.randn(shape, generator=g, dtype=D),
                      "keep": torch.rand(shape, generator=g) >= p, "p": p})
    tol = dict(atol=1e-12, rtol=1e-12)
    hints = [(lambda x, keep, p: x * keep, "scale the kept entries by 1/(1 − p), so that E[output] = x"),
             (lambda x, keep, p: x * keep / p, "divide by the probability of keeping, 1 − p, not by p"),
             (lambda x, keep, p: x * ~keep / (1 - p), "keep = True marks the entries that survive"),
             (lambda x, keep, p: x * keep * (1 - p), "multiplying by 1 − p is the original dropout's scaling at test "
                                                     "time; inverted dropout divides the kept entries by 1 − p "
                                                     "during training instead")]
    return _check("inverted_dropout", fn, _ref_inverted_dropout, cases, hints, **tol)


# ---------------------------------------------------------------- 5a. dropout that draws its own mask
def _dropped(fn, x, p, training, seed) -> torch.Tensor:
    out = fn(x.clone(), p, training, generator(seed))
    if not isinstance(out, torch.Tensor) or out.shape != x.shape:
        raise _Verdict(f"expected a tensor of the shape of x, {tuple(x.shape)}, got "
                       f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}")
    return out


class _Verdict(Exception):
    """A failed dropout check, with the message a student can act on."""


def _within(value: float, expected: float, n: int) -> bool:
    """``value``, a frequency over ``n`` independent draws, within 6 standard deviations of its ``expected`` value."""
    return abs(value - expected) <= 6 * math.sqrt(expected * (1 - expected) / n) + 1e-12


def _dropout_verdict(fn) -> None:
    """Raise :class:`_Verdict` at the first property of inverted dropout that ``fn`` lacks."""
    g = generator(17)
    x = torch.rand(400, 250, generator=g, dtype=D) + 1  # entries in [1, 2): the kept ones are x/(1 − p)
    if not torch.equal(_dropped(fn, x, 0.5, False, 1), x):
        raise _Verdict("in evaluation (training=False) dropout must return x unchanged: inverted dropout already "
                       "rescaled during training, so nothing is dropped or scaled at test time")
    p = 0.3
    out = _dropped(fn, x, p, True, 2)
    if not torch.isfinite(out).all():
        raise _Verdict("the output holds NaN or inf")
    kept, ratio = out != 0, (out / x)[out != 0]
    if kept.any() and not torch.allclose(ratio, torch.full_like(ratio, 1 / (1 - p)), rtol=1e-9, atol=0):
        scale = ratio.median().item()
        why = {1.0: "scale the kept entries by 1/(1 − p), so that E[output] = x",
               1 / p: "divide by the probability of keeping, 1 − p, not by p",
               1 - p: "multiplying by 1 − p is the original dropout's test-time scaling; inverted dropout divides "
                      "the kept entries by 1 − p during training"}
        hint = next((h for k, h in why.items() if abs(scale - k) < 1e-9), "")
        raise _Verdict(f"a kept entry should be x/(1 − p) = {1 / (1 - p):.4g} x at p = {p}, got {scale:.4g} x"
                       + (f". Hint: {hint}" if hint else ""))
    shared = {"row": (kept == kept[:1]).all(), "column": (kept == kept[:, :1]).all()}
    if shared["row"] or shared["column"]:
        raise _Verdict(f"every {'row' if shared['row'] else 'column'} of the mask is the same. Hint: draw one mask "
                       "entry for every entry of x, torch.rand(x.shape, ...), "
                       + ("not one mask for the whole batch" if shared["row"] else "not one for each row"))
    n, dropped = x.numel(), 1 - kept.double().mean().item()
    if not _within(dropped, p, n):
        hint = (". Hint: p is the probability of dropping an entry; you drop with probability 1 − p"
                if _within(dropped, 1 - p, n) else "")
        raise _Verdict(f"at p = {p} about {p:.0%} of the entries should be dropped, got {dropped:.1%} of {n}{hint}")
    agree = p**2 + (1 - p) ** 2  # two independent entries are both dropped or both kept
    for what, a, b in (("row", kept[1:], kept[:-1]), ("column", kept[:, 1:], kept[:, :-1])):
        if not _within((a == b).double().mean().item(), agree, a.numel()):
            raise _Verdict(f"the mask is not independent from {what} to {what}: neighbouring {what}s agree "
                           f"{(a == b).double().mean().item():.1%} of the time, where independent draws agree "
                           f"p² + (1 − p)² = {agree:.0%}")
    if not torch.equal(_dropped(fn, x, p, True, 2), out):
        raise _Verdict("the same seed gave a different mask. Hint: draw the mask from the `generator` passed in "
                       "(e.g. `torch.rand(x.shape, generator=generator)`), so that a seeded run repeats; "
                       "F.dropout and nn.Dropout draw from PyTorch's global generator")
    other = _dropped(fn, x, p, True, 3) != 0
    if not _within((other == kept).double().mean().item(), agree, n):
        raise _Verdict("another seed gave the same mask: draw the mask from the `generator` passed in, not from a "
                       "generator of your own with a fixed seed (each training step needs a fresh mask)")
    copy = x.clone()
    fn(copy, p, True, generator(4))
    if not torch.equal(copy, x):
        raise _Verdict("x was changed in place: return a new tensor")
    if not torch.equal(_dropped(fn, x, 0.0, True, 5), x):
        raise _Verdict("at p = 0 nothing is dropped: the output must equal x")
    if not torch.equal(_dropped(fn, x, 1.0, True, 6), torch.zeros_like(x)):
        raise _Verdict("at p = 1 every entry is dropped: the output must be zeros. Hint: x · 0/(1 − p) is 0/0 = NaN "
                       "at p = 1; select instead of multiplying, or treat p = 1 apart")
    low, p = (torch.rand(400, 250, generator=g) + 1).to(torch.bfloat16), 0.999
    kept_low = (_dropped(fn, low, p, True, 8) != 0).double().mean().item()
    if not _within(kept_low, 1 - p, low.numel()):
        raise _Verdict(f"for a bfloat16 x at p = {p}, about {1 - p:.1%} of the entries should be kept, got "
                       f"{kept_low:.2%}. Hint: draw the random numbers in float32 or wider: bfloat16 has no number "
                       "between 0.996 and 1, so `torch.rand(..., dtype=torch.bfloat16) >= 0.999` keeps nothing")
    small = torch.rand(3, 4, 5, generator=g, dtype=D) + 1
    if _dropped(fn, small, 0.5, True, 7).shape != small.shape:
        raise _Verdict("a three-dimensional x must give an output of its shape")


def check_dropout(fn) -> CheckResult:
    """``fn(x, p, training, generator) -> tensor``: inverted dropout drawing its own mask from ``generator``: each
    entry kept independently with probability 1 − p and divided by 1 − p in training, zeros at p = 1; ``x``
    unchanged in evaluation, for a bfloat16 ``x`` too. Any way of drawing the mask is right, so it is judged by its
    statistics on
    100,000 entries (frequencies within 6 standard deviations: a right answer fails with probability below 10⁻⁸)."""
    name = "dropout"
    if not callable(fn):
        return CheckResult(name, False, f"expected a function, got {type(fn).__name__}")
    try:
        _dropout_verdict(fn)
    except _Verdict as verdict:
        return CheckResult(name, False, str(verdict))
    except NotImplementedError:
        return CheckResult(name, False, "not written yet: replace `raise NotImplementedError` with your code")
    except Exception as exc:  # a student's bug: report it, do not crash the notebook
        return CheckResult(name, False, f"raised {type(exc).__name__}: {exc}")
    return CheckResult(name, True, "behaves as inverted dropout: the right fraction dropped, kept entries scaled "
                                   "by 1/(1 − p), independent masks from the generator, x itself in evaluation")


# ---------------------------------------------------------------- 5b. dropout's expected loss: a penalty
def _ref_expected_dropout_loss(w, X, y, p):
    """(1/N) Σ_n E_m[(y_n − (m ⊙ x_n)·w)²] = (1/N) Σ_n [(y_n − x_n·w)² + p/(1 − p) Σ_j x_nj² w_j²], since
    E[m_j] = 1 and Var(m_j) = 1/(1 − p) − 1 = p/(1 − p) for independent entries."""
    return ((y - X @ w) ** 2 + p / (1 - p) * (X**2) @ (w**2)).mean()


def _dropout_loss_variant(factor, *, penalty="x2w2", reduce="mean"):
    def variant(w, X, y, p):
        terms = {"x2w2": (X**2) @ (w**2), "w2": (w**2).sum().expand(len(X)), "xw2": (X @ w) ** 2}[penalty]
        loss = (y - X @ w) ** 2 + factor(p) * terms
        return loss.mean() if reduce == "mean" else loss.sum()
    return variant


def check_expected_dropout_loss(fn) -> CheckResult:
    """``fn(w (d,), X (N, d), y (N,), p) -> 0-dim tensor``: the mean over the rows and over inverted-dropout masks
    on the inputs of the squared error of the linear model (m ⊙ x)·w."""
    g = generator(9)
    cases = [{"w": torch.randn(d, generator=g, dtype=D), "X": torch.randn(n, d, generator=g, dtype=D) + shift,
              "y": torch.randn(n, generator=g, dtype=D), "p": p}
             for n, d, p, shift in ((6, 3, 0.5, 0.0), (9, 4, 0.1, 1.0), (1, 5, 0.8, 0.0), (4, 2, 0.0, 0.0),
                                    (7, 3, 0.3, -0.5))]
    v = _dropout_loss_variant
    hints = [(v(lambda p: 0.0), "that is the loss without dropout; over the masks the prediction also varies, and "
                                "E[(y − ŷ)²] = (y − E[ŷ])² + Var(ŷ)"),
             (v(lambda p: p), "Var(m_j) = E[m_j²] − E[m_j]² = 1/(1 − p) − 1 = p/(1 − p), not p"),
             (v(lambda p: p * (1 - p)), "p(1 − p) is the variance of the keep indicator; the mask is that indicator "
                                        "divided by 1 − p, so its variance is p(1 − p)/(1 − p)² = p/(1 − p)"),
             (v(lambda p: (1 - p) / p), "upside down: Var(m_j) = p/(1 − p)"),
             (v(lambda p: p / (1 - p), penalty="w2"), "each weight's penalty is weighted by the square of its "
                                                      "input: Var((m ⊙ x)·w) = Σ_j x_j² w_j² Var(m_j)"),
             (v(lambda p: p / (1 - p), penalty="xw2"), "the mask entries are independent, so the variance of the "
                                                       "sum Σ_j m_j x_j w_j is the sum of the variances, "
                                                       "Σ_j x_j² w_j² Var(m_j), not Var(m)(x·w)²"),
             (v(lambda p: p / (1 - p), reduce="sum"), "average over the N rows, not sum")]
    return _check("expected_dropout_loss", fn, _ref_expected_dropout_loss, cases, hints, atol=1e-12, rtol=1e-12)


# ---------------------------------------------------------------- 6. one epoch of mini-batch SGD
def _ref_sgd_epoch(X, y, w, lr, batch_size, seed):
    order = torch.randperm(len(X), generator=torch.Generator().manual_seed(seed))
    for start in range(0, len(X), batch_size):
        batch = order[start:start + batch_size]  # the last batch holds the N mod b left over
        Xb, yb = X[batch], y[batch]
        w = w - lr * Xb.T @ (Xb @ w - yb) / len(batch)  # g_B = (1/|B|) Σ_{i∈B} xᵢ(xᵢᵀw − yᵢ)
    return w


def _sgd_variant(*, shuffle=True, drop_last=False, divide_by=None, sum_loss=False, frozen=False):
    def run(X, y, w, lr, batch_size, seed):
        order = (torch.randperm(len(X), generator=torch.Generator().manual_seed(seed)) if shuffle
                 else torch.arange(len(X)))
        w0 = w
        for start in range(0, len(X), batch_size):
            batch = order[start:start + batch_size]
            if drop_last and len(batch) < batch_size:
                break
            Xb, yb = X[batch], y[batch]
            at = w0 if frozen else w
            n = 1 if sum_loss else divide_by(len(X), batch_size) if divide_by else len(batch)
            w = w - lr * Xb.T @ (Xb @ at - yb) / n
        return w
    return run


def check_sgd_epoch(fn) -> CheckResult:
    """``fn(X (N, d), y (N,), w (d,), lr, batch_size, seed) -> w (d,)`` after one epoch of mini-batch SGD on
    L(w) = (1/2N) Σᵢ (xᵢᵀw − yᵢ)², batches in the order of ``torch.randperm(N, generator=seeded(seed))``."""
    g = generator(7)
    cases = []
    for n, d, b, lr in ((12, 3, 4, 0.1), (10, 2, 3, 0.05), (7, 4, 7, 0.2), (9, 3, 1, 0.02)):
        cases.append({"X": torch.randn(n, d, generator=g, dtype=D), "y": torch.randn(n, generator=g, dtype=D),
                      "w": torch.randn(d, generator=g, dtype=D), "lr": lr, "batch_size": b, "seed": n})
    tol = dict(atol=1e-12, rtol=1e-10)
    hints = [(_sgd_variant(shuffle=False), "visit the examples in the order of the seeded permutation "
                                            "torch.randperm(N, generator=torch.Generator().manual_seed(seed)), "
                                            "not 0, 1, …, N − 1: SGD's batches are random"),
             (_sgd_variant(drop_last=True), "the last batch holds the N mod b examples left over: keep it, so that "
                                            "one epoch visits every example once"),
             (_sgd_variant(divide_by=lambda n, b: b), "divide the last, smaller batch's gradient by its own size "
                                                      "|B|, not by batch_size"),
             (_sgd_variant(divide_by=lambda n, b: n), "the mini-batch gradient is the mean over the batch, "
                                                      "(1/|B|) Σ_{i∈B}, not divided by N"),
             (_sgd_variant(sum_loss=True), "the mini-batch gradient is the mean over the batch, (1/|B|) Σ_{i∈B}; a "
                                           "sum makes the step |B| times too long and is not an unbiased estimate "
                                           "of ∇L"),
             (_sgd_variant(frozen=True), "each step starts from the w the previous step produced; you took every "
                                         "batch's gradient at the starting w"),
             (lambda X, y, w, lr, batch_size, seed: w - lr * X.T @ (X @ w - y) / len(X),
              "that is one full-batch gradient step; SGD takes one step per mini-batch, N/b steps per epoch")]
    return _check("sgd_epoch", fn, _ref_sgd_epoch, cases, hints, **tol)


# ---------------------------------------------------------------- 7. E[m_t] from any starting state
_BETA1, _T, _G = sp.Symbol("beta_1", positive=True), sp.Symbol("t", integer=True, positive=True), sp.Symbol("g")
_M0 = sp.Symbol("m_0")


def _ref_expected_first_moment(beta1, t, g, m0):
    """m_k = β₁m_{k−1} + (1 − β₁)g_k unrolled from m_0, with E[g_k] = g: β₁ᵗm₀ + Σ_{k=1}^t (1 − β₁)β₁^{t−k} g."""
    k = sp.Symbol("k", integer=True, positive=True)
    return sp.simplify(beta1**t * m0 + sp.summation((1 - beta1) * beta1 ** (t - k) * g, (k, 1, t)))


def check_expected_first_moment(fn) -> CheckResult:
    """``fn(beta1, t, g, m0) -> SymPy expression``: E[m_t] for m_k = β₁m_{k−1} + (1 − β₁)g_k started at m₀,
    when every gradient has mean g."""
    case = {"beta1": _BETA1, "t": _T, "g": _G, "m0": _M0}
    hints = [(lambda b, t, g, m0: (1 - b**t) * g, "the starting state does not vanish: it is multiplied "
                                                      "by β₁ at every step, β₁ᵗm₀ after t steps"),
             (lambda b, t, g, m0: b**t * m0 + g, "the gradients' weights (1 − β₁)β₁^{t−k}, k = 1…t, sum to "
                                                     "1 − β₁ᵗ, not 1: the geometric series has t terms"),
             (lambda b, t, g, m0: b ** (t + 1) * m0 + (1 - b ** (t + 1)) * g,
              "off by one: after t steps the start has been multiplied by β₁ t times (k = 1…t), not t + 1"),
             (lambda b, t, g, m0: b ** (t - 1) * m0 + (1 - b ** (t - 1)) * g,
              "off by one: after t steps the start has been multiplied by β₁ t times (k = 1…t), not t − 1"),
             (lambda b, t, g, m0: b**t * m0 + (1 - b**t) * g / (1 - b),
              "each new gradient enters with weight (1 − β₁): the weights are (1 − β₁)β₁^{t−k}, not β₁^{t−k}"),
             (lambda b, t, g, m0: b**t * m0 + (1 - b) * g,
              "that is only the newest gradient's share; sum all t of them, Σ_k (1 − β₁)β₁^{t−k} g")]
    return check_expression("expected_first_moment", fn, _ref_expected_first_moment, [case], hints=hints)


# ---------------------------------------------------------------- 8. the descent lemma with a noisy gradient
_L, _GG, _S2 = sp.symbols("L G sigma2", positive=True)


def _ref_sgd_step_limit(L, G, sigma2):
    """E[L(θ − ηg_B)] ≤ L(θ) − ηG + (L/2)η²(G + σ²): a guaranteed expected decrease iff 0 < η < 2G/(L(G + σ²))."""
    eta = sp.Symbol("eta", positive=True)
    decrease = eta * G - L / 2 * eta**2 * (G + sigma2)  # L(θ) minus the bound
    (limit,) = sp.solve(sp.cancel(decrease / eta), eta)  # the root other than η = 0
    return limit


def check_sgd_step_limit(fn) -> CheckResult:
    """``fn(L, G, sigma2) -> SymPy expression``: the largest η for which the descent lemma guarantees
    E[L(θ − ηg_B)] < L(θ), with E[g_B] = ∇L(θ), ‖∇L(θ)‖² = G, E‖g_B − ∇L(θ)‖² = σ²."""
    case = {"L": _L, "G": _GG, "sigma2": _S2}
    hints = [(lambda L, G, sigma2: 2 / L, "that is the full-gradient range; with a mini-batch gradient "
                                          "E‖g_B‖² = G + σ² (mean square = squared mean + variance), not G"),
             (lambda L, G, sigma2: 1 / L, "1/L is where the full-gradient guarantee is largest; the question asks "
                                          "where the expected decrease stops being guaranteed"),
             (lambda L, G, sigma2: G / (L * (G + sigma2)), "G/(L(G + σ²)) is the step with the largest guaranteed "
                                                           "decrease (the vertex of the parabola); the limit is "
                                                           "where the decrease reaches 0 again, twice as far"),
             (lambda L, G, sigma2: 2 * G / (L * sigma2), "E‖g_B‖² = G + σ²: the squared mean G stays in the "
                                                          "quadratic term, next to the variance"),
             (lambda L, G, sigma2: 2 / (L * (G + sigma2)), "the linear term is −η∇L(θ)ᵀE[g_B] = −ηG: G appears "
                                                           "in the numerator too"),
             (lambda L, G, sigma2: 2 * (G + sigma2) / (L * G), "upside down: solve ηG = (L/2)η²(G + σ²) for η")]
    return check_expression("sgd_step_limit", fn, _ref_sgd_step_limit, [case], hints=hints)


EXERCISES = {"adam_step": check_adam_step, "warmup_cosine_lr": check_warmup_cosine_lr,
             "gradient_descent": check_gradient_descent, "heavy_ball": check_heavy_ball,
             "inverted_dropout": check_inverted_dropout, "dropout": check_dropout,
             "expected_dropout_loss": check_expected_dropout_loss,
             "sgd_epoch": check_sgd_epoch,
             "expected_first_moment": check_expected_first_moment, "sgd_step_limit": check_sgd_step_limit}
