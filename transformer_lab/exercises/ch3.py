"""Chapter 3 (optimization) exercises: automatic checks.

* ``adam_step(param, grad, exp_avg, exp_avg_sq, step, *, lr, betas, eps, weight_decay)`` — one AdamW update
* ``warmup_cosine_lr(step, max_lr, min_lr, warmup, total)`` — the learning-rate schedule
* ``gradient_descent(A, theta0, lr, steps)`` — the iterates of gradient descent on ½ θᵀAθ
* ``inverted_dropout(x, keep, p)`` — dropout with a given keep-mask
"""

from __future__ import annotations

import torch

from transformer_lab.exercises import CheckResult, check_function, generator
from transformer_lab.optim import AdamW, WarmupCosine

D = torch.float64



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
    return check_function("adam_step", fn, _ref_adam_step, cases, atol=1e-12, rtol=1e-9)


# ---------------------------------------------------------------- 2. the schedule
def _ref_warmup_cosine_lr(step, max_lr, min_lr, warmup, total):
    return WarmupCosine(max_lr, min_lr, warmup, total)(step)


def check_warmup_cosine_lr(fn) -> CheckResult:
    """``fn(step, max_lr, min_lr, warmup, total) -> float``: linear warm-up, cosine decay, then the floor."""
    sched = dict(max_lr=1e-3, min_lr=1e-4, warmup=10, total=110)
    cases = [dict(step=s, **sched) for s in (0, 4, 9, 10, 35, 60, 109, 110, 500)]
    cases += [dict(step=s, max_lr=6e-4, min_lr=0.0, warmup=0, total=50) for s in (0, 25, 50)]
    return check_function("warmup_cosine_lr", fn, _ref_warmup_cosine_lr, cases, atol=1e-12, rtol=1e-9,
                          compare=_compare_float)


def _compare_float(got, expected):
    try:
        got = float(got)
    except (TypeError, ValueError):
        return f"should return a number, got {type(got).__name__}"
    if abs(got - expected) > 1e-12 + 1e-9 * abs(expected):
        return f"learning rate {got:.6g}, expected {expected:.6g}"
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
    return check_function("gradient_descent", fn, _ref_gradient_descent, cases, atol=1e-10, rtol=1e-9)


# ---------------------------------------------------------------- 4. inverted dropout
def _ref_inverted_dropout(x, keep, p):
    return x * keep.to(x.dtype) / (1 - p)


def check_inverted_dropout(fn) -> CheckResult:
    """``fn(x, keep (bool, shape of x), p) -> x ⊙ keep / (1 − p)``: expectation-preserving dropout."""
    g = generator(5)
    cases = []
    for shape, p in (((8,), 0.5), ((3, 4), 0.1), ((2, 2, 5), 0.9)):
        cases.append({"x": torch.randn(shape, generator=g, dtype=D),
                      "keep": torch.rand(shape, generator=g) >= p, "p": p})
    return check_function("inverted_dropout", fn, _ref_inverted_dropout, cases, atol=1e-12, rtol=1e-12)


EXERCISES = {"adam_step": check_adam_step, "warmup_cosine_lr": check_warmup_cosine_lr,
             "gradient_descent": check_gradient_descent, "inverted_dropout": check_inverted_dropout}
