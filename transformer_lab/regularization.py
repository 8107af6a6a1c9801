"""Dropout, the regularizer (chapter 3, optimization).

Inverted dropout: in training each entry is kept with probability 1 − p and scaled by 1 / (1 − p), so the
expected output equals the input, E[dropout(x)] = x; at evaluation it is the identity. The uniform numbers that
decide "keep" are drawn in float32 at least (float64 for float64 inputs): drawn in bfloat16, whose grid near 1
is 2⁻⁸, P(keep) would be off by about 2⁻⁹ and p = 0.999 would keep nothing. In float16/bfloat16 the output
x/(1 − p) is computed in float32, then rounded to x's dtype, so there E[dropout(x)] = x holds up to that
rounding. It changes *which* function training finds (a regularizer, like weight decay), not *how* the optimizer
steps.
"""

from __future__ import annotations

import torch
from torch import nn


def _check_p(p) -> None:
    if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability p must lie in [0, 1], got {p!r}")


def _draw_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for float16/bfloat16 (a fine enough uniform grid), else ``dtype`` itself."""
    return torch.promote_types(dtype, torch.float32)


def dropout_mask(shape, p: float, *, generator: torch.Generator | None = None, dtype=torch.float32,
                 device=None) -> torch.Tensor:
    """The scaled keep-mask: entries 1/(1 − p) with probability 1 − p, else 0 (all 0 when p = 1).

    The uniforms are drawn in float32 at least, whatever ``dtype``; in float16/bfloat16 the entry 1/(1 − p) is
    rounded to ``dtype``."""
    _check_p(p)
    if p == 1.0:
        return torch.zeros(shape, dtype=dtype, device=device)
    keep = torch.rand(shape, generator=generator, dtype=_draw_dtype(dtype), device=device) >= p  # P(keep) = 1 − p
    return keep.to(dtype) / (1.0 - p)  # inverted scaling keeps E[mask] = 1


def dropout(x: torch.Tensor, p: float, *, training: bool = True,
            generator: torch.Generator | None = None) -> torch.Tensor:
    """Inverted dropout of ``x`` (any shape): ``x * mask`` with ``mask`` from :func:`dropout_mask`."""
    _check_p(p)
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError(f"dropout expects a floating-point tensor, got {type(x).__name__}"
                         f"{'' if not isinstance(x, torch.Tensor) else ' of dtype ' + str(x.dtype)}")
    if not training or p == 0.0:
        return x
    wide = _draw_dtype(x.dtype)  # in float16/bfloat16: x/(1 − p) computed in float32, then rounded to x.dtype
    mask = dropout_mask(x.shape, p, generator=generator, dtype=wide, device=x.device)
    return (x * mask).to(x.dtype)  # x ⊙ keep / (1 − p)


class Dropout(nn.Module):
    """Module form of :func:`dropout`; active only in ``train()`` mode."""

    def __init__(self, p: float = 0.1):
        super().__init__()
        _check_p(p)
        self.p = float(p)

    def forward(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
        return dropout(x, self.p, training=self.training, generator=generator)

    def extra_repr(self) -> str:
        return f"p={self.p}"
