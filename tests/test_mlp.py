"""The MLP block (chapter 4): forward = the torch built-ins; hand-written backward = torch.autograd (float64).

Tolerance atol 1e-12, rtol 1e-10: the same products summed in another order.
"""

import pytest
import torch
import torch.nn.functional as F

from transformer_lab.derivations import ch4
from transformer_lab.mlp import MLP

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
    """Under no_grad: the same numbers as with a graph."""
    mlp, x = make(), torch.randn(4, 6, dtype=D, requires_grad=True)
    with_graph = mlp(x)
    with torch.no_grad():
        without = mlp(x)
    assert with_graph.grad_fn is not None and without.grad_fn is None
    torch.testing.assert_close(without, with_graph.detach(), atol=0, rtol=0)
