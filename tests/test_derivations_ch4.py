"""The chapter-4 SymPy derivations close (difference 0) and agree numerically with ours and autograd."""

import sympy as sp

from transformer_lab.derivations import ch4


def test_gelu_derivatives_close():
    assert ch4.gelu_exact_derivative()["difference"] == 0
    assert ch4.gelu_exact_derivative()["at_zero"] == sp.Rational(1, 2)
    assert ch4.gelu_tanh_derivative()["difference"] == 0


def test_relu_one_sided_derivatives_differ_at_zero():
    d = ch4.relu_at_zero()
    assert d["right_derivative"] == 1
    assert d["left_derivative"] == 0


def test_softmax_ce_gradient_is_p_minus_y():
    assert ch4.softmax_ce_gradient(3)["difference"] == [0, 0, 0]


def test_layer_norm_jacobian_closes():
    assert ch4.layer_norm_gradient(3)["jacobian_difference"].is_zero_matrix


def test_check_numbers():
    res = ch4.check(seed=1)
    assert len(res) == 10
    for name, value in res.items():
        assert value < 1e-12, name
