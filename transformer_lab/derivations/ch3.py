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
s2 = sp.Symbol("s", positive=True)  # E[g_i²], the second moment of the gradient


@functools.cache
def bias_correction() -> dict[str, sp.Expr]:
    """m_t = Σᵢ (1 − β₁) β₁^{t−i} gᵢ; with E[gᵢ] = g: E[m_t] = (1 − β₁ᵗ) g, so m_t / (1 − β₁ᵗ) is unbiased.
    With E[gᵢ²] = s (the second moment, s = g² + Var gᵢ): E[v_t] = (1 − β₂ᵗ) s."""
    gi = sp.IndexedBase("g")
    unrolled = sp.Sum((1 - beta1) * beta1 ** (t - i) * gi[i], (i, 1, t))  # m_0 = 0, m ← β₁ m + (1 − β₁) g
    expectation = sp.Sum((1 - beta1) * beta1 ** (t - i) * g, (i, 1, t))  # E[g_i] = g for every i
    summed = sp.simplify(expectation.doit())  # geometric series
    corrected = sp.simplify(summed / (1 - beta1**t))
    second = sp.simplify(sp.Sum((1 - beta2) * beta2 ** (t - i) * s2, (i, 1, t)).doit())  # E[v_t], E[g_i²] = s
    return {"unrolled": unrolled, "expectation": expectation, "summed": summed, "factor": sp.factor(summed / g),
            "corrected": corrected, "second_moment": second,
            "second_corrected": sp.simplify(second / (1 - beta2**t)),
            "first_steps": [sp.expand(summed.subs(t, k)) for k in (1, 2, 3)]}


def _m_hat(history: sp.Expr) -> sp.Expr:
    """m̂_t for gradients g_i = history(i): Σᵢ (1 − β₁) β₁^{t−i} g_i / (1 − β₁ᵗ)."""
    return sp.Sum((1 - beta1) * beta1 ** (t - i) * history, (i, 1, t)) / (1 - beta1**t)


def _v_hat(history: sp.Expr) -> sp.Expr:
    """v̂_t for gradients g_i = history(i): Σᵢ (1 − β₂) β₂^{t−i} g_i² / (1 − β₂ᵗ)."""
    return sp.Sum((1 - beta2) * beta2 ** (t - i) * history**2, (i, 1, t)) / (1 - beta2**t)


@functools.cache
def adam_effective_step() -> dict[str, sp.Expr]:
    """The size of Adam's step Δ_t = η m̂_t / (√v̂_t + ε), from the sums m̂_t, v̂_t over a gradient history.

    * a general history g_1 … g_t scaled by c > 0 gives the same step when ε = 0 (scale invariance);
    * a constant gradient g gives m̂ = g, v̂ = g² at every t (the bias correction), so Δ = η g/(|g| + ε);
    * a lone spike (g_i = 0 for i < t) gives η (1 − β₁)/√(1 − β₂) · sign g as t → ∞ (ε = 0);
    * over all histories, |m_t|/√v_t ≤ √(Σᵢ a_i²/b_i) (Cauchy–Schwarz, a_i, b_i the weights of m and v),
      attained by g_i ∝ a_i/b_i (``worst_uncorrected_t``; ``worst_t``, in units of η, is it times the bias
      correction's ``correction`` = √(1 − β₂ᵗ)/(1 − β₁ᵗ)); as t → ∞ that is
      (1 − β₁)/√((1 − β₂)(1 − β₁²/β₂)) when β₁² < β₂ (``worst``); when β₁² ≥ β₂ it grows without bound.
    """
    gr = sp.Symbol("g", real=True, nonzero=True)
    c = sp.Symbol("c", positive=True)
    gi = sp.IndexedBase("g", real=True)
    general = eta * _m_hat(gi[i]) / sp.sqrt(_v_hat(gi[i]))  # ε = 0, any history
    scaled = eta * _m_hat(c * gi[i]) / sp.sqrt(_v_hat(c * gi[i]))
    m_const, v_const = sp.simplify(_m_hat(gr).doit()), sp.simplify(_v_hat(gr).doit())  # constant history
    steady = sp.simplify(eta * m_const / (sp.sqrt(v_const) + eps))
    lone = gr * sp.KroneckerDelta(i, t)  # zero before step t
    spike_t = sp.simplify(eta * _m_hat(lone).doit() / sp.sqrt(_v_hat(lone).doit()))
    spike = sp.simplify(spike_t.subs({beta1**t: 0, beta2**t: 0}))  # t → ∞: β^t → 0 for 0 < β < 1
    j, r = sp.Symbol("j", integer=True, nonnegative=True), sp.Symbol("r", positive=True)  # r = β₁²/β₂
    weights = sp.Sum((1 - beta1) ** 2 / (1 - beta2) * r**j, (j, 0, t - 1)).doit()  # Σ a_i²/b_i, j = t − i
    generic = sp.piecewise_fold(weights).args[-1][0]  # the branch r ≠ 1
    worst_sq = sp.factor(generic.subs(r**t, 0))  # t → ∞ for 0 < r < 1
    correction = sp.sqrt(1 - beta2**t) / (1 - beta1**t)  # m̂/√v̂ = (m/√v) · this
    worst_t = sp.sqrt(weights) * correction  # η m̂/√v̂ on the worst history, finite t
    default = {beta1: sp.Rational(9, 10), beta2: sp.Rational(999, 1000)}
    return {"general": general, "scale_invariant": sp.simplify(sp.factor_terms(scaled) - general),
            "m_const": m_const, "v_const": v_const, "steady": steady,
            "first_step": steady, "first_step_eps0": sp.simplify(steady.subs(eps, 0)),
            "spike_t": spike_t, "spike": spike, "spike_default": spike.subs(default),
            "worst_sum": weights, "worst_t": worst_t.subs(r, beta1**2 / beta2),
            "worst_uncorrected_t": sp.sqrt(weights).subs(r, beta1**2 / beta2), "correction": correction,
            "worst": sp.sqrt(worst_sq).subs(r, beta1**2 / beta2),
            "worst_default": sp.sqrt(worst_sq.subs(r, beta1**2 / beta2).subs(default))}


@functools.cache
def momentum_sums() -> dict[str, sp.Expr]:
    """Heavy-ball velocity u_{k+1} = β u_k + g_k from u_0 = 0: a constant gradient g gives g (1 − βᵏ)/(1 − β)
    → g/(1 − β); an alternating one g_k = (−1)ᵏ g gives (−1)^{k+1} g (1 − (−β)ᵏ)/(1 + β): (−1)^{k+1} u_k → g/(1 + β)."""
    beta = sp.Symbol("beta", positive=True)
    gr = sp.Symbol("g", real=True, nonzero=True)
    k = sp.Symbol("k", integer=True, nonnegative=True)
    y = sp.Function("u")
    const = sp.simplify(sp.rsolve(y(k + 1) - beta * y(k) - gr, y(k), {y(0): 0}))
    alt = sp.simplify(sp.rsolve(y(k + 1) - beta * y(k) - (-1) ** k * gr, y(k), {y(0): 0}))
    return {"beta": beta, "g": gr, "k": k, "constant": const, "alternating": alt,
            "constant_limit": sp.simplify(const.subs(beta**k, 0)),
            "alternating_size": sp.simplify(sp.expand(alt * (-1) ** (k + 1)).subs(beta**k, 0))}


@functools.cache
def heavy_ball_quadratic() -> dict[str, object]:
    """Heavy ball on ½ a θ²: θ_{k+1} = θ_k − η(β u_k + aθ_k) is θ_{k+1} = (1 + β − ηa) θ_k − β θ_{k−1}; its
    characteristic roots r satisfy r² − (1 + β − ηa) r + β = 0, their product is β (Vieta), so complex roots
    (under-damped: the iterates oscillate) have |r| = √β; they are complex iff (1 − √β)² < ηa < (1 + √β)²."""
    beta = sp.Symbol("beta", positive=True)
    a, x, r = sp.Symbol("a", positive=True), sp.Symbol("x", positive=True), sp.Symbol("r")  # x = ηa
    poly = r**2 - (1 + beta - x) * r + beta
    roots = sp.solve(poly, r)
    disc = sp.discriminant(poly, r)  # a monic quadratic in x: negative strictly between its two roots
    lo, hi = sorted(sp.solve(disc, x), key=lambda e: e.subs(beta, sp.Rational(1, 2)))
    return {"beta": beta, "a": a, "x": x, "poly": poly.subs(x, eta * a), "roots": roots,
            "product": sp.simplify(roots[0] * roots[1]), "discriminant": disc, "underdamped": sp.Interval.open(lo, hi)}


@functools.cache
def descent_lemma() -> dict[str, sp.Expr]:
    """L-smooth loss (‖∇L(x) − ∇L(y)‖ ≤ L‖x − y‖): L(y) ≤ L(x) + ∇L(x)ᵀ(y − x) + (L/2)‖y − x‖², the remainder
    being ∫₀¹ (∇L(x + τd) − ∇L(x))ᵀd dτ ≤ ∫₀¹ Lτ‖d‖² dτ; at y = x − η∇L(x) the bound is
    L(x) − η(1 − Lη/2)‖∇L(x)‖², a decrease for every 0 < η < 2/L, largest at η = 1/L (``best``: the root of its
    η-derivative; ``curvature`` = −LG < 0, so a maximum)."""
    lip, tau, d, grad_sq = sp.symbols("L tau d G", positive=True)  # d = ‖y − x‖, G = ‖∇L(x)‖²
    loss = sp.Symbol(r"\mathcal{L}(x)", positive=True)  # the loss at x, printed as such (L is the constant)
    remainder = sp.integrate(lip * tau * d**2, (tau, 0, 1))  # ≤ this
    bound = loss - eta * grad_sq + remainder.subs(d, eta * sp.sqrt(grad_sq))  # ∇Lᵀ(y − x) = −η G, ‖y − x‖ = η√G
    decrease = sp.factor(sp.expand(loss - bound))
    return {"L": lip, "G": grad_sq, "loss": loss, "remainder": remainder, "bound": sp.expand(bound), "decrease": decrease,
            "descends": sp.solve_univariate_inequality(decrease / grad_sq > 0, eta, relational=False),
            "best": sp.solve(sp.diff(decrease, eta), eta), "curvature": sp.diff(decrease, eta, 2)}


@functools.cache
def sgd_noise_quadratic() -> dict[str, sp.Expr]:
    """SGD on ½ a θ² with gradient aθ + ξ, E ξ = 0, Var ξ = σ² (independent steps): θ ← (1 − ηa)θ − ηξ, so the
    stationary variance V solves V = (1 − ηa)² V + η²σ²: V = ησ²/(a(2 − ηa)), increasing in η on (0, 2/a)."""
    a, sigma, V = sp.symbols("a sigma V", positive=True)
    var = sp.solve(sp.Eq(V, (1 - eta * a) ** 2 * V + eta**2 * sigma**2), V)[0]
    return {"a": a, "sigma": sigma, "variance": sp.factor(var), "slope": sp.factor(sp.diff(var, eta))}


@functools.cache
def gradient_flow_quadratic() -> dict[str, object]:
    """L(θ) = ½ a θ² per eigen-direction. Flow dθ/dt = −aθ ⇒ θ(t) = θ₀ e^{−at}; gradient descent
    θ_{k+1} = θ_k − η a θ_k ⇒ θ_k = θ₀ (1 − ηa)^k, i.e. explicit Euler with step η; the factor 1 − ηa is
    negative (the iterates change sign every step) iff η > 1/a, and |1 − ηa| < 1 (convergence) iff η < 2/a."""
    a, theta0 = sp.symbols("a theta_0", positive=True)
    tau = sp.Symbol("t", nonnegative=True)
    k = sp.Symbol("k", integer=True, nonnegative=True)
    theta, y = sp.Function("theta"), sp.Function("y")
    ode = sp.Eq(theta(tau).diff(tau), -sp.diff(a * theta(tau) ** 2 / 2, theta(tau)))
    flow = sp.dsolve(ode, theta(tau), ics={theta(0): theta0}).rhs
    recurrence = sp.Eq(y(k + 1), y(k) - eta * a * y(k))
    descent = sp.rsolve(recurrence.lhs - recurrence.rhs, y(k), {y(0): theta0})
    log_factor = sp.series(sp.log(1 - eta * a), eta, 0, 3)  # −ηa − η²a²/2 + O(η³): the O term stays, so "=" holds
    shown = recurrence.subs({y(k + 1): sp.Symbol(r"\theta_{k+1}"), y(k): sp.Symbol("theta_k")})  # θ_k, not y(k)
    return {"a": a, "theta0": theta0, "t": tau, "k": k, "ode": ode, "flow": flow, "recurrence": shown,
            "descent": descent, "flow_at_k": flow.subs(tau, k * eta), "log_factor": log_factor,
            "oscillates": sp.solve_univariate_inequality(1 - eta * a < 0, eta, relational=False),
            "stability": sp.solve_univariate_inequality(sp.Abs(1 - eta * a) < 1, eta, relational=False)}


@functools.cache
def schedule_closed_form() -> dict[str, object]:
    """η(s) of WarmupCosine as a SymPy Piecewise on integer steps s. The ramp gives η_max at s = w − 1, the
    cosine η_max at s = w (the peak is held two steps); the ramp's formula at s = w would give η_max(1 + 1/w), so
    as a function of a real s the schedule jumps at w. The cosine is flat (η′ = 0) at both of its ends and its
    mean over [w, N_steps] is (max + min)/2, N_steps the total number of steps."""
    s = sp.Symbol("s", nonnegative=True)
    lr_max, lr_min = sp.symbols("eta_max eta_min", positive=True)
    w, n = sp.symbols("w N_\\text{steps}", positive=True)  # warm-up and total steps (S and T mean other things)
    ramp = lr_max * (s + 1) / w
    cosine = lr_min + (lr_max - lr_min) * (1 + sp.cos(sp.pi * (s - w) / (n - w))) / 2
    lr = sp.Piecewise((ramp, s < w), (cosine, s <= n), (lr_min, True))
    return {"s": s, "max": lr_max, "min": lr_min, "warmup": w, "total": n, "lr": lr, "cosine": cosine,
            "ramp": ramp, "ramp_last": sp.simplify(ramp.subs(s, w - 1)), "ramp_at_w": sp.simplify(ramp.subs(s, w)),
            "at_warmup": sp.simplify(cosine.subs(s, w)), "at_total": sp.simplify(cosine.subs(s, n)),
            "slope_at_ends": [sp.simplify(sp.diff(cosine, s).subs(s, v)) for v in (w, n)],
            "mean": sp.simplify(sp.integrate(cosine, (s, w, n)) / (n - w))}


def worst_step(steps: int, b1: float = 0.9, b2: float = 0.999) -> float:
    """SymPy's largest |step|/η after ``steps`` steps (ε = 0), over all histories: ``worst_t`` evaluated."""
    st = adam_effective_step()
    return float(st["worst_t"].subs({beta1: b1, beta2: b2, t: steps}).evalf(30))


def worst_parts(steps: int, b1: float = 0.9, b2: float = 0.999) -> tuple[float, float]:
    """(max over histories of the uncorrected |m_t|/√v_t, the bias correction √(1 − β₂ᵗ)/(1 − β₁ᵗ)) at t = ``steps``;
    their product is :func:`worst_step`."""
    st, at = adam_effective_step(), {beta1: b1, beta2: b2, t: steps}
    return float(st["worst_uncorrected_t"].subs(at).evalf(30)), float(st["correction"].subs(at).evalf(30))


def worst_history_step(steps: int, b1: float = 0.9, b2: float = 0.999, growing: int | None = None) -> float:
    """Our AdamW's last |step|/η (lr = 1, ε ≈ 0) on the maximizing history g_i = (β₁/β₂)^{steps − i}, or, with
    ``growing``, on that history with every gradient before the last ``growing`` steps set to 0."""
    from transformer_lab.optim import AdamW

    first = 1 if growing is None else steps - growing + 1  # g_i = 0 for i < first
    p = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = AdamW([p], lr=1.0, betas=(b1, b2), eps=1e-300, weight_decay=0.0)
    for k in range(1, steps + 1):
        before = p.detach().clone()
        p.grad = torch.full((1,), (b1 / b2) ** (steps - k) if k >= first else 0.0, dtype=torch.float64)
        opt.step()
    return float(before - p.detach())


def check(seed: int = 0) -> dict[str, float]:
    """Largest |difference| between SymPy (lambdified), ours, the torch references and direct computations
    (recursions, eigenvalues, a numerically summed series), float64."""
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

    # the history that maximizes Adam's step (Cauchy–Schwarz): g_i ∝ a_i/b_i ∝ (β₁/β₂)^{t−i}; an instance, t = 60
    steps = 60
    out["largest step (t = 60): sympy vs ours"] = abs(worst_history_step(steps) - worst_step(steps))

    ms = momentum_sums()  # the closed forms against the recursion u ← βu + g_k, 50 steps
    const, alt = (sp.lambdify([ms["beta"], ms["g"], ms["k"]], ms[key]) for key in ("constant", "alternating"))
    worst_ms = 0.0
    for beta in (0.5, 0.9, 0.99):
        u_c = u_a = 0.0
        for k in range(1, 51):
            u_c, u_a = beta * u_c + 0.7, beta * u_a + (-1) ** (k - 1) * 0.7  # g_{k−1} = g, (−1)^{k−1} g
            worst_ms = max(worst_ms, abs(const(beta, 0.7, k) - u_c), abs(alt(beta, 0.7, k) - u_a))
    out["momentum sums: sympy vs recursion"] = worst_ms

    hb = heavy_ball_quadratic()  # the roots against the eigenvalues of the heavy-ball map (θ, u) ↦ (θ′, u′)
    roots = sp.lambdify([hb["beta"], hb["x"]], hb["roots"])
    worst_hb = 0.0
    for beta, x in ((0.9, 0.05), (0.9, 1.25), (0.5, 0.05), (0.5, 3.5), (0.0, 0.3)):
        mat = torch.tensor([[1 - x, -beta], [x, beta]], dtype=torch.float64)  # η = 1, a = x: u′ = βu + aθ, θ′ = θ − u′
        eig = sorted(torch.linalg.eigvals(mat).tolist(), key=lambda z: (z.real, z.imag))
        sym = sorted((complex(z) for z in roots(complex(beta), complex(x))), key=lambda z: (z.real, z.imag))
        worst_hb = max(worst_hb, *(abs(u - w) for u, w in zip(eig, sym, strict=True)))
    out["heavy-ball roots: sympy vs eigenvalues"] = worst_hb

    dl = descent_lemma()  # on ½Lθ² the bound is attained: L(x − η∇L) equals it, for every η
    bound_fn = sp.lambdify([dl["loss"], eta, dl["G"], dl["L"]], dl["bound"])
    lip, x0 = 3.0, torch.randn(4, generator=gen, dtype=torch.float64)
    worst_dl = 0.0
    for step_size in (0.1, 0.3, 0.6, 0.9):
        y = x0 - step_size * lip * x0
        exact = 0.5 * lip * float(y @ y)
        worst_dl = max(worst_dl, abs(exact - bound_fn(0.5 * lip * float(x0 @ x0), step_size, lip**2 * float(x0 @ x0),
                                                      lip)))
    out["descent lemma on ½Lθ² (attained): sympy vs exact"] = worst_dl

    nq = sgd_noise_quadratic()  # V against the variance of θ = −η Σ_j (1 − ηa)^j ξ_j, summed numerically
    var_fn = sp.lambdify([nq["a"], nq["sigma"], eta], nq["variance"])
    worst_v = 0.0
    for a_, sigma_, step_size in ((1.0, 1.0, 0.1), (25.0, 0.5, 0.05), (4.0, 2.0, 0.4)):
        series = step_size**2 * sigma_**2 * sum((1 - step_size * a_) ** (2 * j) for j in range(20000))
        worst_v = max(worst_v, abs(series - var_fn(a_, sigma_, step_size)))
    out["SGD stationary variance: sympy vs series"] = worst_v

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

    second = sp.lambdify([beta2, t, s2], bias_correction()["second_moment"])  # E[v_t] against its recursion
    worst_v2 = 0.0
    for b2_, s_ in ((0.999, 0.3), (0.95, 2.0)):
        v = 0.0
        for step in range(1, 201):
            v = b2_ * v + (1 - b2_) * s_  # E[v_t] = β₂ E[v_{t−1}] + (1 − β₂) s
            worst_v2 = max(worst_v2, abs(second(b2_, step, s_) - v))
    out["E[v_t]: sympy vs recursion"] = worst_v2

    st = adam_effective_step()
    gr = sp.Symbol("g", real=True, nonzero=True)
    spike = sp.lambdify([beta1, beta2, t, eta, gr], st["spike_t"])
    history = torch.randn(40, generator=gen, dtype=torch.float64)
    worst_spike = worst_scale = 0.0
    for steps in (1, 5, 40):  # a lone spike at the last step, and a random history scaled by c = 1000
        last = {}
        for name, grads in (("spike", [0.0] * (steps - 1) + [0.5]), ("plain", history[:steps].tolist()),
                            ("scaled", (1000 * history[:steps]).tolist())):
            p = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
            opt = AdamW([p], lr=1.0, betas=(0.9, 0.999), eps=1e-300, weight_decay=0.0)
            for k in range(steps):
                before = p.detach().clone()
                p.grad = torch.full((1,), grads[k], dtype=torch.float64)
                opt.step()
            last[name] = float(before - p.detach())
        worst_spike = max(worst_spike, abs(last["spike"] - spike(0.9, 0.999, steps, 1.0, 0.5)))
        worst_scale = max(worst_scale, abs(last["scaled"] - last["plain"]))
    out["lone spike: sympy vs ours"] = worst_spike
    out["scale invariance: ours on g and 1000 g"] = worst_scale
    return out
