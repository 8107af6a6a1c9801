"""The chapter-3 SymPy derivations close and agree numerically with our AdamW / WarmupCosine and torch's."""

import sympy as sp

from transformer_lab.derivations import ch3


def test_bias_correction():
    d = ch3.bias_correction()
    assert sp.simplify(d["factor"] - (1 - ch3.beta1**ch3.t)) == 0
    assert d["corrected"] == ch3.g
    assert sp.simplify(d["second_moment"] - ch3.g**2 * (1 - ch3.beta2**ch3.t)) == 0


def test_effective_step():
    d = ch3.adam_effective_step()
    gr = sp.Symbol("g", real=True, nonzero=True)
    assert sp.simplify(d["first_step_eps0"] - ch3.eta * sp.sign(gr)) == 0
    assert d["scale_invariant"] == 0
    assert sp.simplify(d["spike_default"] - sp.sqrt(10) * ch3.eta * sp.sign(gr)) == 0


def test_gradient_flow_and_euler():
    d = ch3.gradient_flow_quadratic()
    a, th0, k = d["a"], d["theta0"], d["k"]
    assert sp.simplify(d["flow"] - th0 * sp.exp(-a * d["t"])) == 0
    assert sp.simplify(d["descent"] - th0 * (1 - ch3.eta * a) ** k) == 0
    assert d["stability"] == sp.Interval.open(0, 2 / a)


def test_schedule_properties():
    d = ch3.schedule_closed_form()
    assert d["at_warmup"] == d["max"]
    assert d["at_total"] == d["min"]
    assert d["slope_at_ends"] == [0, 0]
    assert sp.simplify(d["mean"] - (d["max"] + d["min"]) / 2) == 0


def test_check_numbers():
    res = ch3.check(seed=3)
    assert len(res) == 8
    for name, value in res.items():
        assert value < 1e-12, name
