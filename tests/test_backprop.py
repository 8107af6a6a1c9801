"""Hand-written backward passes (chapter 4): SymPy (lambdified) = ours = torch.autograd, plus gradcheck.

Tolerances: float64 throughout; ours vs autograd atol 1e-12 (different but equivalent formulas, rounding only);
SymPy vs ours 1e-12 (SymPy's tanh-GELU uses the exact rational 0.044715, lambdified in float64);
gradcheck at its float64 defaults (eps 1e-6, atol 1e-5, rtol 1e-3) against central finite differences.
"""

import math

import numpy as np
import pytest
import sympy as sp
import torch
import torch.nn.functional as F
from torch.autograd import gradcheck

from transformer_lab.backprop import (
    STACKS,
    GELUFn,
    LayerNormFn,
    LinearFn,
    SoftmaxCrossEntropyFn,
    gelu,
    gelu_backward,
    gelu_grad,
    layer_norm,
    layer_norm_backward,
    linear,
    linear_backward,
    relu,
    relu_backward,
    softmax_cross_entropy,
    softmax_cross_entropy_backward,
    stack_gradient_norms,
)
from transformer_lab.derivations import ch4

TOL = dict(atol=1e-12, rtol=1e-10)
D = torch.float64


def rand(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=D) * scale


def autograd_of(fn, *inputs, grad_out):
    inputs = [t.clone().requires_grad_(True) for t in inputs]
    return torch.autograd.grad(fn(*inputs), inputs, grad_out, allow_unused=True)


# ---------------------------------------------------------------- GELU, ReLU
@pytest.mark.parametrize(("approximate", "derivation"), [("none", ch4.gelu_exact_derivative),
                                                         ("tanh", ch4.gelu_tanh_derivative)])
def test_gelu_three_way(approximate, derivation):
    x = torch.cat([rand(500, scale=3), torch.tensor([0.0, -30.0, 30.0, 1e-8, -1e-8], dtype=D)])
    d = derivation()
    mods = [{"erf": np.vectorize(math.erf)}, "numpy"]
    sym_f = torch.from_numpy(sp.lambdify(ch4.x, d["gelu"], mods)(x.numpy()))
    sym_g = torch.from_numpy(sp.lambdify(ch4.x, d["derivative"], mods)(x.numpy()))
    torch.testing.assert_close(gelu(x, approximate), F.gelu(x, approximate=approximate), **TOL)
    torch.testing.assert_close(gelu(x, approximate), sym_f, **TOL)
    (auto,) = autograd_of(lambda t: F.gelu(t, approximate=approximate), x, grad_out=torch.ones_like(x))
    torch.testing.assert_close(gelu_grad(x, approximate), auto, **TOL)
    torch.testing.assert_close(gelu_grad(x, approximate), sym_g, **TOL)
    g = rand(x.shape[0], seed=1)
    torch.testing.assert_close(gelu_backward(g, x, approximate), g * auto, **TOL)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_gelu_tanh_grad_saturates_without_nan(dtype):
    """Past |x| ≈ 256, x² overflows float16; 1 − tanh²u is 0 there, and inf · 0 must not make a NaN: the slope is
    1 (x > 0) or 0 (x < 0), as F.gelu's backward gives. Nothing changes below |x| = 10."""
    x = torch.tensor([-1e4, -300.0, -20.0, -10.5, 10.5, 20.0, 300.0, 1e4], dtype=dtype)
    assert torch.equal(gelu_grad(x, "tanh"), (x > 0).to(dtype))
    (auto,) = autograd_of(lambda t: F.gelu(t, approximate="tanh"), x, grad_out=torch.ones_like(x))
    assert torch.equal(gelu_grad(x, "tanh"), auto)
    inner = torch.linspace(-10, 10, 2001, dtype=D)
    t = torch.tanh(math.sqrt(2 / math.pi) * (inner + 0.044715 * inner**3))
    unclamped = 0.5 * (1 + t) + 0.5 * inner * (1 - t * t) * (math.sqrt(2 / math.pi) * (1 + 3 * 0.044715 * inner**2))
    torch.testing.assert_close(gelu_grad(inner, "tanh"), unclamped, atol=1e-15, rtol=1e-14)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gelu_grad_in_half_precision_is_rounded_once(dtype, approximate):
    """In bfloat16, ½(1 + t) cancels (x = −3 gave −0.0187, the true slope is −0.01158): half inputs are computed in
    float32, so the result is within one unit of the dtype's rounding of the float64 slope."""
    x = torch.linspace(-6, 6, 241, dtype=D)
    got = gelu_grad(x.to(dtype), approximate)
    assert got.dtype == dtype
    exact = gelu_grad(x.to(dtype).to(D), approximate)
    assert ((got.to(D) - exact).abs() <= torch.finfo(dtype).eps * (exact.abs() + 0.01)).all()
    assert abs(float(gelu_grad(torch.tensor(-3.0, dtype=dtype), "tanh")) - (-0.01158)) < 1e-4


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_layer_norm_backward_in_half_precision_is_rounded_once(dtype):
    """In float16, (x − μ)² overflows past |x − μ| ≈ 256: r became 0 and so did the whole gradient. Half inputs are
    computed in float32: the result is the float64 gradient of the rounded inputs, within the dtype's rounding."""
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 16, generator=gen, dtype=D) * torch.tensor([1.0, 30.0, 300.0, 3000.0], dtype=D)[:, None])
    g, w = torch.randn(4, 16, generator=gen, dtype=D), torch.randn(16, generator=gen, dtype=D)
    got = layer_norm_backward(g.to(dtype), x.to(dtype), w.to(dtype))
    exact = layer_norm_backward(g.to(dtype).to(D), x.to(dtype).to(D), w.to(dtype).to(D))
    for ours, ref in zip(got, exact, strict=True):
        assert ours.dtype == dtype
        scale = ref.abs().amax(-1, keepdim=True) if ref.dim() > 1 else ref.abs().max()
        assert ((ours.to(D) - ref).abs() <= 4 * torch.finfo(dtype).eps * scale).all()
    assert got[0][2:].abs().amax() > 0  # rows with |x − μ| > 256 still get a gradient


def test_relu_subgradient_at_zero_is_torchs():
    x = torch.tensor([-1.0, 0.0, 2.0], dtype=D)
    (auto,) = autograd_of(F.relu, x, grad_out=torch.ones(3, dtype=D))
    assert torch.equal(relu_backward(torch.ones(3, dtype=D), x), auto)
    assert relu_backward(torch.ones(3, dtype=D), x)[1] == 0.0
    assert torch.equal(relu(x), F.relu(x))


# ---------------------------------------------------------------- linear
@pytest.mark.parametrize("shape", [(5, 4), (2, 3, 4), (1, 1, 4)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_backward_matches_autograd(shape, bias):
    x, w, b, g = rand(*shape), rand(6, 4, seed=1), rand(6, seed=2), rand(*shape[:-1], 6, seed=3)
    ref = autograd_of(lambda x_, w_, b_: F.linear(x_, w_, b_ if bias else None), x, w, b, grad_out=g)
    gx, gw, gb = linear_backward(g, x, w, bias=bias)
    torch.testing.assert_close(linear(x, w, b if bias else None), F.linear(x, w, b if bias else None), **TOL)
    torch.testing.assert_close(gx, ref[0], **TOL)
    torch.testing.assert_close(gw, ref[1], **TOL)
    if bias:
        torch.testing.assert_close(gb, ref[2], **TOL)
    else:
        assert gb is None


# ---------------------------------------------------------------- softmax + cross-entropy
@pytest.mark.parametrize(("shape", "scale"), [((7, 5), 1.0), ((2, 3, 11), 3.0), ((4, 5), 1e4), ((1, 1, 3), 1.0)])
def test_softmax_ce_matches_torch(shape, scale):
    z = rand(*shape, scale=scale)
    y = torch.randint(0, shape[-1], shape[:-1], generator=torch.Generator().manual_seed(9))
    ref_loss = F.cross_entropy(z.reshape(-1, shape[-1]), y.reshape(-1))
    torch.testing.assert_close(softmax_cross_entropy(z, y), ref_loss, **TOL)
    (auto,) = autograd_of(lambda t: F.cross_entropy(t.reshape(-1, shape[-1]), y.reshape(-1)), z,
                          grad_out=torch.tensor(1.0, dtype=D))
    ours = softmax_cross_entropy_backward(z, y)
    assert torch.isfinite(ours).all()
    torch.testing.assert_close(ours, auto, **TOL)
    # ∂L/∂z = (softmax(z) − onehot(y)) / N
    expected = (torch.softmax(z, -1) - F.one_hot(y, shape[-1]).to(D)) / y.numel()
    torch.testing.assert_close(ours, expected, **TOL)


def test_softmax_ce_sympy():
    d = ch4.softmax_ce_gradient(4)
    fn = sp.lambdify([d["z"], d["y"]], d["gradient"], "numpy")
    z = rand(4, seed=4, scale=3)
    got = softmax_cross_entropy_backward(z[None], torch.tensor([2]))[0]
    sym = torch.tensor(fn(z.numpy(), np.eye(4)[2]), dtype=D)
    torch.testing.assert_close(got, sym, **TOL)


# ---------------------------------------------------------------- LayerNorm
@pytest.mark.parametrize("case", ["random", "zero_variance", "one_feature", "huge"])
def test_layer_norm_backward_matches_autograd(case):
    x = {"random": rand(3, 4, 8), "zero_variance": torch.full((2, 8), 3.0, dtype=D),
         "one_feature": rand(5, 1), "huge": rand(2, 8, scale=1e6)}[case]
    C = x.shape[-1]
    w, b, g = rand(C, seed=1) + 1, rand(C, seed=2), rand(*x.shape, seed=3)
    ref = autograd_of(lambda x_, w_, b_: F.layer_norm(x_, (C,), w_, b_, 1e-5), x, w, b, grad_out=g)
    torch.testing.assert_close(layer_norm(x, w, b), F.layer_norm(x, (C,), w, b, 1e-5), **TOL)
    gx, gw, gb = layer_norm_backward(g, x, w, 1e-5)
    tol = TOL if case != "huge" else dict(atol=1e-12, rtol=1e-7)  # x̂ from values ~1e6: cancellation
    torch.testing.assert_close(gx, ref[0], **tol)
    torch.testing.assert_close(gw, ref[1], **tol)
    torch.testing.assert_close(gb, ref[2], **tol)


def test_layer_norm_sympy():
    d = ch4.layer_norm_gradient(3)
    fn = sp.lambdify([d["x"], d["g"], d["eps"]], list(d["gradient"]), "numpy")
    x, g = rand(3, seed=5), rand(3, seed=6)
    torch.testing.assert_close(layer_norm_backward(g, x, None, 1e-5)[0],
                               torch.tensor(fn(x.numpy(), g.numpy(), 1e-5), dtype=D), **TOL)


# ---------------------------------------------------------------- gradcheck: our backward vs finite differences
def test_gradcheck_all():
    x, w, b = (rand(3, 4, seed=0).requires_grad_(), rand(5, 4, seed=1).requires_grad_(),
               rand(5, seed=2).requires_grad_())
    assert gradcheck(LinearFn.apply, (x, w, b))
    for approx in ("none", "tanh"):
        assert gradcheck(lambda t, a=approx: GELUFn.apply(t, a), (rand(3, 4, seed=3, scale=2).requires_grad_(),))
    z = rand(4, 6, seed=4, scale=2).requires_grad_()
    assert gradcheck(lambda t: SoftmaxCrossEntropyFn.apply(t, torch.tensor([0, 5, 2, 2])), (z,))
    xl, wl, bl = (rand(2, 3, 5, seed=5).requires_grad_(), rand(5, seed=6).requires_grad_(),
                  rand(5, seed=7).requires_grad_())
    assert gradcheck(LayerNormFn.apply, (xl, wl, bl))


def test_gradcheck_rejects_a_wrong_backward():
    class Wrong(torch.autograd.Function):  # GELU with the derivative's x φ(x) term dropped
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return gelu(x)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 0.5 * (1 + torch.erf(x / math.sqrt(2)))

    assert not gradcheck(Wrong.apply, (rand(4, seed=8).requires_grad_(),), raise_exception=False)


# ---------------------------------------------------------------- bad input
def test_mismatched_grad_shapes():
    x, w = rand(3, 4), rand(5, 4)
    with pytest.raises(ValueError, match=r"grad_out has shape \(3, 4\) but the output of linear has shape \(3, 5\)"):
        linear_backward(rand(3, 4), x, w)
    with pytest.raises(ValueError, match="gelu"):
        gelu_backward(rand(3, 5), x)
    with pytest.raises(ValueError, match="relu"):
        relu_backward(rand(4), x)
    with pytest.raises(ValueError, match="layer_norm"):
        layer_norm_backward(rand(3, 5), x)
    with pytest.raises(ValueError, match=r"weight must have shape \(4,\)"):
        layer_norm_backward(rand(3, 4), x, rand(5))


def test_bad_linear_shapes():
    with pytest.raises(ValueError, match="d_in=3"):
        linear(rand(2, 4), rand(5, 3))
    with pytest.raises(ValueError, match="2-D"):
        linear(rand(2, 4), rand(4))
    with pytest.raises(ValueError, match=r"bias must have shape \(5,\)"):
        linear(rand(2, 4), rand(5, 4), rand(4))
    with pytest.raises(ValueError, match="does not fit"):
        linear_backward(rand(2, 5), rand(2, 4), rand(5, 3))


def test_bad_approximate():
    with pytest.raises(ValueError, match="approximate must be"):
        gelu(rand(3), "sigmoid")
    with pytest.raises(ValueError, match="approximate must be"):
        gelu_grad(rand(3), "exact")


@pytest.mark.parametrize(("targets", "match"), [
    (torch.tensor([0, 1]), r"targets must have shape \(3,\)"), (torch.tensor([0.0, 1.0, 2.0]), "integer"),
    (torch.tensor([0, 1, 5]), r"targets must lie in \[0, 5\)"), (torch.tensor([0, -1, 2]), "must lie in"),
])
def test_bad_targets(targets, match):
    with pytest.raises(ValueError, match=match):
        softmax_cross_entropy(rand(3, 5), targets)
    with pytest.raises(ValueError, match=match):
        softmax_cross_entropy_backward(rand(3, 5), targets)


def _stack_autograd_norms(weights, h0, g_out, stack, gain, eps=1e-5):
    """The same stack written with torch ops only; ‖∂L/∂h_l‖ from autograd (L = Σ g_out ⊙ h_L)."""
    hs = [h0.clone().requires_grad_(True)]
    scale = 1 / math.sqrt(len(weights)) if stack == "residual 1/√D" else 1.0
    for w in weights:
        inp = F.layer_norm(hs[-1], (w.shape[1],), eps=eps) if stack == "pre-LN residual" else hs[-1]
        f = F.gelu(inp @ (gain * w).T)
        hs.append(f if stack == "plain" else hs[-1] + scale * f)
        hs[-1].retain_grad()
    hs[0].retain_grad()
    (hs[-1] * g_out).sum().backward()
    return torch.stack([h.grad.norm() for h in hs])


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("gain", [0.5, 1.5, 3.0])
def test_stack_gradient_norms_match_autograd(stack, gain):
    weights = [rand(6, 6, seed=i, scale=1 / math.sqrt(6)) for i in range(5)]
    h0, g_out = rand(4, 6, seed=10), rand(4, 6, seed=11)
    ours = stack_gradient_norms(weights, h0, g_out, stack=stack, gain=gain)
    assert ours.shape == (6,)
    torch.testing.assert_close(ours, _stack_autograd_norms(weights, h0, g_out, stack, gain), **TOL)


def test_stack_gradient_norms_rejects_unknown_stack():
    with pytest.raises(ValueError, match="stack must be one of"):
        stack_gradient_norms([rand(3, 3)], rand(2, 3), rand(2, 3), stack="post-LN")
