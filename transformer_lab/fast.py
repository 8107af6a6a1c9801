"""The mini-GPT's speed paths (back matter, "Making the mini-GPT fast"): the chapters' formulas, computed faster.

The chapters' modules compute each component with plain tensor operations and let autograd differentiate them.
Here the same numbers come from fewer passes over memory:

* :func:`fast_attention`: attention with its backward pass written by hand (chapters 1 and 2), no (T, T) buffer
  per step of the softmax, and the masked quarter of causal scores never computed (:class:`_CausalAttention`);
* :func:`fast_gelu`: the tanh GELU as x·σ(2u), one sigmoid, with its derivative by hand (chapter 4);
* :func:`fast_layer_norm`: LayerNorm with chapter 4's closed-form backward, few temporaries;
* :class:`FastAdamW`: chapter 3's AdamW over ``_foreach`` chunks or one flat buffer per group, optionally compiled.

:class:`FastMultiHeadAttention`, :class:`FastMLP` and :class:`FastLayerNorm` are the chapters' modules with these
inside, the same parameters and state-dict names; the GPT (:mod:`transformer_lab.gpt`) is built from them.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch

from transformer_lab.attention import _HALF, MultiHeadAttention, _broadcast, merge_heads
from transformer_lab.backprop import _GELU_C, _SATURATED, _SQRT_2_OVER_PI, gelu
from transformer_lab.mlp import MLP
from transformer_lab.norm import LayerNorm
from transformer_lab.optim import AdamW
from transformer_lab.positional import causal_mask

__all__ = ["FastAdamW", "FastLayerNorm", "FastMLP", "FastMultiHeadAttention", "fast_attention", "fast_gelu",
           "fast_layer_norm"]


# ------------------------------------------------------------------------------------------------ attention

def fast_attention(query, key, value, mask=None, scale=None, dropout=0.0, generator=None, is_causal=False,
                   need_weights=False):
    """:func:`~transformer_lab.attention.scaled_dot_product_attention`'s numbers through the hand-written backward
    passes, on inputs already checked (the GPT's blocks: their shapes follow from its config); ``(out, weights)``.

    With autograd recording, ``is_causal``, no dropout, no weights and T_q = T_k >= 32, :class:`_CausalAttention`
    skips the quarter of the scores the mask hides; otherwise :class:`_Attention`. Without autograd, the
    forward alone. Under autocast it computes in its own precision (float32 for 16-bit inputs)."""
    if torch.amp.is_autocast_available(query.device.type) and torch.is_autocast_enabled(query.device.type):
        with torch.autocast(query.device.type, enabled=False):  # our core picks its precision (forward = backward)
            return fast_attention(query, key, value, mask, scale, dropout, generator, is_causal, need_weights)
    if query.dtype in _HALF or key.dtype in _HALF or value.dtype in _HALF:  # computed in float32, rounded once
        wide = [t.float() if t.dtype in _HALF else t for t in (query, key, value)]
        out, weights = fast_attention(*wide, mask, scale, dropout, generator, is_causal, need_weights)
        return out.to(query.dtype), (None if weights is None else weights.to(query.dtype))
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale  # 1/√d_k
    T_q, T_k = query.shape[-2], key.shape[-2]
    grad = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    if grad and is_causal and not need_weights and dropout == 0.0 and T_q == T_k >= _CAUSAL_SPLIT_MIN:
        additive = (_additive(causal_mask(T_q, device=query.device), query) if torch.compiler.is_compiling()
                    else _causal_additive(T_q, query.device, query.dtype))  # compiled: a constant of the graph
        return _CausalAttention.apply(query, key, value, additive, scale), None
    if is_causal:  # one query, the last position, sees every key: no mask at all (the common case when generating)
        mask = causal_mask(T_q, T_k, device=query.device) if T_q > 1 else None
    if not grad:
        out, weights = _attend(query, key, value, mask, scale, dropout, generator)[-2:]  # no autograd bookkeeping
        return out, (weights if need_weights else None)
    out, weights = _Attention.apply(query, key, value, mask, scale, dropout, generator)
    return out, (weights if need_weights else None)


@functools.lru_cache(maxsize=16)
def _causal_additive(T: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The (T, T) causal mask as an additive 0 / -inf matrix, built once per (T, device, dtype); only ever read."""
    return _additive(causal_mask(T, device=device), torch.empty(0, dtype=dtype, device=device))


_CAUSAL_SPLIT_MIN = 32  # hand-chosen, not a measured break-even: near it the split may cost more than it saves
# (a review's one-thread forward + backward timings found it slower at T = 32)


def _additive(mask: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    """The boolean mask as an additive 0 / -inf matrix in ``like``'s dtype (adding is faster than masked_fill)."""
    if mask is None:
        return None
    return torch.zeros(mask.shape, dtype=like.dtype, device=like.device).masked_fill_(~mask, float("-inf"))


def _softmax_weights(q: torch.Tensor, key: torch.Tensor, additive: torch.Tensor | None) -> torch.Tensor:
    """P = softmax(S) with S = q Kᵀ (+ additive): q (..., T_q, d_k) is Q · scale. (..., T_q, T_k)."""
    scores = q @ key.transpose(-2, -1)  # S = (Q / √d_k) Kᵀ   (..., T_q, T_k)
    if additive is not None:  # S_ij = -inf where j may not be attended (in place unless the mask has more dims)
        fits = _broadcast(scores.shape, additive.shape) == tuple(scores.shape)
        scores = scores.add_(additive) if fits else scores + additive
    return _softmax_(scores)


def _softmax_(scores: torch.Tensor) -> torch.Tensor:
    """P = softmax(S) along the last dim, in place, from the scores S (-inf where masked)."""
    p = scores.sub_(scores.amax(dim=-1, keepdim=True))  # S - max S <= 0: e^(S - max S) never overflows
    p = p.exp_()  # e^(S - max S); exactly 0 where masked (e^-inf)
    return p.div_(p.sum(dim=-1, keepdim=True))  # P = softmax(S), each row sums to 1


def _prepare(query, key, value, scale):
    """Q · scale (scaling Q is cheaper than scaling S), K and V made contiguous once, for all products."""
    q = torch.mul(query, scale, out=query.new_empty(query.shape))  # (..., T_q, d_k)
    return q, key.contiguous(), value.contiguous()  # (..., T_k, d_k), (..., T_k, d_v)


def _scores_backward(g_s, q, key, scale):
    """∂L/∂Q and ∂L/∂K from ∂L/∂S, for S = q Kᵀ and q = Q·scale."""
    g_query = (g_s @ key).mul_(scale)  # ∂L/∂Q = scale · ∂L/∂S K   (..., T_q, d_k)
    g_key = g_s.transpose(-2, -1) @ q  # ∂L/∂K = ∂L/∂Sᵀ (Q·scale)   (..., T_k, d_k)
    return g_query, g_key


def _block_backward(g_out, out, q, key, value, p, scale):
    """∂L/∂(Q, K, V) of one block of :class:`_CausalAttention`, O = P V, P = softmax(S), S = scale · Q Kᵀ, from
    G = ∂L/∂O alone; all (N, ·, ·) with N = B·h, so each product is one batched matrix product."""
    g_value = torch.bmm(p.transpose(1, 2), g_out)  # ∂L/∂V = Pᵀ G   (N, T_k, d_v)
    row = (g_out * out).sum(dim=-1, keepdim=True)  # rowsum(∂L/∂P ⊙ P) = rowsum(G ⊙ O)   (N, T_q, 1)
    # scale · ∂L/∂S = scale · P ⊙ (G Vᵀ - rowsum): the product, the shift and the scale in one baddbmm
    g_s = torch.baddbmm(row, g_out, value.transpose(1, 2), beta=-scale, alpha=scale).mul_(p)  # (N, T_q, T_k)
    g_query = torch.bmm(g_s, key)  # ∂L/∂Q = scale · ∂L/∂S K   (N, T_q, d_k)
    g_key = torch.bmm(g_s.transpose(1, 2), q)  # ∂L/∂K = scale · ∂L/∂Sᵀ Q   (N, T_k, d_k)
    return g_query, g_key, g_value


def _attend(query, key, value, mask, scale, dropout, generator):
    """The forward pass of :class:`_Attention`: ``(q, key, value, p, keep, out, weights)``, what its backward needs."""
    q, key, value = _prepare(query, key, value, scale)
    p = _softmax_weights(q, key, _additive(mask, q))  # P = softmax(S)   (..., T_q, T_k)
    if mask is not None and not bool(mask.any(dim=-1).all()):  # only when some row has no allowed key:
        p = p.masked_fill_(~mask.any(dim=-1, keepdim=True), 0.0)  # there P = 0 (instead of 0/0 = NaN)
    weights, keep = p, None
    if dropout > 0.0:
        keep = torch.rand(p.shape, generator=generator, dtype=p.dtype, device=p.device) >= dropout
        keep = keep.to(p.dtype).div_(1.0 - dropout)  # inverted dropout: E[A] = P
        weights = p * keep
    out = weights @ value  # O = A V   (..., T_q, d_v)
    return q, key, value, p, keep, out, weights


class _Attention(torch.autograd.Function):
    """The attention core with the backward pass derived by hand (chapters 1 and 2), one node for autograd.

    Forward:  S = (Q·scale) Kᵀ, S_ij = -inf where masked,  P = softmax(S),  A = P (⊙ dropout keep / (1 - p)),
              O = A V.
    Backward, with G = ∂L/∂O (and ∂L/∂A from the returned weights, if used):
              ∂L/∂V = Aᵀ G,   ∂L/∂A = G Vᵀ,   ∂L/∂P = ∂L/∂A (⊙ keep / (1 - p)),
              ∂L/∂S = P ⊙ (∂L/∂P - rowsum(∂L/∂P ⊙ P))       softmax's Jacobian (diag(P) - P Pᵀ), chapter 2,
              ∂L/∂Q = scale · ∂L/∂S K,   ∂L/∂K = ∂L/∂Sᵀ (Q·scale).
    rowsum(∂L/∂P ⊙ P) = rowsum(G ⊙ O) when only O is used: a (T_q, d_v) product instead of a (T_q, T_k) one.
    Masking and the softmax's steps work in place on the one (..., T_q, T_k) buffer of S, instead of a new buffer
    for each step (the additive mask, when given, is one more buffer, of the boolean mask's shape; a mask with more
    dims than S costs one copy of S).
    """

    @staticmethod
    def forward(ctx, query, key, value, mask, scale, dropout, generator):
        q, key_c, value_c, p, keep, out, weights = _attend(query, key, value, mask, scale, dropout, generator)
        ctx.save_for_backward(q, key_c, value_c, p, keep, out)
        ctx.scale, ctx.shapes = scale, (query.shape, key.shape, value.shape)
        ctx.set_materialize_grads(False)  # g_weights stays None when the weights are not used
        return out, weights

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_out, g_weights):
        q, key, value, p, keep, out = ctx.saved_tensors
        weights = p if keep is None else p * keep
        g_out = torch.zeros_like(out) if g_out is None else g_out.contiguous()  # G   (..., T_q, d_v)
        g_value = weights.transpose(-2, -1) @ g_out  # ∂L/∂V = Aᵀ G   (..., T_k, d_v)
        g_p = g_out @ value.transpose(-2, -1)  # ∂L/∂A = G Vᵀ   (..., T_q, T_k)
        if g_weights is None:
            row = (g_out * out).sum(dim=-1, keepdim=True)  # rowsum(∂L/∂P ⊙ P) = rowsum(G ⊙ O)   (..., T_q, 1)
        else:
            g_p = g_p + g_weights
        if keep is not None:
            g_p = g_p.mul_(keep)  # ∂L/∂P = ∂L/∂A ⊙ keep / (1 - p)
        if g_weights is not None:
            row = (g_p * p).sum(dim=-1, keepdim=True)
        g_s = g_p.sub_(row).mul_(p)  # ∂L/∂S = P ⊙ (∂L/∂P - rowsum(∂L/∂P ⊙ P)); 0 where masked (P = 0)
        g_query, g_key = _scores_backward(g_s, q, key, ctx.scale)
        shape_q, shape_k, shape_v = ctx.shapes  # broadcast leading dims: sum the gradient back to each input
        return (g_query.sum_to_size(shape_q), g_key.sum_to_size(shape_k), g_value.sum_to_size(shape_v),
                None, None, None, None)


class _CausalAttention(torch.autograd.Function):
    """:class:`_Attention` for a causal mask, without dropout and without returning the weights: the same numbers.

    Queries 0 … m-1 (m = ⌊T/2⌋) may see only keys 0 … m-1, so their scores are computed against those keys alone,
    and queries m … T-1 against all T keys: a quarter of the (T, T) score matrix, all of it masked, is never
    computed, in the forward pass or the backward. (PyTorch's fused CPU kernel skips such blocks too.)
    The heads are flattened into one batch dimension N = B·h, so that each product is one ``bmm``, and
    ``baddbmm`` computes S + mask = scale · Q Kᵀ + mask in one call (the scaling and the mask
    ride on the product instead of taking a pass of their own).
    """

    @staticmethod
    def forward(ctx, query, key, value, additive, scale):
        batch = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])  # (B, h)
        T, m = query.shape[-2], query.shape[-2] // 2
        q, key_, value_ = (t.expand(*batch, *t.shape[-2:]).reshape(-1, *t.shape[-2:]) for t in (query, key, value))
        k_t, alpha = key_.transpose(1, 2), scale  # Kᵀ (N, d_k, T); additive: 0 / -inf   (T, T)
        p1 = _softmax_(torch.baddbmm(additive[:m, :m], q[:, :m], k_t[..., :m], alpha=alpha))  # first half (N, m, m)
        p2 = _softmax_(torch.baddbmm(additive[m:], q[:, m:], k_t, alpha=alpha))  # the rest, every key (N, T - m, T)
        out = torch.cat((torch.bmm(p1, value_[:, :m]), torch.bmm(p2, value_)), dim=1)  # O = P V   (N, T, d_v)
        ctx.save_for_backward(q, key_, value_, p1, p2, out)
        ctx.scale, ctx.shapes = scale, (batch, query.shape, key.shape, value.shape)
        return out.view(*batch, T, out.shape[-1])  # (B, h, T, d_v)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_out):
        q, key, value, p1, p2, out = ctx.saved_tensors
        m = p1.shape[-1]
        g_out = g_out.reshape(out.shape)  # G   (N, T, d_v)
        first = (g_out[:, :m], out[:, :m], q[:, :m], key[:, :m], value[:, :m], p1)
        g_q1, g_k1, g_v1 = _block_backward(*first, ctx.scale)
        g_q2, g_key, g_value = _block_backward(g_out[:, m:], out[:, m:], q[:, m:], key, value, p2, ctx.scale)
        g_key[:, :m] += g_k1  # the first m keys serve both halves of the queries
        g_value[:, :m] += g_v1
        batch, shape_q, shape_k, shape_v = ctx.shapes  # broadcast leading dims: sum the gradient back to each input
        return (torch.cat((g_q1, g_q2), dim=1).view(*batch, *shape_q[-2:]).sum_to_size(shape_q),
                g_key.view(*batch, *shape_k[-2:]).sum_to_size(shape_k),
                g_value.view(*batch, *shape_v[-2:]).sum_to_size(shape_v), None, None)


class FastMultiHeadAttention(MultiHeadAttention):
    """:class:`~transformer_lab.attention.MultiHeadAttention` whose attention runs through :func:`fast_attention`;
    the same parameters and state-dict names."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: torch.Tensor | None = None,
               is_causal: bool = False, need_weights: bool = False):
        """:meth:`MultiHeadAttention.attend` through :func:`fast_attention`: q (B, h, T_q, d_k), k, v
        (B, h, T_k, d_k), mask as there -> ``(out (B, T_q, C), weights (B, h, T_q, T_k) or None)``."""
        p = self.dropout if self.training else 0.0
        out, weights = fast_attention(q, k, v, mask, None, p, None, is_causal, need_weights)
        return self.out_proj(merge_heads(out)), weights  # concat(heads) W_Oᵀ + b_O   (B, T_q, C)

    def _attend_causal(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, need_weights: bool = False):
        """:meth:`attend` with ``is_causal=True`` for a caller that checked the shapes once (the GPT's blocks):
        q (B, h, T_q, d_k), k, v (B, h, T_k, d_k) -> ``(out (B, T_q, C), weights or None)``."""
        p = self.dropout if self.training else 0.0
        out, weights = fast_attention(q, k, v, None, None, p, None, True, need_weights)  # (B, h, T_q, d_k)
        B, _, T_q, _ = out.shape
        out = out.transpose(1, 2).reshape(B, T_q, self.d_model)  # merge_heads: concat(heads)   (B, T_q, C)
        return self.out_proj(out), weights  # concat(heads) W_Oᵀ + b_O   (B, T_q, C)


# ------------------------------------------------------------------------------------------------ GELU

def _sigmoid_2u(x: torch.Tensor) -> torch.Tensor:
    """σ(2u) with 2u = 2√(2/π)(x + c x³) = x (a + a c x²): GELU's tanh form is x σ(2u)."""
    a = 2.0 * _SQRT_2_OVER_PI
    return torch.addcmul(x.new_tensor(a), x, x, value=a * _GELU_C).mul_(x).sigmoid_()


class _TanhGELU(torch.autograd.Function):
    """``gelu(x, "tanh")`` and its derivative, written with ½(1 + tanh u) = σ(2u) (one sigmoid, no tanh).

    GELU(x) = ½ x (1 + tanh u) = x σ(2u),  u = √(2/π)(x + c x³);  GELU′(x) = σ(2u) + x σ(2u)(1 − σ(2u)) 2u′(x).
    Same values and gradients as autograd through :func:`~transformer_lab.backprop.gelu`. The gain is fewer
    operations and a backward that reuses σ(2u); ``sigmoid`` alone is not faster than ``tanh`` as a kernel on every
    CPU and kernel set (``benchmarks/kernels.py`` measures the two).
    The backward clamps x to ±10: beyond, σ(1 − σ) < 1e-37 (exactly 0 for x > 10, and for |x| > 10 in float16),
    so the clamp changes GELU′ by less than 1e-35 (|GELU′(x)| < 3e-36 for x < −10), and float16 gives 0 or 1, not
    inf · 0 = NaN.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        s = _sigmoid_2u(x)
        ctx.save_for_backward(x, s)
        return x * s  # x σ(2u)

    @staticmethod
    @torch.autograd.function.once_differentiable  # s was saved without a graph: no second derivative through it
    def backward(ctx, g: torch.Tensor) -> torch.Tensor:
        x, s = ctx.saved_tensors
        a = 2.0 * _SQRT_2_OVER_PI
        xc = x.clamp(-_SATURATED, _SATURATED)  # beyond ±10, σ(1 − σ) < 1e-37: keeps x 2u′ finite in float16
        d = torch.addcmul(x.new_tensor(a), xc, xc, value=3.0 * a * _GELU_C).mul_(xc)  # x 2u′ = x a(1 + 3c x²)
        d = d.mul_(torch.addcmul(s, s, s, value=-1.0)).add_(s)  # σ + x 2u′ σ(1 − σ)
        return d.mul_(g)


def fast_gelu(x: torch.Tensor) -> torch.Tensor:
    """``gelu(x, "tanh")`` = x σ(2u) elementwise, through :class:`_TanhGELU` when x needs a gradient."""
    return _TanhGELU.apply(x) if torch.is_grad_enabled() and x.requires_grad else x * _sigmoid_2u(x)


class FastMLP(MLP):
    """:class:`~transformer_lab.mlp.MLP` whose tanh GELU is :func:`fast_gelu`; the same parameters."""

    def activation(self, h: torch.Tensor) -> torch.Tensor:
        return fast_gelu(h) if self.approximate == "tanh" else gelu(h, self.approximate)


# ------------------------------------------------------------------------------------------------ LayerNorm

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _normalize(x, weight, bias, eps):
    """The forward formulas: ``(y, xhat, rstd, weight)``, the last three in the compute dtype for the backward."""
    low = x.dtype in _LOW_PRECISION  # reduce in float32, never in 16 bits
    xf = x.float() if low else x
    if weight is not None and weight.dtype != xf.dtype:
        weight = weight.to(xf.dtype)  # gamma (C,) in the compute dtype
    if bias is not None and bias.dtype != xf.dtype:
        bias = bias.to(xf.dtype)  # beta (C,)
    mean = xf.mean(-1, keepdim=True)  # mu = (1/C) sum_i x_i                        (..., 1)
    xc = xf - mean  # x - mu                                                       (..., C)
    buf = torch.mul(xc, xc)  # (x - mu)^2, a buffer reused for the output            (..., C)
    var = buf.mean(-1, keepdim=True)  # sigma^2 = (1/C) sum_i (x_i - mu)^2: two passes, no cancellation
    rstd = var.add_(eps).rsqrt_()  # 1 / sqrt(sigma^2 + eps)                       (..., 1)
    xhat = xc.mul_(rstd)  # \hat x = (x - mu) / sqrt(sigma^2 + eps)                  (..., C)
    if weight is not None and bias is not None:
        y = torch.addcmul(bias, xhat, weight, out=buf)  # y = gamma * \hat x + beta
    elif weight is not None:
        y = torch.mul(xhat, weight, out=buf)  # y = gamma * \hat x
    elif bias is not None:
        y = torch.add(xhat, bias, out=buf)  # y = \hat x + beta
    else:
        y = buf.copy_(xhat)
    return (y.to(x.dtype) if low else y), xhat, rstd, weight


class _LayerNormFunction(torch.autograd.Function):
    """Forward and backward of LayerNorm by the formulas of chapter 4 (statistics in float32 for 16-bit x).

    The backward reads saved tensors that autograd did not record, so it is marked ``once_differentiable``:
    differentiating it again raises a ``RuntimeError`` instead of returning a wrong second derivative.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        ctx.dtypes = tuple(None if t is None else t.dtype for t in (x, weight, bias))  # for the gradients
        y, xhat, rstd, weight = _normalize(x, weight, bias, eps)
        ctx.save_for_backward(xhat, rstd, weight)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy):
        xhat, rstd, weight = ctx.saved_tensors
        C = xhat.shape[-1]
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        low = x_dtype in _LOW_PRECISION
        gy = gy.float() if low else gy  # (..., C)
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        buf = torch.mul(gy, xhat)  # gy * \hat x, one full-size buffer for everything below   (..., C)
        gw = buf.reshape(-1, C).sum(0) if need_w else None  # dL/dgamma = sum over tokens
        gb = gy.reshape(-1, C).sum(0) if need_b else None  # dL/dbeta = sum over tokens
        gx = None
        if need_x:  # with g = dL/d\hat x = gy * gamma:
            if weight is not None:
                s1 = (gy @ weight).unsqueeze_(-1)  # sum(g) = gy . gamma                          (..., 1)
                s2 = (buf @ weight).unsqueeze_(-1)  # sum(g * \hat x)                              (..., 1)
                g = torch.mul(gy, weight, out=buf)  # g = gy * gamma                              (..., C)
            else:
                s1, s2 = gy.sum(-1, keepdim=True), buf.sum(-1, keepdim=True)
                g = buf.copy_(gy)
            # dL/dx = (g - mean(g) - \hat x * mean(g * \hat x)) / sqrt(sigma^2 + eps), the means as sums / C
            gx = g.sub_(s1, alpha=1 / C).addcmul_(xhat, s2, value=-1 / C).mul_(rstd)
        if low or {w_dtype, b_dtype} - {None, xhat.dtype}:  # gradients in the dtypes of their inputs
            gx, gw, gb = (None if t is None else t.to(d) for t, d in ((gx, x_dtype), (gw, w_dtype), (gb, b_dtype)))
        return gx, gw, gb, None


def fast_layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                    eps: float) -> torch.Tensor:
    """:func:`~transformer_lab.norm.layer_norm` on checked inputs: x (..., C), weight and bias (C,) or None.

    Through :class:`_LayerNormFunction` when something needs a gradient; first-order only."""
    if torch.is_grad_enabled() and (x.requires_grad or (weight is not None and weight.requires_grad)
                                    or (bias is not None and bias.requires_grad)):
        return _LayerNormFunction.apply(x, weight, bias, eps)
    return _normalize(x, weight, bias, eps)[0]  # nothing to differentiate: skip autograd's bookkeeping

class FastLayerNorm(LayerNorm):
    """:class:`~transformer_lab.norm.LayerNorm` computed by :func:`fast_layer_norm`; the same parameters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (..., C) -> (..., C)."""
        if not (isinstance(x, torch.Tensor) and x.is_floating_point() and x.dim() >= 1 and x.shape[-1] == self.d_model):
            raise ValueError(f"LayerNorm({self.d_model}): expected a floating-point x (..., {self.d_model}), got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` without its check, for a model that checked its shapes once (the GPT's blocks)."""
        return fast_layer_norm(x, self.weight, self.bias, self.eps)


# ------------------------------------------------------------------------------------------------ AdamW

_CHUNK = 1 << 16  # numbers per _foreach_update call: θ, g, m, v and √v̂ + ε take 5 × 64 Ki × 4 B = 1.25 MiB


def _chunks(params: list[torch.Tensor], size: int = _CHUNK) -> list[slice]:
    """Consecutive runs of ``params`` holding at most ``size`` numbers together (a larger tensor runs alone)."""
    out, start, n = [], 0, 0
    for i, p in enumerate(params):
        if n and n + p.numel() > size:
            out.append(slice(start, i))
            start, n = i, 0
        n += p.numel()
    return [*out, slice(start, len(params))] if params else out


def _flat_update(param, grad, exp_avg, exp_avg_sq, hyper) -> None:
    """:func:`_foreach_update` for one flat tensor, written for ``torch.compile``: the hyperparameters come in one
    tensor (so a new learning rate or step does not compile again), ``hyper`` = (ηλ, 1 − β₁, β₂, ε,
    −η / (1 − β₁ᵗ), √(1 − β₂ᵗ)). Compiled with ``dynamic=False``: one graph per flat-tensor length, shared by every
    optimizer in the process (more than torch._dynamo's recompile limit of such lengths would run eagerly)."""
    decay, one_minus_beta1, beta2, eps, step_size, bc2_sqrt = hyper.unbind()
    param.mul_(1 - decay)  # θ ← θ(1 − ηλ)
    exp_avg.lerp_(grad, one_minus_beta1)  # m ← β₁ m + (1 − β₁) g
    exp_avg_sq.mul_(beta2).add_((1 - beta2) * grad * grad)  # v ← β₂ v + (1 − β₂) g²
    param.add_(step_size * exp_avg / (exp_avg_sq.sqrt() / bc2_sqrt + eps))  # θ ← θ − η m̂ / (√v̂ + ε)


def _flat_clip(grads: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` over the flat gradient tensors (one per group), written for
    ``torch.compile``: ‖g‖ = torch's ``get_total_norm`` (the L2 norm of the tensors' L2 norms), then every gradient
    times min(1, max_norm / (‖g‖ + 1e-6)). Returns ‖g‖ (NaN or inf when a gradient is not finite). Compiled like
    :func:`_flat_update`: one graph per set of flat-tensor lengths."""
    norm = torch.nn.utils.get_total_norm(grads)
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
    return norm


@dataclass(eq=False)
class _FlatGroup:
    """A flattened group's tensors, each (n,): the group's numbers, each parameter's starting on a 64-byte boundary
    (n counts the zero padding between them), and the views handed out of them."""

    param: torch.Tensor
    grad: torch.Tensor
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    views: list = field(default_factory=list)  # per parameter: (it, its data_ptr, its gradient, its m, its v)


def _foreach_update(params, grads, ms, vs, steps, group) -> None:
    """:meth:`AdamW._update` for a list of tensors, each formula one ``torch._foreach_*`` call over all of them."""
    lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
    if wd != 0:
        torch._foreach_mul_(params, 1 - lr * wd)  # θ ← θ(1 − ηλ)
    torch._foreach_lerp_(ms, grads, 1 - beta1)  # m ← β₁ m + (1 − β₁) g
    torch._foreach_mul_(vs, beta2)
    torch._foreach_addcmul_(vs, grads, grads, value=1 - beta2)  # v ← β₂ v + (1 − β₂) g²
    step_sizes = [-lr / (1 - beta1**t) for t in steps]  # −η / (1 − β₁ᵗ)
    bc2_sqrt = [math.sqrt(1 - beta2**t) for t in steps]  # √(1 − β₂ᵗ)
    denom = torch._foreach_sqrt(vs)
    torch._foreach_div_(denom, bc2_sqrt)
    torch._foreach_add_(denom, eps)  # √v̂ + ε
    torch._foreach_addcdiv_(params, ms, denom, step_sizes)  # θ ← θ − η m̂ / (√v̂ + ε)


class FastAdamW(AdamW):
    """:class:`~transformer_lab.optim.AdamW`, the same update in fewer passes over memory; what the trainer uses.

    Without :meth:`flatten_`, a group's tensors are updated with ``torch._foreach_*`` calls in chunks of at most
    ``_CHUNK`` numbers (eight operations per chunk, not per tensor). After it, each group is one flat tensor apiece
    for parameters, gradients and moments: eight operations per group, or one compiled kernel.
    """

    # set per optimizer by flatten_(); class defaults for a copy (torch.optim's __getstate__ keeps only the state)
    _flat: list[_FlatGroup | None] | None = None  # one per group
    _kernel = None  # _flat_update compiled, with flatten_(compile=True)
    _clip = None  # _flat_clip compiled, with flatten_(compile=True)

    def _step_group(self, i: int, group: dict, params: list[torch.Tensor]) -> None:
        flat = self._intact(i)  # then every parameter of the group has its gradient view: none left out
        if flat is not None:
            state = self.state.get(params[0])
            t = (state["step"] if state else 0) + 1  # flatten_ checked that the group's steps agree
            for p, _, _, m, v in flat.views:
                self.state[p].update(step=t, exp_avg=m, exp_avg_sq=v)
            if self._kernel is None:
                _foreach_update([flat.param], [flat.grad], [flat.exp_avg], [flat.exp_avg_sq], [t], group)
            else:
                (beta1, beta2), lr = group["betas"], group["lr"]
                hyper = torch.tensor([lr * group["weight_decay"], 1 - beta1, beta2, group["eps"],
                                      -lr / (1 - beta1**t), math.sqrt(1 - beta2**t)],
                                     dtype=torch.promote_types(flat.param.dtype, torch.float32))
                self._kernel(flat.param, flat.grad, flat.exp_avg, flat.exp_avg_sq, hyper.to(flat.param.device))
            return
        states = [self._advance(p) for p in params]
        grads, steps = [p.grad for p in params], [s["step"] for s in states]
        ms, vs = [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]
        for c in _chunks(params):  # the same arithmetic as one call, without cache misses between ops
            _foreach_update(params[c], grads[c], ms[c], vs[c], steps[c], group)

    def flatten_(self, *, compile: bool = False) -> None:
        """Give each group one contiguous tensor for its parameters, one for their gradients and one for each
        moment; every parameter, gradient and moment becomes a view into them (values kept), so a step updates a
        group in eight operations instead of eight per tensor. A group is left as it is when its parameters differ
        in dtype or device, when one is not contiguous or does not require a gradient, or when their loaded states
        took different numbers of steps. A loaded moment of the wrong shape raises ``ValueError``.

        Afterwards :meth:`zero_grad` fills those gradients with zeros (it never sets them to ``None``: the views
        would be lost), so every parameter of a flattened group is updated at every step, as in a model that uses
        all its parameters in every forward pass. Moving the parameters (``model.to``) or replacing a gradient
        ends the flat layout of that group: the step then falls back to the per-tensor update. A loaded state is
        flattened again (:meth:`load_state_dict`).

        ``compile=True`` (the trainer's default when it compiles the model) runs a flat group's update through
        ``torch.compile`` (:func:`_flat_update`): one generated kernel instead of eight passes over the tensors,
        compiled once for all steps and learning rates; equal to the eager update up to float round-off. It also
        compiles :meth:`clip_grad_norm_` over the flat gradients."""
        self._flat = [self._flatten_group(g["params"]) for g in self.param_groups]
        if compile and self._kernel is None:
            # not fullgraph: past torch._dynamo's recompile limit of shapes, a call runs eagerly instead of failing
            self._kernel = torch.compile(_flat_update, dynamic=False)
            self._clip = torch.compile(_flat_clip, dynamic=False)

    def clip_grad_norm_(self, params, max_norm: float) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_(params, max_norm)``: scale the gradients of ``params`` by
        min(1, max_norm / (‖g‖ + 1e-6)), ‖g‖ the L2 norm of all of them together; returns ‖g‖ (a 0-dim tensor).

        After ``flatten_(compile=True)``, when ``params`` are exactly this optimizer's parameters and every group
        is flat, one compiled kernel (:func:`_flat_clip`) does it over the flat gradients (two passes: the norm, then
        the scaling) instead of passes per tensor: the same formula, equal up to float round-off (the squares are
        summed in another order).
        Otherwise it is torch's function, bit for bit."""
        params = list(params)
        flats = None if self._clip is None else self._all_flat(params)
        if flats is None:
            return torch.nn.utils.clip_grad_norm_(params, max_norm)
        return self._clip([f.grad for f in flats], float(max_norm))

    def _all_flat(self, params: list[torch.Tensor]) -> list[_FlatGroup] | None:
        """Every group's flat tensors, if every group is intact and ``params`` are exactly the groups' parameters,
        each once (in any order)."""
        flats = [self._intact(i) for i in range(len(self.param_groups))]
        given = {id(p) for p in params}
        if None in flats or len(given) != len(params) or given != {id(p) for g in self.param_groups
                                                                   for p in g["params"]}:
            return None
        return flats

    def _flatten_group(self, params: list[torch.Tensor]) -> _FlatGroup | None:
        states = [self.state.get(p) for p in params]
        for p, state in zip(params, states, strict=True):
            for key in ("exp_avg", "exp_avg_sq") if state else ():
                if state[key].shape != p.shape:
                    raise ValueError(f"state {key!r} has shape {tuple(state[key].shape)}, parameter has "
                                     f"{tuple(p.shape)} (a state_dict from another model?)")
        if (not params or len({(p.dtype, p.device) for p in params}) > 1
                or not all(p.is_contiguous() and p.requires_grad for p in params)
                or len({state["step"] if state else None for state in states}) > 1):
            return None  # left as it is, updated tensor by tensor (checked before anything is moved)
        first = params[0]
        align = max(1, 64 // first.element_size())  # each view starts on a 64-byte boundary, as a tensor of its own
        starts, n = [], 0
        for p in params:
            starts.append(n)
            n += -(-p.numel() // align) * align
        # the padding between views stays 0 in all four tensors: its update is 0
        flat = _FlatGroup(*(torch.zeros(n, dtype=first.dtype, device=first.device) for _ in range(4)))
        for p, state, start in zip(params, states, starts, strict=True):
            part = slice(start, start + p.numel())  # p's numbers in each flat tensor
            view = [t[part].view_as(p) for t in (flat.param, flat.grad, flat.exp_avg, flat.exp_avg_sq)]
            view[0].copy_(p.detach())
            p.data = view[0]
            if p.grad is not None:
                view[1].copy_(p.grad)
            p.grad = view[1]
            if state:  # moments from earlier steps or a loaded state; a new state gets the views at its first step
                view[2].copy_(state["exp_avg"])
                view[3].copy_(state["exp_avg_sq"])
                state.update(exp_avg=view[2], exp_avg_sq=view[3])
            flat.views.append((p, p.data_ptr(), *view[1:]))
        return flat

    def _intact(self, i: int) -> _FlatGroup | None:
        """Group i's flat tensors if every parameter, gradient and moment of the group is still a view of them."""
        flat = None if self._flat is None or i >= len(self._flat) else self._flat[i]
        if flat is None or len(self.param_groups[i]["params"]) != len(flat.views):
            return None
        for p, (q, ptr, g, m, v) in zip(self.param_groups[i]["params"], flat.views, strict=True):
            state = self.state.get(p)
            if p is not q or not p.requires_grad or p.data_ptr() != ptr or p.grad is not g or (state and (
                    state["exp_avg"] is not m or state["exp_avg_sq"] is not v)):
                return None
        return flat

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the gradients: a flattened group's with one fill (kept as views), the others as ``torch.optim``
        does (set to ``None``, or zeroed in place with ``set_to_none=False``)."""
        for i, group in enumerate(self.param_groups):
            flat = self._intact(i)
            if flat is not None:
                flat.grad.zero_()
                continue
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                    continue
                if p.grad.grad_fn is not None:
                    p.grad.detach_()
                else:
                    p.grad.requires_grad_(False)
                p.grad.zero_()

    def load_state_dict(self, state_dict: dict) -> None:
        """:meth:`AdamW.load_state_dict`, then the loaded moments go into the flat layout, if there is one."""
        super().load_state_dict(state_dict)
        if self._flat is not None:
            self.flatten_()
