"""The chapter-3 SymPy derivations close and agree numerically with our AdamW / WarmupCosine and torch's."""

import sympy as sp
import torch

from transformer_lab.derivations import ch3


def test_bias_correction():
    d = ch3.bias_correction()
    assert sp.simplify(d["factor"] - (1 - ch3.beta1**ch3.t)) == 0
    assert d["corrected"] == ch3.g
    assert sp.simplify(d["second_moment"] - ch3.s2 * (1 - ch3.beta2**ch3.t)) == 0  # E[g_i²] = s, not g²
    assert d["second_corrected"] == ch3.s2


def test_effective_step():
    d = ch3.adam_effective_step()
    gr = sp.Symbol("g", real=True, nonzero=True)
    b1, b2 = ch3.beta1, ch3.beta2
    assert d["scale_invariant"] == 0  # on a general history g_1 … g_t, not on plugged values
    assert (d["m_const"], d["v_const"]) == (gr, gr**2)  # derived from the sums, not assumed
    assert sp.simplify(d["first_step_eps0"] - ch3.eta * sp.sign(gr)) == 0
    assert sp.simplify(d["spike"] - ch3.eta * (1 - b1) / sp.sqrt(1 - b2) * sp.sign(gr)) == 0
    assert sp.simplify(d["spike_default"] - sp.sqrt(10) * ch3.eta * sp.sign(gr)) == 0
    assert sp.simplify(d["worst"] ** 2 - (1 - b1) ** 2 / ((1 - b2) * (1 - b1**2 / b2))) == 0
    assert 7.27 < float(d["worst_default"]) < 7.28  # more than the spike's √10 ≈ 3.16: the spike is no bound


def test_momentum_sums():
    d = ch3.momentum_sums()
    beta, g = d["beta"], d["g"]
    assert sp.simplify(d["constant_limit"] - g / (1 - beta)) == 0
    assert sp.simplify(d["alternating_size"] - g / (1 + beta)) == 0  # it does not cancel
    for k in range(6):  # the closed forms equal the recursion, step by step
        v_c = v_a = 0
        for j in range(k):
            v_c, v_a = beta * v_c + g, beta * v_a + (-1) ** j * g
        assert sp.simplify(d["constant"].subs(d["k"], k) - v_c) == 0
        assert sp.simplify(d["alternating"].subs(d["k"], k) - v_a) == 0


def test_heavy_ball_quadratic():
    d = ch3.heavy_ball_quadratic()
    beta, x = d["beta"], d["x"]
    assert d["product"] == beta
    assert sp.simplify(d["underdamped"].start - (1 - sp.sqrt(beta)) ** 2) == 0
    assert sp.simplify(d["underdamped"].end - (1 + sp.sqrt(beta)) ** 2) == 0
    assert sp.expand(d["discriminant"] - (x - d["underdamped"].start) * (x - d["underdamped"].end)) == 0


def test_descent_lemma_and_sgd_noise():
    d = ch3.descent_lemma()
    assert d["descends"] == sp.Interval.open(0, 2 / d["L"])
    assert sp.simplify(d["decrease"] - ch3.eta * (1 - d["L"] * ch3.eta / 2) * d["G"]) == 0
    n = ch3.sgd_noise_quadratic()
    a, sigma = n["a"], n["sigma"]
    assert sp.simplify(n["variance"] - ch3.eta * sigma**2 / (a * (2 - ch3.eta * a))) == 0
    assert sp.simplify(n["slope"] - 2 * sigma**2 / (a * (2 - ch3.eta * a) ** 2)) == 0  # > 0: larger η, more noise


def test_gradient_flow_and_euler():
    d = ch3.gradient_flow_quadratic()
    a, th0, k = d["a"], d["theta0"], d["k"]
    assert sp.simplify(d["flow"] - th0 * sp.exp(-a * d["t"])) == 0
    assert sp.simplify(d["descent"] - th0 * (1 - ch3.eta * a) ** k) == 0
    assert d["stability"] == sp.Interval.open(0, 2 / a)
    assert d["oscillates"] == sp.Interval.open(1 / a, sp.oo)


def test_schedule_properties():
    d = ch3.schedule_closed_form()
    assert d["at_warmup"] == d["max"]
    assert d["ramp_last"] == d["max"]  # the ramp reaches the peak at s = w − 1 ...
    assert sp.simplify(d["ramp_at_w"] - d["max"] * (1 + 1 / d["warmup"])) == 0  # ... its formula overshoots at w
    assert d["at_total"] == d["min"]
    assert d["slope_at_ends"] == [0, 0]
    assert sp.simplify(d["mean"] - (d["max"] + d["min"]) / 2) == 0


def test_check_numbers():
    res = ch3.check(seed=3)
    assert len(res) == 16
    for name, value in res.items():
        assert value < 1e-12, name


def test_worst_step_grows_to_its_limit_only_when_beta1_squared_below_beta2():
    limit = float(ch3.adam_effective_step()["worst_default"])
    values = [ch3.worst_step(t) for t in (60, 1000, 10000, 100000)]
    assert values == sorted(values) and abs(values[0] - 1.758) < 1e-3  # t = 60: far below the limit 7.27
    assert abs(values[-1] - limit) < 1e-9
    assert abs(ch3.worst_history_step(1000) - values[1]) < 1e-12  # our AdamW on the maximizing history
    grows = [ch3.worst_step(t, 0.9, 0.8) for t in (10, 100, 1000)]  # β₁² = 0.81 ≥ β₂ = 0.8: no limit
    assert grows == sorted(grows) and grows[-1] > 10 * grows[0]


def test_descent_lemma_bound_holds_on_a_logistic_loss():
    """An instance beyond the quadratic: mean softplus(Xθ) is L-smooth with L = λmax(XᵀX)/(4n)."""
    d = ch3.descent_lemma()
    bound = sp.lambdify([d["loss"], ch3.eta, d["G"], d["L"]], d["bound"])
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(50, 4, generator=gen, dtype=torch.float64)
    lip = float(torch.linalg.eigvalsh(X.T @ X / (4 * 50)).max())

    def loss(theta):
        return torch.nn.functional.softplus(X @ theta).mean()

    for _ in range(20):
        theta = torch.randn(4, generator=gen, dtype=torch.float64, requires_grad=True)
        (grad,) = torch.autograd.grad(loss(theta), theta)
        for step in (0.2 / lip, 1 / lip, 1.9 / lip):
            after = float(loss(theta.detach() - step * grad))
            assert after <= bound(float(loss(theta.detach())), step, float(grad @ grad), lip) + 1e-12
            assert after < float(loss(theta.detach()))  # a decrease, as the lemma guarantees for η < 2/L


def test_worst_step_is_slow_only_through_the_bias_correction():
    """The uncorrected worst ratio √(Σ a_i²/b_i) is at its limit within 1e-4 by t = 60; the bias correction
    √(1 − β₂ᵗ)/(1 − β₁ᵗ) is what keeps the step low; a history grown over only the last 60 of 300 steps does
    nearly as well as the full worst history."""
    limit = float(ch3.adam_effective_step()["worst_default"])
    for t in (60, 300, 1000):
        uncorrected, correction = ch3.worst_parts(t)
        assert abs(uncorrected - limit) < 1e-4 and abs(uncorrected * correction - ch3.worst_step(t)) < 1e-12
    assert ch3.worst_parts(60)[1] < 0.25 and ch3.worst_parts(1000)[1] < 0.8
    late = ch3.worst_history_step(300, growing=60)
    assert abs(late - ch3.worst_step(300)) < 1e-4 * ch3.worst_step(300) and late < ch3.worst_step(300)
    assert ch3.worst_history_step(300, growing=300) == ch3.worst_history_step(300)


def test_descent_lemma_bound_prints_the_loss_as_script_L_of_x():
    """The loss at x prints as 𝓛(x), not as a symbol L_x beside the Lipschitz constant L."""
    latex = sp.latex(ch3.descent_lemma()["bound"])
    assert r"\mathcal{L}(x)" in latex and "L_{x}" not in latex, latex


def test_descent_lemma_best_step_is_one_over_L():
    dl = ch3.descent_lemma()
    assert dl["best"] == [1 / dl["L"]] and sp.simplify(dl["curvature"] + dl["L"] * dl["G"]) == 0
