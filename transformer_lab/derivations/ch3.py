"""Chapter 3 (optimization): Adam's bias correction, its step size, gradient flow, the schedule, with SymPy.

Each function returns a dict of named SymPy expressions (cached: treat it as read-only), the steps a textbook
does by hand, ending in the form :mod:`transformer_lab.optim` implements. :func:`check` lambdifies them and
compares with our AdamW and WarmupCosine and with the PyTorch references.
"""

from __future__ import annotations

import functools
import warnings

import sympy as sp
import torch

beta1, beta2, g, eta, eps = sp.symbols("beta_1 beta_2 g eta epsilon", positive=True)
t, i = sp.symbols("t i", integer=True, positive=True)


@functools.cache
def bias_correction() -> dict[str, sp.Expr]:
    """m_t = Σᵢ (1 − β₁) β₁^{t−i} gᵢ; with E[gᵢ] = g: E[m_t] = (1 − β₁ᵗ) g, so m_t / (1 − β₁ᵗ) is unbiased."""
    gi = sp.IndexedBase("g")
    unrolled = sp.Sum((1 - beta1) * beta1 ** (t - i) * gi[i], (i, 1, t))  # m_0 = 0, m ← β₁ m + (1 − β₁) g
    expectation = sp.Sum((1 - beta1) * beta1 ** (t - i) * g, (i, 1, t))  # E[g_i] = g for every i
    summed = sp.simplify(expectation.doit())  # geometric series
    corrected = sp.simplify(summed / (1 - beta1**t))
    second = sp.simplify(sp.Sum((1 - beta2) * beta2 ** (t - i) * g**2, (i, 1, t)).doit())  # E[v_t], E[g²]=g²
    return {"unrolled": unrolled, "expectation": expectation, "summed": summed, "factor": sp.factor(summed / g),
            "corrected": corrected, "second_moment": second,
            "first_steps": [sp.expand(summed.subs(t, k)) for k in (1, 2, 3)]}


@functools.cache
def adam_effective_step() -> dict[str, sp.Expr]:
    """The size of Adam's step: at t = 1 it is η g/(|g| + ε) → η sign(g); a lone spike after a long calm gives
    η (1 − β₁)/√(1 − β₂) (Kingma & Ba's bound); a constant gradient gives η g/(|g| + ε) at every step."""
    gr = sp.Symbol("g", real=True, nonzero=True)
    m1, v1 = (1 - beta1) * gr, (1 - beta2) * gr**2  # after one step from zero state
    first = sp.simplify(eta * (m1 / (1 - beta1)) / (sp.sqrt(v1 / (1 - beta2)) + eps))
    c = sp.Symbol("c", positive=True)
    steady = eta * gr / (sp.Abs(gr) + eps)  # m̂ = g, v̂ = g² for a constant gradient
    spike = sp.simplify(eta * m1 / sp.sqrt(v1))  # t large (corrections ≈ 1), ε → 0, m and v from one gradient
    return {"first_step": first, "first_step_eps0": sp.simplify(first.subs(eps, 0)),
            "steady": steady, "scale_invariant": sp.simplify(steady.subs(eps, 0).subs(gr, c * gr) - steady.subs(eps, 0)),
            "spike": spike, "spike_default": spike.subs({beta1: sp.Rational(9, 10), beta2: sp.Rational(999, 1000)})}


@functools.cache
def gradient_flow_quadratic() -> dict[str, object]:
    """L(θ) = ½ a θ² per eigen-direction. Flow dθ/dt = −aθ ⇒ θ(t) = θ₀ e^{−at}; gradient descent
    θ_{k+1} = θ_k − η a θ_k ⇒ θ_k = θ₀ (1 − ηa)^k, i.e. explicit Euler with step η; stable iff η < 2/a."""
    a, theta0 = sp.symbols("a theta_0", positive=True)
    tau = sp.Symbol("t", nonnegative=True)
    k = sp.Symbol("k", integer=True, nonnegative=True)
    theta, y = sp.Function("theta"), sp.Function("y")
    ode = sp.Eq(theta(tau).diff(tau), -sp.diff(a * theta(tau) ** 2 / 2, theta(tau)))
    flow = sp.dsolve(ode, theta(tau), ics={theta(0): theta0}).rhs
    recurrence = sp.Eq(y(k + 1), y(k) - eta * a * y(k))
    descent = sp.rsolve(recurrence.lhs - recurrence.rhs, y(k), {y(0): theta0})
    log_factor = sp.series(sp.log(1 - eta * a), eta, 0, 3).removeO()  # log(1 − ηa) = −ηa − η²a²/2 − …
    return {"a": a, "theta0": theta0, "t": tau, "k": k, "ode": ode, "flow": flow, "recurrence": recurrence,
            "descent": descent, "flow_at_k": flow.subs(tau, k * eta), "log_factor": log_factor,
            "stability": sp.solve_univariate_inequality(sp.Abs(1 - eta * a) < 1, eta, relational=False)}


@functools.cache
def schedule_closed_form() -> dict[str, object]:
    """η(s) of WarmupCosine as a SymPy Piecewise; continuous at the warm-up end, flat (η′ = 0) at both ends of
    the cosine, and its mean over the cosine phase is (max + min)/2."""
    s = sp.Symbol("s", nonnegative=True)
    lr_max, lr_min = sp.symbols("eta_max eta_min", positive=True)
    w, n = sp.symbols("w T", positive=True)
    cosine = lr_min + (lr_max - lr_min) * (1 + sp.cos(sp.pi * (s - w) / (n - w))) / 2
    lr = sp.Piecewise((lr_max * (s + 1) / w, s < w), (cosine, s <= n), (lr_min, True))
    return {"s": s, "max": lr_max, "min": lr_min, "warmup": w, "total": n, "lr": lr, "cosine": cosine,
            "at_warmup": sp.simplify(cosine.subs(s, w)), "at_total": sp.simplify(cosine.subs(s, n)),
            "slope_at_ends": [sp.simplify(sp.diff(cosine, s).subs(s, v)) for v in (w, n)],
            "mean": sp.simplify(sp.integrate(cosine, (s, w, n)) / (n - w))}


def check(seed: int = 0) -> dict[str, float]:
    """Largest |difference| between SymPy (lambdified), ours and the torch reference, float64."""
    from transformer_lab.optim import AdamW, WarmupCosine

    gen = torch.Generator().manual_seed(seed)
    out: dict[str, float] = {}
    b1, b2, lr = 0.8, 0.95, 1e-2
    grad = torch.randn(5, generator=gen, dtype=torch.float64)
    ps = [torch.nn.Parameter(torch.zeros(5, dtype=torch.float64)) for _ in range(2)]
    opts = [AdamW([ps[0]], lr=lr, betas=(b1, b2), weight_decay=0.0),
            torch.optim.AdamW([ps[1]], lr=lr, betas=(b1, b2), weight_decay=0.0)]
    factor = sp.lambdify([beta1, t], bias_correction()["factor"])
    worst_sym = worst_ref = 0.0
    first_step = sp.lambdify([eta, sp.Symbol("g", real=True, nonzero=True), eps],
                             adam_effective_step()["first_step"])
    for step in range(1, 21):
        for p, opt in zip(ps, opts, strict=True):
            p.grad = grad.clone()
            opt.step()
        if step == 1:  # the first step is −η g/(|g| + ε) (param starts at 0)
            sym = torch.tensor([first_step(lr, float(v), 1e-8) for v in grad], dtype=torch.float64)
            out["first step: sympy vs ours"] = (-sym - ps[0].detach()).abs().max().item()
        m_ours, m_ref = opts[0].state[ps[0]]["exp_avg"], opts[1].state[ps[1]]["exp_avg"]
        worst_sym = max(worst_sym, (m_ours - factor(b1, step) * grad).abs().max().item())
        worst_ref = max(worst_ref, (m_ours - m_ref).abs().max().item())
    out["bias correction: sympy vs ours"] = worst_sym
    out["bias correction: ours vs torch"] = worst_ref
    out["adamw params: ours vs torch"] = (ps[0] - ps[1]).abs().max().item()

    d = gradient_flow_quadratic()
    descent = sp.lambdify([d["a"], eta, d["theta0"], d["k"]], d["descent"])
    flow = sp.lambdify([d["a"], d["theta0"], d["t"]], d["flow"])
    A = torch.diag(torch.tensor([1.0, 10.0], dtype=torch.float64))  # ill-conditioned quadratic ½ θᵀAθ
    theta0, step_size = torch.tensor([1.0, 1.0], dtype=torch.float64), 0.05
    theta, worst_gd = theta0.clone(), 0.0
    for k in range(1, 41):
        theta = theta - step_size * (A @ theta)  # θ ← θ − η ∇L, ∇L = Aθ
        sym = torch.tensor([descent(float(a), step_size, 1.0, k) for a in A.diagonal()], dtype=torch.float64)
        worst_gd = max(worst_gd, (theta - sym).abs().max().item())
    out["gradient descent: sympy vs iterates"] = worst_gd
    tt = 0.7
    sym = torch.tensor([flow(float(a), 1.0, tt) for a in A.diagonal()], dtype=torch.float64)
    out["gradient flow: sympy vs matrix_exp"] = (torch.linalg.matrix_exp(-A * tt) @ theta0 - sym).abs().max().item()

    sch = schedule_closed_form()
    lr_fn = sp.lambdify([sch["s"], sch["max"], sch["min"], sch["warmup"], sch["total"]], sch["lr"])
    ours = WarmupCosine(1e-3, 1e-4, 10, 100)
    p = torch.nn.Parameter(torch.zeros(1))
    sgd = torch.optim.SGD([p], lr=1e-3)
    from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR

    with warnings.catch_warnings():  # SequentialLR warns about the scheduler step order on construction
        warnings.simplefilter("ignore")
        ref = SequentialLR(sgd, [LinearLR(sgd, 0.1, 1.0, total_iters=9),
                                 CosineAnnealingLR(sgd, T_max=90, eta_min=1e-4)], milestones=[10])
        worst_sym = worst_ref = 0.0
        for s in range(121):
            worst_sym = max(worst_sym, abs(float(lr_fn(s, 1e-3, 1e-4, 10, 100)) - ours(s)))
            worst_ref = max(worst_ref, abs(sgd.param_groups[0]["lr"] - ours(s)) if s <= 100 else 0.0)
            sgd.step()
            ref.step()
    out["schedule: sympy vs ours"] = worst_sym
    out["schedule: ours vs torch"] = worst_ref
    return out
