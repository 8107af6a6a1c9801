"""Layer normalisation (chapter 7, numerical analysis).

LayerNorm normalises each token's vector over its ``C`` features to ``\\hat x``, with mean 0 and variance
``sigma^2 / (sigma^2 + eps)`` (1 up to eps), then applies a learned per-feature scale ``weight`` (gamma) and shift
``bias`` (beta):

    y = (x - mu) / sqrt(sigma^2 + eps) * gamma + beta,
    mu = mean(x), sigma^2 = mean((x - mu)^2)     (population variance, over the last dimension)

It equals ``torch.nn.LayerNorm`` in value and gradient: plain tensor operations, differentiated by autograd.
The GPT uses :func:`transformer_lab.fast.fast_layer_norm`, the same formula with chapter 7's backward written by hand.

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


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               eps: float = 1e-5) -> torch.Tensor:
    """Normalise ``x`` (..., C) over its last dimension, then scale by ``weight`` (C,) and shift by ``bias`` (C,).

    ``y = (x - mean) / sqrt(var + eps) * weight + bias`` with the population (biased) variance, as in
    ``nn.LayerNorm``; ``weight`` / ``bias`` of ``None`` mean 1 / 0. Returns a tensor shaped like ``x``.
    The variance is computed in two passes (mean first, then the mean square of ``x - mean``), which does not
    cancel catastrophically the way ``E[x^2] - E[x]^2`` does; float16 / bfloat16 inputs are reduced in float32.
    Autograd differentiates it (chapter 7 derives the closed form it finds).
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
    low = x.dtype in _LOW_PRECISION  # reduce in float32, never in 16 bits
    xf = x.float() if low else x
    mean = xf.mean(-1, keepdim=True)  # mu = (1/C) sum_i x_i                            (..., 1)
    xc = xf - mean  # x - mu                                                           (..., C)
    var = (xc * xc).mean(-1, keepdim=True)  # sigma^2 = (1/C) sum_i (x_i - mu)^2: two passes, no cancellation
    y = xc * torch.rsqrt(var + eps)  # \hat x = (x - mu) / sqrt(sigma^2 + eps)             (..., C)
    if weight is not None:
        y = y * weight.to(y.dtype)  # gamma * \hat x
    if bias is not None:
        y = y + bias.to(y.dtype)  # + beta
    return y.to(x.dtype) if low else y


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

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps:g}, bias={self.bias is not None}"
