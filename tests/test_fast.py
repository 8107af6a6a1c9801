"""The speed paths (transformer_lab.fast) against the chapters' plain modules and PyTorch: plain = fast = reference.

Values and gradients in float64 (atol = rtol = 1e-12: the three sum in different orders, ~1e-16 apart), edge cases
(fully masked rows, length 1, huge logits, saturated GELU), and float16 / bfloat16 within the format's rounding.
"""

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from test_optim import batches, tiny_model, train_step  # the same small model the plain AdamW trains
from torch import nn

from transformer_lab.attention import MultiHeadAttention, scaled_dot_product_attention
from transformer_lab.backprop import _GELU_C, _SQRT_2_OVER_PI, gelu
from transformer_lab.fast import (
    FastAdamW,
    FastLayerNorm,
    FastMLP,
    FastMultiHeadAttention,
    _sigmoid_2u,
    _TanhGELU,
    fast_attention,
    fast_gelu,
    fast_layer_norm,
)
from transformer_lab.gpt import GPT, GPTConfig
from transformer_lab.mlp import MLP
from transformer_lab.norm import LayerNorm, layer_norm
from transformer_lab.optim import AdamW, decay_groups

TOL = {"atol": 1e-12, "rtol": 1e-12}


def rnd(*shape, seed=0, grad=False, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).requires_grad_(grad)


def three_way(fns, inputs, upstream, size=1.0):
    """Values and gradients of each fn(*inputs) against upstream, checked equal to the last (the reference) within
    1e-12 relative to the largest entry of each (times ``size``, the scale of the inputs' cancellation)."""
    results = []
    for fn in fns:
        out = fn(*inputs)
        results.append((out, *torch.autograd.grad(out, inputs, upstream)))
    for got in results[:-1]:
        for a, b in zip(got, results[-1], strict=True):
            scale = size * max(1.0, float(b.detach().abs().max()))
            torch.testing.assert_close(a, b, atol=TOL["atol"] * scale, rtol=TOL["rtol"])
    return results


# ------------------------------------------------------------------ attention
def _plain(mask=None, is_causal=False):
    return lambda q, k, v: scaled_dot_product_attention(query=q, key=k, value=v, mask=mask, is_causal=is_causal,
                                                        need_weights=False)[0]


def _fast(mask=None, is_causal=False):
    return lambda q, k, v: fast_attention(q, k, v, mask, None, 0.0, None, is_causal, False)[0]


@pytest.mark.parametrize(("T_q", "T_k", "lead"), [(1, 1, (2,)), (1, 7, (2, 3)), (5, 5, (2, 3)), (6, 9, ())])
def test_attention_with_a_mask_plain_equals_fast_equals_torch(T_q, T_k, lead):
    """A random mask with one fully masked row (weights 0 there, as PyTorch gives) and huge logits (|S| ~ 1e3)."""
    q, k, v = (rnd(*lead, T, 8, seed=s, grad=True, scale=40.0) for s, T in ((1, T_q), (2, T_k), (3, T_k)))
    mask = torch.rand(T_q, T_k, generator=torch.Generator().manual_seed(5)) > 0.4
    mask[0] = False  # a query with no key to attend
    mask[-1, -1] = True if T_q > 1 else mask[-1, -1]
    g = rnd(*lead, T_q, 8, seed=4)
    ref = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # noqa: E731
    results = three_way([_plain(mask), _fast(mask), ref], (q, k, v), g, size=40.0**2)  # scores of size ~40²
    assert all(torch.isfinite(t).all() for r in results for t in r)
    assert (results[1][0][..., 0, :] == 0).all()


@pytest.mark.parametrize(("T", "lead"), [(1, (2,)), (8, (2,)), (32, (2, 3)), (33, (2, 3)), (64, (1,)), (65, ())])
def test_causal_attention_plain_equals_fast_equals_torch(T, lead):
    """T >= 32 with a gradient takes the split path (_CausalAttention), shorter ones _Attention: the same numbers."""
    q, k, v = (rnd(*lead, T, 8, seed=s, grad=True) for s in (1, 2, 3))
    g = rnd(*lead, T, 8, seed=4)
    ref = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    three_way([_plain(is_causal=True), _fast(is_causal=True), ref], (q, k, v), g)
    node = type(_fast(is_causal=True)(q, k, v).grad_fn).__name__
    assert node == ("_CausalAttentionBackward" if T >= 32 else "_AttentionBackward")


def test_attention_weights_gradient_and_dropout_plain_equals_fast():
    """With the weights returned and used, and with dropout drawn from the same generator: the same numbers."""
    q, k, v = (rnd(2, 6, 4, seed=s, grad=True) for s in (1, 2, 3))
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    outs = []
    for fn in (lambda **kw: scaled_dot_product_attention(query=q, key=k, value=v, mask=mask, **kw),
               lambda **kw: fast_attention(q, k, v, mask, None, kw["dropout"], kw["generator"], False, True)):
        out, w = fn(dropout=0.3, generator=torch.Generator().manual_seed(7))
        loss = out.square().sum() + (w * rnd(2, 6, 6, seed=8)).sum()
        outs.append((out, w, *torch.autograd.grad(loss, (q, k, v))))
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(a, b, **TOL)


def test_attention_with_a_cache_offset_and_without_gradients():
    q, k, v = rnd(2, 3, 8, seed=1), rnd(2, 7, 8, seed=2), rnd(2, 7, 8, seed=3)
    for T_q in (3, 1):
        plain = _plain(is_causal=True)(q[:, -T_q:], k, v)
        torch.testing.assert_close(_fast(is_causal=True)(q[:, -T_q:], k, v), plain, **TOL)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_attention_half_precision_plain_equals_fast(dtype):
    """Both compute in float32 and round once: the same numbers, within one rounding of the format."""
    q, k, v = (rnd(2, 4, 40, 16, seed=s).to(dtype).requires_grad_() for s in (1, 2, 3))
    g = rnd(2, 4, 40, 16, seed=4).to(dtype)
    got = [(out, *torch.autograd.grad(out, (q, k, v), g)) for out in (_plain(is_causal=True)(q, k, v),
                                                                     _fast(is_causal=True)(q, k, v))]
    eps = torch.finfo(dtype).eps
    for a, b in zip(*got, strict=True):
        assert a.dtype == b.dtype == dtype
        torch.testing.assert_close(a.double(), b.double(), atol=2 * eps * float(b.detach().abs().max()), rtol=eps)


def test_fast_multi_head_attention_has_the_plain_parameters_and_numbers():
    plain, fast = MultiHeadAttention(16, 4).double(), FastMultiHeadAttention(16, 4).double()
    fast.load_state_dict(plain.state_dict())
    assert list(fast.state_dict()) == list(plain.state_dict())
    x = rnd(2, 40, 16, seed=1, grad=True)
    q, k, v = plain.split_qkv(x)
    ours = fast._attend_causal(q, k, v)[0]
    torch.testing.assert_close(ours, plain.attend(q, k, v, is_causal=True)[0], **TOL)
    torch.testing.assert_close(fast(query=x, key=x, value=x, is_causal=True),
                               plain(query=x, key=x, value=x, is_causal=True), **TOL)
    band = torch.ones(40, 40, dtype=torch.bool).tril() & ~torch.ones(40, 40, dtype=torch.bool).tril(-4)
    band[0] = False  # a query with no key
    for a, b in zip(fast.attend(q, k, v, mask=band, need_weights=True),
                    plain.attend(q, k, v, mask=band, need_weights=True), strict=True):
        torch.testing.assert_close(a, b, **TOL)


# ------------------------------------------------------------------ GELU
@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_gelu_plain_equals_fast_equals_torch(scale):
    x = rnd(4, 64, seed=1, grad=True, scale=scale)
    g = rnd(4, 64, seed=2)
    three_way([lambda x: gelu(x, "tanh"), fast_gelu, lambda x: F.gelu(x, approximate="tanh")], (x,), g)
    with torch.no_grad():
        torch.testing.assert_close(fast_gelu(x), gelu(x, "tanh"), **TOL)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_tanh_gelu_backward_has_no_nan_where_it_saturates(dtype):
    """float16: x² overflows past |x| ≈ 256 and σ(1 − σ) = 0 there; the backward must give 0 or 1, not inf · 0 = NaN
    (F.gelu's backward gives 1 at x = 1e4)."""
    x = torch.tensor([-1e4, -300.0, -20.0, 20.0, 300.0, 1e4], dtype=dtype, requires_grad=True)
    (ours,) = torch.autograd.grad(fast_gelu(x).sum(), x)
    (ref,) = torch.autograd.grad(F.gelu(x, approximate="tanh").sum(), x)
    assert torch.equal(ours, (x > 0).to(dtype)) and torch.equal(ours, ref)


def test_tanh_gelu_clamp_changes_the_derivative_by_less_than_its_docstring_says():
    """Docstring of _TanhGELU: beyond ±10, σ(1 − σ) < 1e-37 (exactly 0 for x > 10, and in float16); the clamp
    changes GELU′ by less than 1e-35, with |GELU′(x)| < 3e-36 for x < −10 (unclamped float64 formula)."""
    D = torch.float64
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


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_fast_mlp_has_the_plain_parameters_and_numbers(approximate):
    plain, fast = MLP(8, approximate=approximate).double(), FastMLP(8, approximate=approximate).double()
    fast.load_state_dict(plain.state_dict())
    assert list(fast.state_dict()) == list(plain.state_dict())
    x = rnd(3, 5, 8, seed=1, grad=True)
    three_way([fast, plain], (x,), rnd(3, 5, 8, seed=2))


# ------------------------------------------------------------------ LayerNorm
@pytest.mark.parametrize(("shape", "offset"), [((3, 16), 0.0), ((2, 5, 32), 1e4), ((4, 1), 0.0), ((1, 1, 7), 0.0)])
def test_layer_norm_plain_equals_fast_equals_torch(shape, offset):
    """Including C = 1 (every row constant: x̂ = 0) and a large offset (the two-pass variance does not cancel)."""
    C = shape[-1]
    x, w, b = rnd(*shape, seed=1, grad=True) + offset, rnd(C, seed=2, grad=True), rnd(C, seed=3, grad=True)
    x = x.detach().requires_grad_()
    three_way([lambda x, w, b: layer_norm(x, w, b), lambda x, w, b: fast_layer_norm(x, w, b, 1e-5),
               lambda x, w, b: F.layer_norm(x, (C,), w, b, 1e-5)], (x, w, b), rnd(*shape, seed=4),
              size=max(1.0, offset))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_layer_norm_half_precision_plain_equals_fast(dtype):
    x = (rnd(6, 64, seed=1) * 3 + 1).to(dtype).requires_grad_()
    w, b = rnd(64, seed=2).to(dtype).requires_grad_(), rnd(64, seed=3).to(dtype).requires_grad_()
    g = rnd(6, 64, seed=4).to(dtype)
    got = [(y, *torch.autograd.grad(y, (x, w, b), g)) for y in (layer_norm(x, w, b), fast_layer_norm(x, w, b, 1e-5))]
    eps = torch.finfo(dtype).eps
    for a, c in zip(*got, strict=True):
        assert a.dtype == c.dtype == dtype
        torch.testing.assert_close(a.double(), c.double(), atol=4 * eps * float(c.detach().abs().max()), rtol=2 * eps)


def test_fast_layer_norm_second_derivative_raises_instead_of_being_wrong():
    """The hand-written backward is first-order only: a second derivative fails loudly (the plain one has one)."""
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(fast_layer_norm(x, w, None, 1e-5).pow(3).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        g.sum().backward()
    (g_ref,) = torch.autograd.grad(layer_norm(x, w).pow(3).sum(), x, create_graph=True)
    torch.testing.assert_close(g, g_ref, **TOL)  # the first derivative is right


def test_fast_layer_norm_module_has_the_plain_parameters_and_numbers():
    plain, fast = LayerNorm(12).double(), FastLayerNorm(12).double()
    with torch.no_grad():
        plain.weight.normal_()
        plain.bias.normal_()
    fast.load_state_dict(plain.state_dict())
    three_way([fast, plain], (rnd(2, 3, 12, seed=1, grad=True),), rnd(2, 3, 12, seed=2))
    with pytest.raises(ValueError, match="expected a floating-point x"):
        fast(torch.zeros(2, 5))


# ------------------------------------------------------------------ the GPT uses the fast paths
def test_gpt_blocks_are_built_from_the_fast_modules():
    model = GPT(GPTConfig(vocab_size=11, block_size=40, n_layer=1, n_head=2, d_model=16))
    block = model.blocks[0]
    assert isinstance(block.attn, FastMultiHeadAttention) and isinstance(block.mlp, FastMLP)
    assert all(isinstance(m, FastLayerNorm) for m in (block.ln1, block.ln2, model.ln_f))


# ------------------------------------------------------------------ AdamW: plain = chunked = flat = torch


def test_adamw_plain_equals_chunked_equals_flat_equals_torch():
    models = [tiny_model() for _ in range(4)]
    opts = [AdamW(decay_groups(models[0], 0.1), lr=3e-3, betas=(0.9, 0.99)),
            FastAdamW(decay_groups(models[1], 0.1), lr=3e-3, betas=(0.9, 0.99)),
            FastAdamW(decay_groups(models[2], 0.1), lr=3e-3, betas=(0.9, 0.99)),
            torch.optim.AdamW(decay_groups(models[3], 0.1), lr=3e-3, betas=(0.9, 0.99), foreach=False)]
    opts[2].flatten_()
    for x, y in batches(20):
        for m, opt in zip(models, opts, strict=True):
            train_step(m, opt, x, y)
    for ps in zip(*(m.parameters() for m in models), strict=True):
        for p in ps[:-1]:
            torch.testing.assert_close(p, ps[-1], atol=1e-13, rtol=1e-12)


# ------------------------------------------------------------------ FastAdamW.flatten_: one tensor per group
def _storages(opt, group=0, key=None):
    """The data pointers of the storages behind a group's parameters (or their state tensors ``key``)."""
    return {(opt.state[p][key] if key else p).untyped_storage().data_ptr() for p in opt.param_groups[group]["params"]}


def test_flattened_adamw_takes_the_very_same_steps():
    """Flattening changes where the numbers live, not the arithmetic: bit-for-bit the unflattened run."""
    a, b = tiny_model(), tiny_model()
    opt_a = FastAdamW(decay_groups(a, 0.1), lr=3e-3, betas=(0.9, 0.99))
    opt_b = FastAdamW(decay_groups(b, 0.1), lr=3e-3, betas=(0.9, 0.99))
    opt_b.flatten_()
    assert not opt_b.state  # as torch.optim: no state before the first step
    for x, y in batches(8):
        train_step(a, opt_a, x, y)
        train_step(b, opt_b, x, y)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)
        assert torch.equal(opt_a.state[p]["exp_avg_sq"], opt_b.state[q]["exp_avg_sq"])
    for group in (0, 1):  # one storage per group for the parameters, the gradients and each moment
        assert len(_storages(opt_b, group)) == 1 and len(_storages(opt_b, group, "exp_avg")) == 1
        assert len({p.grad.untyped_storage().data_ptr() for p in opt_b.param_groups[group]["params"]}) == 1


def test_flattened_zero_grad_keeps_the_views_and_zeroes_them():
    model = tiny_model()
    opt = FastAdamW(decay_groups(model, 0.1))
    opt.flatten_()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and not g.any() for g in grads)
    train_step(model, opt, *batches(1)[0])
    assert any(g.any() for g in grads)
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is g and not g.any() for p, g in zip(model.parameters(), grads, strict=True))


def test_flattened_state_dict_round_trip_continues_exactly_and_stays_flat():
    data = batches(10)
    a, b = tiny_model(), tiny_model()
    opt_a = FastAdamW(decay_groups(a, 0.1), lr=3e-3)
    opt_a.flatten_()
    for x, y in data[:5]:
        train_step(a, opt_a, x, y)
    b.load_state_dict(a.state_dict())  # copies into b's parameters
    opt_b = FastAdamW(decay_groups(b, 0.1), lr=3e-3)
    opt_b.flatten_()
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))
    assert len(_storages(opt_b, 0, "exp_avg")) == 1 and _storages(opt_b, 0) != _storages(opt_a, 0)
    for x, y in data[5:]:
        train_step(a, opt_a, x, y)
        train_step(b, opt_b, x, y)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_moving_a_flattened_model_falls_back_to_the_per_tensor_update():
    """model.to() gives the parameters new tensors: the flat layout is gone, and the update must still be right."""
    a, b = tiny_model().float(), tiny_model().float()
    opt_a, opt_b = FastAdamW(a.parameters(), lr=3e-3), FastAdamW(b.parameters(), lr=3e-3)
    opt_b.flatten_()
    data = batches(6)
    for x, y in data[:3]:
        train_step(a, opt_a, x, y)
        train_step(b, opt_b, x, y)
    a.double(), b.double()
    for opt in (opt_a, opt_b):  # the moments follow the parameters' dtype, as a load_state_dict would
        for p in opt.param_groups[0]["params"]:
            st = opt.state[p]
            st["exp_avg"], st["exp_avg_sq"] = st["exp_avg"].double(), st["exp_avg_sq"].double()
    for x, y in data[3:]:
        train_step(a, opt_a, x, y)
        train_step(b, opt_b, x, y)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert all(p.grad is not None and p.dtype == torch.float64 for p in b.parameters())


def test_a_group_of_mixed_dtypes_is_left_as_it_is():
    p, q = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(2, dtype=torch.float64))
    opt = FastAdamW([p, q], lr=0.1, weight_decay=0.0)
    opt.flatten_()
    assert p.grad is None and q.grad is None
    p.grad, q.grad = torch.ones(3), torch.ones(2, dtype=torch.float64)
    opt.step()
    assert torch.allclose(p.detach(), torch.full((3,), 0.9))
    assert torch.allclose(q.detach(), torch.full((2,), 0.9, dtype=torch.float64))


def test_compiled_flat_update_matches_the_eager_one_and_compiles_once():
    """flatten_(compile=True): one generated kernel per group, the same update up to float32 round-off, and no
    new compile when the learning rate or the step changes (they reach the kernel as a tensor)."""
    from transformer_lab.train import compile_problem
    if compile_problem("cpu") is not None:
        pytest.skip(f"this machine cannot compile: {compile_problem('cpu')}")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    a, b = tiny_model().float(), tiny_model().float()
    opt_a = FastAdamW(decay_groups(a, 0.1), lr=3e-3)
    opt_b = FastAdamW(decay_groups(b, 0.1), lr=3e-3)
    opt_a.flatten_()
    opt_b.flatten_(compile=True)
    for i, (x, y) in enumerate(batches(6)):
        for opt in (opt_a, opt_b):
            for group in opt.param_groups:
                group["lr"] = 3e-3 * (i + 1) / 6  # a warm-up: a new learning rate every step
        train_step(a, opt_a, x, y)
        train_step(b, opt_b, x, y)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2  # one per group (their sizes differ), no more


def _grads(model, x, y, scale=1.0):
    model.zero_grad(set_to_none=False)
    (scale * nn.functional.cross_entropy(model(x).reshape(-1, 11), y.reshape(-1))).backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("scale", [1.0, 1e3, 1e-6])  # clipped, clipped hard, left alone (coefficient 1)
def test_compiled_clip_matches_torchs_clip(scale):
    """clip_grad_norm_ after flatten_(compile=True): one kernel over the flat gradients, torch's formula: the same
    norm and the same clipped gradients up to float32 round-off; with a non-finite gradient the norm is not finite."""
    from transformer_lab.train import compile_problem
    if compile_problem("cpu") is not None:
        pytest.skip(f"this machine cannot compile: {compile_problem('cpu')}")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    a, b = tiny_model().float(), tiny_model().float()
    opt = FastAdamW(decay_groups(b, 0.1))
    opt.flatten_(compile=True)
    kernel, calls = opt._clip, []
    opt._clip = lambda grads, max_norm: calls.append(len(grads)) or kernel(grads, max_norm)
    x, y = batches(1)[0]
    _grads(a, x, y, scale)
    _grads(b, x, y, scale)
    expected = torch.nn.utils.clip_grad_norm_(a.parameters(), 1.0)
    got = opt.clip_grad_norm_(reversed(list(b.parameters())), 1.0)  # any order
    assert calls == [2]  # the compiled kernel ran, once, over both groups' flat gradients
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1  # one graph: no break in _flat_clip
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=0)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-9)
    assert opt._all_flat(list(b.parameters())) is not None  # clipped in place: still the views of the flat tensors
    next(b.parameters()).grad[0, 0] = float("nan")
    assert not torch.isfinite(opt.clip_grad_norm_(b.parameters(), 1.0))


def test_clip_is_torchs_own_unless_compiled_and_given_exactly_the_flat_parameters():
    """Eagerly (flattened or not), and for any other set of parameters, clip_grad_norm_ is torch's, bit for bit."""
    x, y = batches(1)[0]
    for flatten in (False, True):
        a, b = tiny_model(), tiny_model()
        opt = FastAdamW(decay_groups(b, 0.1))
        if flatten:
            opt.flatten_()  # eager: no kernel
        _grads(a, x, y, 1e3)
        _grads(b, x, y, 1e3)
        assert torch.equal(opt.clip_grad_norm_(b.parameters(), 1.0),
                           torch.nn.utils.clip_grad_norm_(a.parameters(), 1.0))
        for p, q in zip(a.parameters(), b.parameters(), strict=True):
            assert torch.equal(p.grad, q.grad)
    opt._clip = lambda grads, max_norm: pytest.fail("the flat kernel ran for a subset of the parameters")
    _grads(a, x, y, 1e3)
    _grads(b, x, y, 1e3)
    some = lambda m: list(m.parameters())[:3]  # noqa: E731
    assert torch.equal(opt.clip_grad_norm_(some(b), 1.0), torch.nn.utils.clip_grad_norm_(some(a), 1.0))
    params = list(b.parameters())
    twice = [params[0], *params[:-1]]  # as many tensors as the optimizer's, one of them twice, one left out
    assert opt._all_flat(some(b)) is None and opt._all_flat(twice) is None
    assert opt._all_flat(params) is not None and opt._all_flat(params[::-1]) is not None


def test_compiled_update_and_clip_run_eagerly_past_the_recompile_limit(monkeypatch):
    """More flat-tensor lengths in one process than torch._dynamo's recompile limit: the later ones run eagerly
    (with the same numbers), they do not fail. torch.compile's eager backend here: the graphs, not the kernels."""
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, backend="eager", **kw))
    torch._dynamo.reset()
    sizes = range(1, torch._dynamo.config.recompile_limit + 3)
    for k in sizes:
        a, b = nn.Linear(16 * k, 2), nn.Linear(16 * k, 2)
        b.load_state_dict(a.state_dict())
        opts = [FastAdamW(decay_groups(m, 0.1)) for m in (a, b)]
        opts[1].flatten_(compile=True)
        x = torch.randn(3, 16 * k)
        for m, opt in zip((a, b), opts, strict=True):
            opt.zero_grad()
            (1e3 * m(x).square().sum()).backward()
            opt.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
        for p, q in zip(a.parameters(), b.parameters(), strict=True):
            torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-7)
    torch._dynamo.reset()


def test_flatten_refuses_before_it_moves_anything():
    """A group it will not flatten (a frozen parameter; states that took different numbers of steps) keeps its
    tensors and their gradients as they were: a parameter without a gradient is not updated."""
    frozen, live = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(3))
    frozen.requires_grad_(False)
    opt = FastAdamW([frozen, live], lr=0.1, weight_decay=0.0)
    opt.flatten_()
    assert frozen.grad is None and live.grad is None
    live.grad = torch.ones(3)
    opt.step()
    assert torch.equal(frozen.detach(), torch.ones(2)) and not opt.state.get(frozen)
    p, q = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(2))
    opt = FastAdamW([p, q], lr=0.1, weight_decay=0.0)
    p.grad = torch.ones(2)
    opt.step()  # p has taken one step, q none (it had no gradient)
    opt.flatten_()
    assert q.grad is None and p.untyped_storage().data_ptr() != q.untyped_storage().data_ptr()
    opt.step()
    assert torch.equal(q.detach(), torch.ones(2)) and opt.state[p]["step"] == 2


def test_flatten_refuses_a_loaded_moment_of_another_shape():
    p = nn.Parameter(torch.ones(2, 3))
    opt = FastAdamW([p])
    opt.state[p].update(step=1, exp_avg=torch.zeros(3), exp_avg_sq=torch.zeros(3))
    with pytest.raises(ValueError, match=r"state 'exp_avg' has shape \(3,\), parameter has \(2, 3\)"):
        opt.flatten_()


def test_a_copy_of_a_flattened_optimizer_works():
    model = tiny_model()
    opt = FastAdamW(decay_groups(model, 0.1))
    opt.flatten_()
    train_step(model, opt, *batches(1)[0])
    twin = copy.deepcopy(opt)  # a copy is not flattened: it steps tensor by tensor, as the original would
    twin.zero_grad()
    assert all(p.grad is None for g in twin.param_groups for p in g["params"]) and twin.check_finite
    for g in twin.param_groups:
        for p in g["params"]:
            p.grad = torch.ones_like(p)
    before = [p.detach().clone() for g in twin.param_groups for p in g["params"]]
    twin.step()
    after = [p.detach() for g in twin.param_groups for p in g["params"]]
    assert all(not torch.equal(b, a) for b, a in zip(before, after, strict=True))


# ------------------------------------------------------------------ the page's benchmark table
def test_the_fast_page_tables_every_saved_benchmark():
    """book/fast.md renders cli.benchmark_results(): one row per result file, each written by its script."""
    from conftest import ROOT

    from transformer_lab.cli import BENCHMARKS, benchmark_results

    assert "benchmark_results()" in (ROOT / "book" / "fast.md").read_text(encoding="utf-8")
    saved = {p.stem for p in (ROOT / "benchmarks" / "results").glob("*.json")}
    writers = {n for n in BENCHMARKS if "write_result(" in (ROOT / "benchmarks" / f"{n}.py").read_text("utf-8")}
    assert saved == writers
    rows = benchmark_results()
    assert [r[0] for r in rows] == [n for n in BENCHMARKS if n in saved]
    assert all(isinstance(r[1], str) and r[1] and r[2] > 0 for r in rows)


def test_benchmark_results_reads_the_first_row_of_each_file(tmp_path):
    from transformer_lab.cli import benchmark_results

    machine = {"torch": "2.x", "python": "3.11", "cpu": "x86_64", "cpus": 2}
    (tmp_path / "kernels.json").write_text(json.dumps({"benchmark": "kernels", "machine": machine, "rows": [
        {"compares": "a / b", "ratio": 1.5}, {"compares": "c / d", "ratio": 0.5}]}), encoding="utf-8")
    (tmp_path / "unknown.json").write_text("{}", encoding="utf-8")
    assert benchmark_results(tmp_path) == [("kernels", "a / b", 1.5, "2 CPUs, torch 2.x")]
    (tmp_path / "kernels.json").write_text(json.dumps({"benchmark": "kernels", "machine": {
        **machine, "kernels": "AVX2"}, "rows": [{"compares": "a / b", "ratio": 1.5}]}), encoding="utf-8")
    assert benchmark_results(tmp_path)[0][3] == "2 CPUs, AVX2 kernels, torch 2.x"
