"""The chapter-3 SymPy derivations close and agree numerically with our AdamW / WarmupCosine and torch's."""

import sympy as sp

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
    assert len(res) == 9
    for name, value in res.items():
        assert value < 1e-12, name
