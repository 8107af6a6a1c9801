"""The MLP block (chapter 4): forward = the torch built-ins; hand-written backward = torch.autograd (float64).

Tolerance atol 1e-12, rtol 1e-10: the same products summed in another order.
"""

import pytest
import torch
import torch.nn.functional as F

from transformer_lab.derivations import ch4
from transformer_lab.mlp import MLP, _TanhGELU

TOL = dict(atol=1e-12, rtol=1e-10)
D = torch.float64


def make(approximate="tanh", bias=True, dropout=0.0):
    torch.manual_seed(0)
    return MLP(6, bias=bias, dropout=dropout, approximate=approximate).double()


def test_shapes_and_names():
    m = MLP(8)
    assert m.fc.weight.shape == (32, 8)
    assert m.proj.weight.shape == (8, 32)
    assert MLP(8, 10).fc.weight.shape == (10, 8)
    assert m(torch.randn(2, 3, 8)).shape == (2, 3, 8)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_forward_matches_builtins(approximate):
    m = make(approximate)
    x = torch.randn(2, 5, 6, dtype=D)
    ref = F.linear(F.gelu(F.linear(x, m.fc.weight, m.fc.bias), approximate=approximate), m.proj.weight, m.proj.bias)
    torch.testing.assert_close(m(x), ref, **TOL)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(2, 5, 6), (1, 1, 6), (6,)])
def test_backward_matches_autograd(approximate, bias, shape):
    m = make(approximate, bias)
    x = torch.randn(*shape, dtype=D, requires_grad=True)
    g = torch.randn(*shape, dtype=D)
    y, cache = m.forward_with_cache(x.detach())
    torch.testing.assert_close(y, m(x).detach(), **TOL)
    ours = m.backward(g, cache)
    names = ["x", *(n for n, _ in m.named_parameters())]
    auto = torch.autograd.grad(m(x), [x, *m.parameters()], g)
    assert sorted(ours) == sorted(names)
    for name, a in zip(names, auto, strict=True):
        torch.testing.assert_close(ours[name], a, **TOL, msg=lambda msg, n=name: f"{n}: {msg}")


def test_backward_through_dropout_uses_the_same_mask():
    m = make(dropout=0.5)
    x = torch.randn(4, 6, dtype=D, requires_grad=True)
    g = torch.randn(4, 6, dtype=D)
    y, cache = m.forward_with_cache(x.detach(), generator=torch.Generator().manual_seed(1))
    out = m(x, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(y, out.detach(), **TOL)
    assert (y == 0).any()
    auto = torch.autograd.grad(out, [x, m.fc.weight], g)
    ours = m.backward(g, cache)
    torch.testing.assert_close(ours["x"], auto[0], **TOL)
    torch.testing.assert_close(ours["fc.weight"], auto[1], **TOL)
    m.eval()
    torch.testing.assert_close(m(x), m.proj(F.gelu(m.fc(x), approximate="tanh")), **TOL)  # eval: no dropout


def test_sympy_chain_rule_equals_ours_and_autograd():
    d = ch4.mlp_chain_rule()
    assert d["difference_W1"].is_zero_matrix
    assert d["difference_x"].is_zero_matrix
    res = ch4.check()
    assert res["mlp_block (5 gradients): sympy vs ours"] < 1e-12
    assert res["mlp_block (5 gradients): ours vs autograd"] < 1e-12


def test_bad_input():
    m = MLP(6)
    with pytest.raises(ValueError, match=r"MLP expects input \(\.\.\., 6\), got shape \(2, 5\)"):
        m(torch.randn(2, 5))
    _, cache = m.forward_with_cache(torch.randn(2, 6))
    with pytest.raises(ValueError, match=r"grad_out has shape \(2, 5\)"):
        m.backward(torch.randn(2, 5), cache)
    with pytest.raises(ValueError, match="approximate"):
        MLP(6, approximate="erf")
    with pytest.raises(ValueError, match="dropout"):
        MLP(6, dropout=1.0)
    with pytest.raises(ValueError, match="must be a positive int"):
        MLP(0)


def test_without_gradients_the_same_values():
    """Under no_grad the tanh-GELU skips its autograd Function: same numbers as the training path."""
    mlp, x = make(), torch.randn(4, 6, dtype=D, requires_grad=True)
    with_graph = mlp(x)
    with torch.no_grad():
        without = mlp(x)
    assert with_graph.grad_fn is not None and without.grad_fn is None
    torch.testing.assert_close(without, with_graph.detach(), atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_tanh_gelu_backward_has_no_nan_where_it_saturates(dtype):
    """float16: x² overflows past |x| ≈ 256 and σ(1 − σ) = 0 there; the backward must give 0 or 1, not inf · 0 = NaN
    (F.gelu's backward gives 1 at x = 1e4)."""
    x = torch.tensor([-1e4, -300.0, -20.0, 20.0, 300.0, 1e4], dtype=dtype, requires_grad=True)
    (ours,) = torch.autograd.grad(_TanhGELU.apply(x).sum(), x)
    (ref,) = torch.autograd.grad(F.gelu(x, approximate="tanh").sum(), x)
    assert torch.equal(ours, (x > 0).to(dtype)) and torch.equal(ours, ref)


def test_tanh_gelu_clamp_changes_the_derivative_by_less_than_its_docstring_says():
    """Docstring of _TanhGELU: beyond ±10, σ(1 − σ) < 1e-37 (exactly 0 for x > 10, and in float16); the clamp
    changes GELU′ by less than 1e-35, with |GELU′(x)| < 3e-36 for x < −10 (unclamped float64 formula)."""
    from transformer_lab.backprop import _GELU_C, _SQRT_2_OVER_PI
    from transformer_lab.mlp import _sigmoid_2u

    x = torch.cat([-10 - torch.logspace(-6, 2, 200, dtype=D), 10 + torch.logspace(-6, 2, 200, dtype=D)])
    s = _sigmoid_2u(x)
    slope = s * (1 - s)
    assert slope.max() < 1e-37 and torch.equal(slope[x > 10], torch.zeros_like(slope[x > 10]))
    s16 = _sigmoid_2u(x.to(torch.float16))
    assert torch.equal(s16 * (1 - s16), torch.zeros_like(s16))
    true = s + x * s * (1 - s) * 2 * _SQRT_2_OVER_PI * (1 + 3 * _GELU_C * x * x)  # σ + x 2u′ σ(1 − σ), unclamped
    xg = x.clone().requires_grad_(True)
    (ours,) = torch.autograd.grad(_TanhGELU.apply(xg).sum(), xg)
    assert (ours - true).abs().max() < 1e-35 and true[x < -10].abs().max() < 3e-36
