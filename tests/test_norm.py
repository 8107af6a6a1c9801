"""LayerNorm (chapter 7): SymPy lambdified = ours = nn.LayerNorm, values and gradients, edge cases, bad input.

Tolerances: float64 comparisons use atol = rtol = 1e-10 (ours and PyTorch's fused kernel sum in different orders,
so they agree to a few ulps, about 1e-15, far inside that); float16 / bfloat16 are compared with the float64
result at the precision of the format (half an ulp of numbers of size ~3, plus rounding of the affine step).
"""

import math

import numpy as np
import pytest
import sympy as sp
import torch
import torch.nn.functional as F
from torch import nn

from transformer_lab.derivations import ch7 as d7
from transformer_lab.norm import LayerNorm, layer_norm

TOL64 = {"atol": 1e-10, "rtol": 1e-10}


def _params(C, dtype=torch.float64):
    return torch.randn(C, dtype=dtype), torch.randn(C, dtype=dtype)


def test_sympy_equals_ours_equals_torch():
    n = 5
    x, gamma, beta, eps, y = d7.layer_norm_expr(n)
    f = sp.lambdify([x, gamma, beta, eps], y, "numpy")
    X = torch.randn(20, n, dtype=torch.float64) * 4 + 2
    G, B = _params(n)
    sym = torch.tensor(np.array([f(r, G.numpy(), B.numpy(), 1e-5) for r in X.numpy()]))
    ours = layer_norm(X, G, B, eps=1e-5)
    torch.testing.assert_close(ours, sym, **TOL64)
    torch.testing.assert_close(ours, F.layer_norm(X, (n,), G, B, 1e-5), **TOL64)


@pytest.mark.parametrize("shape", [(7,), (3, 16), (2, 5, 32), (2, 3, 4, 8), (1, 1, 1)])
@pytest.mark.parametrize("affine", ["both", "weight", "bias", "none"])
def test_values_and_gradients_equal_nn_layernorm(shape, affine):
    C = shape[-1]
    x = (torch.randn(shape, dtype=torch.float64) * 3 + 1).requires_grad_()
    G, B = _params(C)
    w = G.clone().requires_grad_() if affine in ("both", "weight") else None
    b = B.clone().requires_grad_() if affine in ("both", "bias") else None
    up = torch.randn(shape, dtype=torch.float64)
    ours = layer_norm(x, w, b, eps=1e-5)
    ref = F.layer_norm(x, (C,), w, b, 1e-5)
    torch.testing.assert_close(ours, ref, **TOL64)
    inputs = [t for t in (x, w, b) if t is not None]
    g_ours = torch.autograd.grad(ours, inputs, up)
    g_ref = torch.autograd.grad(ref, inputs, up)
    for a, r in zip(g_ours, g_ref, strict=True):
        torch.testing.assert_close(a, r, **TOL64)


def test_module_equals_nn_layernorm_and_shares_state_dict():
    ours, ref = LayerNorm(12).double(), nn.LayerNorm(12).double()
    with torch.no_grad():
        ours.weight.normal_()
        ours.bias.normal_()
    ref.load_state_dict(ours.state_dict())  # same parameter names
    x = torch.randn(3, 4, 12, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(ours(x), ref(x), **TOL64)
    ours(x).pow(2).sum().backward()
    g_ours = (x.grad.clone(), ours.weight.grad, ours.bias.grad)
    x.grad = None
    ref(x).pow(2).sum().backward()
    for a, r in zip(g_ours, (x.grad, ref.weight.grad, ref.bias.grad), strict=True):
        torch.testing.assert_close(a, r, **TOL64)


def test_no_bias_module():
    m = LayerNorm(6, bias=False).double()
    assert m.bias is None
    assert [n for n, _ in m.named_parameters()] == ["weight"]
    x = torch.randn(4, 6, dtype=torch.float64)
    torch.testing.assert_close(m(x), F.layer_norm(x, (6,), m.weight, None), **TOL64)


def test_gradcheck_and_expanded_upstream_gradient():
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: layer_norm(x, w, b), (x, w, b))
    assert torch.autograd.gradcheck(lambda x: layer_norm(x), (x,))
    # .sum() sends an expanded (stride-0) gradient; the backward must not write into it
    (g,) = torch.autograd.grad(layer_norm(x).sum(), x)
    torch.testing.assert_close(g, torch.zeros_like(g), atol=1e-12, rtol=0)


def test_output_mean_zero_variance_one_and_scale_invariance():
    x = torch.randn(10, 64, dtype=torch.float64) * 7 - 3
    y = layer_norm(x, eps=0.0)
    torch.testing.assert_close(y.mean(-1), torch.zeros(10, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(y.var(-1, correction=0), torch.ones(10, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(layer_norm(1000 * x + 5, eps=0.0), y, atol=1e-12, rtol=1e-12)
    # with eps the variance is sigma^2 / (sigma^2 + eps)
    s2 = x.var(-1, correction=0)
    torch.testing.assert_close(layer_norm(x, eps=0.5).var(-1, correction=0), s2 / (s2 + 0.5), **TOL64)


def test_zero_variance_rows():
    x = torch.full((4, 8), 3.0, dtype=torch.float64, requires_grad=True)
    w, b = _params(8)
    ours, ref = layer_norm(x, w, b), F.layer_norm(x, (8,), w, b)
    torch.testing.assert_close(ours, ref, **TOL64)
    torch.testing.assert_close(ours, b.expand(4, 8), **TOL64)  # \hat x = 0 exactly
    up = torch.randn(4, 8, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad(ours, x, up)[0], torch.autograd.grad(ref, x, up)[0], **TOL64)


def test_single_feature_and_large_offset():
    x = torch.randn(5, 1, dtype=torch.float64)
    torch.testing.assert_close(layer_norm(x), torch.zeros_like(x), atol=0, rtol=0)
    # a huge common offset: two-pass variance keeps the result (float32), E[x^2] - E[x]^2 would not
    base = torch.randn(4, 256, dtype=torch.float64)
    x32 = (base + 1e4).float()
    torch.testing.assert_close(layer_norm(x32).double(), F.layer_norm(x32.double(), (256,)), atol=2e-3, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_matches_float64_within_format_precision(dtype):
    x = torch.randn(8, 64) * 4 + 1
    w, b = torch.randn(64), torch.randn(64)
    exact = F.layer_norm(x.double(), (64,), w.double(), b.double())
    got = layer_norm(x.to(dtype), w.to(dtype), b.to(dtype))
    assert got.dtype == dtype
    ulp = {torch.float16: 2**-10, torch.bfloat16: 2**-7}[dtype]  # relative spacing of the format
    # inputs and parameters are each rounded once (relative error ulp/2), the output once more
    torch.testing.assert_close(got.double(), exact, atol=8 * ulp, rtol=2 * ulp)
    ref = F.layer_norm(x.to(dtype), (64,), w.to(dtype), b.to(dtype)).double()
    torch.testing.assert_close(got.double(), ref, atol=4 * ulp, rtol=2 * ulp)


def test_mixed_parameter_dtype_gradients_have_parameter_dtype():
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    m = LayerNorm(4)  # float32 parameters
    m(x).sum().backward()
    assert m.weight.grad.dtype == torch.float32
    assert m.bias.grad.dtype == torch.float32
    assert x.grad.dtype == torch.float64


@pytest.mark.parametrize(("call", "match"), [
    (lambda: layer_norm([1.0, 2.0]), "must be a torch.Tensor"),
    (lambda: layer_norm(torch.tensor(3.0)), "at least one dimension"),
    (lambda: layer_norm(torch.zeros(2, 0)), "at least one dimension"),
    (lambda: layer_norm(torch.ones(2, 3, dtype=torch.long)), "floating-point"),
    (lambda: layer_norm(torch.ones(2, 3), torch.ones(4)), r"weight must have shape \(3,\)"),
    (lambda: layer_norm(torch.ones(2, 3), None, torch.ones(3, 1)), r"bias must have shape \(3,\)"),
    (lambda: layer_norm(torch.ones(2, 3), [1.0, 1.0, 1.0]), "weight must be a tensor"),
    (lambda: layer_norm(torch.ones(2, 3), eps=-1e-5), "eps must be >= 0"),
    (lambda: layer_norm(torch.ones(2, 3), eps=float("nan")), "eps must be >= 0"),
    (lambda: LayerNorm(0), "d_model must be a positive int"),
    (lambda: LayerNorm(4.0), "d_model must be a positive int"),
    (lambda: LayerNorm(4, eps=-1.0), "eps must be >= 0"),
    (lambda: LayerNorm(4)(torch.ones(2, 5)), r"expected x \(\.\.\., 4\), got \(2, 5\)"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_without_gradients_the_same_values():
    """Under no_grad: the same numbers as with a graph."""
    torch.manual_seed(0)
    x, (w, b) = torch.randn(3, 5, 7, dtype=torch.float64), _params(7)
    with_graph = layer_norm(x.requires_grad_(), w, b)
    with torch.no_grad():
        without = layer_norm(x, w, b)
    assert with_graph.grad_fn is not None and without.grad_fn is None
    torch.testing.assert_close(without, with_graph.detach(), atol=0, rtol=0)


def test_second_derivative_equals_torch():
    """Autograd differentiates the plain formula, so a second derivative exists and equals F.layer_norm's."""
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(layer_norm(x, w).pow(3).sum(), x, create_graph=True)
    (g_ref,) = torch.autograd.grad(F.layer_norm(x, (4,), w).pow(3).sum(), x, create_graph=True)
    torch.testing.assert_close(g, g_ref, **TOL64)
    torch.testing.assert_close(torch.autograd.grad(g.sum(), x)[0], torch.autograd.grad(g_ref.sum(), x)[0], **TOL64)


def test_range_limit_of_the_float32_statistics_is_as_documented():
    """Below sigma = 1.8e19 / sqrt(C) float32 LayerNorm is exact to float32 precision; above it the variance
    overflows and the output is silently beta (the docstring says so)."""
    C = 64
    limit = math.sqrt(torch.finfo(torch.float32).max / C)  # C * sigma^2 = max
    base = torch.randn(3, C, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    base = (base - base.mean(-1, keepdim=True)) / base.std(-1, correction=0, keepdim=True)  # sigma = 1 exactly
    bias = torch.arange(C, dtype=torch.float32)
    below = layer_norm((base * 0.5 * limit).float(), None, bias)
    torch.testing.assert_close(below.double(), F.layer_norm(base, (C,)) + bias.double(), atol=1e-4, rtol=0)
    above = layer_norm((base * 2 * limit).float(), None, bias)
    assert torch.equal(above, bias.expand(3, C))
