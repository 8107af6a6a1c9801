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


def test_relu_subdifferential_is_derived_not_typed():
    d = ch4.relu_at_zero()
    assert d["from_right"] == sp.Interval(-sp.oo, 1)  # s h ≤ h for every h > 0
    assert d["from_left"] == sp.Interval(0, sp.oo)  # s h ≤ 0 for every h < 0
    assert d["subdifferential"] == sp.Interval(0, 1)
    assert d["derivative"] == sp.Heaviside(ch4.x)
    assert d["sympy_at_zero"] == sp.Rational(1, 2)  # SymPy's convention, neither 0 (PyTorch) nor 1


def test_gelu_slope_shape():
    d = ch4.gelu_slope_shape()
    assert d["second_difference"] == 0
    assert d["peak_x"] == sp.sqrt(2)
    assert d["symmetry"] == 1 and d["limit"] == 1
    assert d["increasing_on"] == sp.Interval.open(-sp.sqrt(2), sp.sqrt(2))  # GELU″ > 0
    assert d["decreasing_on"] == sp.Union(sp.Interval.open(-sp.oo, -sp.sqrt(2)), sp.Interval.open(sp.sqrt(2), sp.oo))
    assert abs(float(d["crossing"]) - 0.7517915246935645) < 1e-15
    assert abs(float(d["peak"]) - 1.1289041451851) < 1e-12
    assert abs(float(d["minimum"]) + 0.1699712074799037) < 1e-15
    assert abs(float(ch4.gelu_exact_derivative()["derivative"].subs(ch4.x, d["crossing"])) - 1) < 1e-25


def test_softmax_ce_via_chapter2_jacobian():
    assert ch4.softmax_ce_gradient(3)["via_jacobian_difference"] == [0, 0, 0]


def test_layer_norm_gradient_along_ones_and_xhat():
    d = ch4.layer_norm_gradient(3)
    assert d["gradient_difference"].is_zero_matrix
    assert d["along_ones"] == 0  # orthogonal to 1 for every ε
    assert d["along_xhat_difference"] == 0  # x̂ᵀ∇ = ε r³ ĝᵀx̂: orthogonal to x̂ only at ε = 0
    assert d["along_xhat_rhs"].subs(d["eps"], 0) == 0


def test_layer_norm_scale_derivative_is_eps_r2_xhat():
    """d/dc LN(c x) at c = 1 = ε r² x̂, derived (x → c x, differentiate, c = 1): zero only at ε = 0."""
    d = ch4.layer_norm_gradient(3)
    assert d["scale_difference"] == [0, 0, 0]
    assert sp.simplify(d["scale_derivative"][0]) != 0  # for ε > 0 LN(c x) moves with c


def test_mlp_chain_rule_all_five_gradients():
    d = ch4.mlp_chain_rule()
    for k in ("W1", "x", "b1", "W2", "b2"):
        assert d[f"difference_{k}"].is_zero_matrix, k


def test_softmax_ce_gradient_is_p_minus_y():
    assert ch4.softmax_ce_gradient(3)["difference"] == [0, 0, 0]


def test_layer_norm_jacobian_closes():
    assert ch4.layer_norm_gradient(3)["jacobian_difference"].is_zero_matrix


def test_check_numbers():
    res = ch4.check(seed=1)
    assert len(res) == 18
    for name, value in res.items():
        assert value < 1e-12, name


def test_check_relative_is_rounding_for_every_draw():
    """Divided by the size of the numbers each formula combines, every row is float64 rounding, whatever the seed
    (the absolute LayerNorm row is not: three nearly equal entries give a large gradient, and a larger error)."""
    for s in range(12):
        res = ch4.check(seed=s, relative=True)
        assert len(res) == 18 and max(res.values()) < 1e-14, (s, res)
        absolute = ch4.check(seed=s)
        assert all(res[k] <= absolute[k] for k in res)  # every size is at least 1


def test_linear_layer_batched_gradient_derived():
    """The batched linear layer, entry by entry, with N, d_in, d_out all different: G W, Gᵀ X, Σ_n G."""
    d = ch4.linear_gradient(2, 3, 4)
    for k in "XWb":
        assert d[f"difference_{k}"].is_zero_matrix, k
    assert d["chain_W"].shape == (4, 3)


def test_layer_norm_scale_invariant_at_eps0_for_positive_c_only():
    d = ch4.layer_norm_gradient(3)
    assert d["scale_invariance_at_eps0"] == [0, 0, 0]  # x̂(c x) = x̂(x) for every c > 0
    assert d["sign_flip_at_eps0"] == [0, 0, 0]  # x̂(c x) = −x̂(x) for c < 0
