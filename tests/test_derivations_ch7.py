"""Chapter 7 derivations: the SymPy results simplify to what the chapter claims, and ``check()`` finds the
lambdified expressions, ours and PyTorch's built-ins in agreement (float64: 1e-12; Monte Carlo: a relative 3%, at
least 3.6 standard errors)."""

import sympy as sp

from transformer_lab.derivations import ch7 as d7


def test_dot_product_variance():
    d = d7.dot_product_variance()
    d_k, sq, sk = d["symbols"]
    assert d["term_mean"] == 0
    assert sp.simplify(d["term_variance"] - sq**2 * sk**2) == 0
    assert d["covariance_of_two_terms"] == 0
    assert sp.simplify(d["variance"] - d_k * sq**2 * sk**2) == 0
    assert sp.simplify(d["scaled_variance"] - sq**2 * sk**2) == 0
    assert d["unit_variance"] == d_k
    assert d["unit_scaled_variance"] == 1


def test_logsumexp_shift_identity():
    d = d7.logsumexp_shift(3)
    assert d["difference"] == 0
    assert d["d_rhs_dm"] == 0
    z = d["z"]
    softmax_1 = sp.exp(z[0]) / sum(sp.exp(zi) for zi in z)
    assert sp.simplify(d["gradient"][0] - softmax_1) == 0
    assert sp.simplify(d["split"] - (-d["m"] + d["lhs"])) == 0


def test_layer_norm_properties():
    p = d7.layer_norm_properties(4)
    assert p["mean"] == 0
    assert p["variance_ratio"] == 1
    assert p["variance_eps0"] == 1
    assert all(e == 0 for e in p["scale_shift_difference"])
    # eps > 0: scaling the input by a is dividing eps by a^2 -- invariance only at eps = 0
    assert all(e == 0 for e in p["scale_eps_difference"])
    x, eps, a, c = p["symbols"]
    assert p["scale_difference_eps"] != 0
    assert sp.simplify(p["scale_difference_eps"].subs(eps, 0)) == 0
    at = {xi: v for xi, v in zip(x, (1, 2, 4, 7), strict=True)} | {eps: sp.Rational(1, 10), a: 3, c: 0}
    assert p["scale_difference_eps"].subs(at) != 0  # an instance where the change is not zero


def test_layer_norm_jacobian_closed_form():
    j = d7.layer_norm_jacobian(3)
    assert j["difference"] == sp.zeros(3, 3)
    assert j["J_times_x_eps0"] == sp.zeros(3, 1)
    assert j["jacobian"] != sp.zeros(3, 3)  # the test above compares something real


def test_check_agreement():
    result = d7.check(seed=0)
    assert set(result) == {"layer_norm_sympy_vs_ours", "layer_norm_ours_vs_torch", "layer_norm_jacobian_sympy_vs_ours",
                           "layer_norm_grad_ours_vs_torch", "logsumexp_sympy_vs_ours", "logsumexp_ours_vs_torch_huge",
                           "logsumexp_grad_ours_vs_torch", "dot_variance_rel_mc"}
    for key, value in result.items():
        if key == "dot_variance_rel_mc":
            # 50,000 samples: relative standard error sqrt((2 + 6/d_k) / 50,000), 0.84 % at d_k = 4 (the largest)
            assert value < 0.03
        else:
            assert value < 1e-12, (key, value)
