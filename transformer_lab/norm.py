"""Layer normalisation (chapter 7, numerical analysis).

LayerNorm rescales each token's vector to mean 0 and variance ``sigma^2 / (sigma^2 + eps)`` (1 up to eps) over its
``C`` features, then applies a learned per-feature scale ``weight`` (gamma) and shift ``bias`` (beta):

    y = (x - mu) / sqrt(sigma^2 + eps) * gamma + beta,
    mu = mean(x), sigma^2 = mean((x - mu)^2)     (population variance, over the last dimension)

It equals ``torch.nn.LayerNorm`` in value and gradient. The forward pass takes the mean, then the mean square of
``x - mean`` (two passes; ``torch.var_mean`` is several times slower on a CPU) and ``torch.rsqrt``, and writes few
temporaries, because the capstone calls it twice per block. The backward pass is written by hand and is
first-order only: a second derivative through it (double backward, ``create_graph=True``) raises, where
``nn.LayerNorm`` supports one; use ``torch.nn.functional.layer_norm`` for Hessian-vector products.

Range: the statistics are computed in the compute dtype (float32 for 16-bit inputs), so once ``C * sigma^2``
exceeds its largest number (in float32, ``sigma > 1.8e19 / sqrt(C)``) the variance is ``inf``, ``rsqrt`` gives 0
and the output is silently ``0 * gamma + beta`` (``F.layer_norm`` returns 0 there too, then NaN further out).
"""

from __future__ import annotations

import torch
from torch import nn

from transformer_lab._checks import positive_int

__all__ = ["LayerNorm", "layer_norm"]


def _check_param(name: str, p: torch.Tensor | None, x: torch.Tensor) -> None:
    if p is None:
        return
    if not isinstance(p, torch.Tensor):
        raise ValueError(f"layer_norm: {name} must be a tensor of shape ({x.shape[-1]},), got {type(p).__name__}")
    if p.shape != x.shape[-1:]:
        raise ValueError(f"layer_norm: {name} must have shape ({x.shape[-1]},) to match the last dimension of x "
                         f"{tuple(x.shape)}, got {tuple(p.shape)}")


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
    """Forward and backward of LayerNorm by the formulas of chapter 7 (statistics in float32 for 16-bit x).

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


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               eps: float = 1e-5) -> torch.Tensor:
    """Normalise ``x`` (..., C) over its last dimension, then scale by ``weight`` (C,) and shift by ``bias`` (C,).

    ``y = (x - mean) / sqrt(var + eps) * weight + bias`` with the population (biased) variance, as in
    ``nn.LayerNorm``; ``weight`` / ``bias`` of ``None`` mean 1 / 0. Returns a tensor shaped like ``x``.
    The variance is computed in two passes (mean first, then the mean square of ``x - mean``), which does not
    cancel catastrophically the way ``E[x^2] - E[x]^2`` does; float16 / bfloat16 inputs are reduced in float32.
    The gradient is the closed form derived in chapter 7 (equal to autograd's and ``nn.LayerNorm``'s); it is
    first-order only (a second derivative raises ``RuntimeError``; ``F.layer_norm`` supports one).
    """
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"layer_norm: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(f"layer_norm: x must have at least one dimension with C >= 1 features, got shape "
                         f"{tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"layer_norm: x must be a floating-point tensor, got {x.dtype}")
    if not eps >= 0:  # also rejects NaN
        raise ValueError(f"layer_norm: eps must be >= 0, got {eps}")
    _check_param("weight", weight, x)
    _check_param("bias", bias, x)
    return _layer_norm(x, weight, bias, float(eps))


def _layer_norm(x, weight, bias, eps: float) -> torch.Tensor:
    """:func:`layer_norm` on checked inputs: through autograd only when something needs a gradient."""
    if torch.is_grad_enabled() and (x.requires_grad or (weight is not None and weight.requires_grad)
                                    or (bias is not None and bias.requires_grad)):
        return _LayerNormFunction.apply(x, weight, bias, eps)
    return _normalize(x, weight, bias, eps)[0]  # nothing to differentiate: skip autograd's bookkeeping


class LayerNorm(nn.Module):
    """LayerNorm over the last dimension (size ``d_model``) with learned ``weight`` (ones) and ``bias`` (zeros).

    Parameter names match ``nn.LayerNorm``, so state dicts load either way. ``bias=False`` drops the shift.
    """

    def __init__(self, d_model: int, *, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        d_model = positive_int(d_model, "LayerNorm: d_model")
        if not eps >= 0:
            raise ValueError(f"LayerNorm: eps must be >= 0, got {eps}")
        self.d_model, self.eps = d_model, float(eps)
        self.weight = nn.Parameter(torch.ones(d_model))  # gamma  (C,)
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None  # beta  (C,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (..., C) -> (..., C)."""
        if isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[-1] != self.d_model:
            raise ValueError(f"LayerNorm({self.d_model}): expected x (..., {self.d_model}), got {tuple(x.shape)}")
        return layer_norm(x, self.weight, self.bias, self.eps)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` without its checks, for a model that checked its shapes once (the GPT's blocks)."""
        return _layer_norm(x, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps:g}, bias={self.bias is not None}"
