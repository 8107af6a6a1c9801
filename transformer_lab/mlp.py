"""The Transformer's feed-forward block and its hand-written backward pass (chapter 4, calculus).

MLP(x) = dropout(GELU(x W₁ᵀ + b₁) W₂ᵀ + b₂), with W₁ = ``fc.weight`` (4C, C) and W₂ = ``proj.weight`` (C, 4C).
:meth:`MLP.backward` composes the backward passes of :mod:`transformer_lab.backprop` by the chain rule and
returns the same gradients ``torch.autograd`` finds.
"""

from __future__ import annotations

import torch
from torch import nn

from transformer_lab._checks import positive_int
from transformer_lab.backprop import gelu, gelu_backward, linear_backward
from transformer_lab.regularization import dropout, dropout_mask


class MLP(nn.Module):
    """fc: Linear(C, d_hidden) → GELU → proj: Linear(d_hidden, C) → dropout; x (..., C) → (..., C)."""

    def __init__(self, d_model: int, d_hidden: int | None = None, *, bias: bool = True, dropout: float = 0.0,
                 approximate: str = "tanh"):
        super().__init__()
        d_hidden = 4 * d_model if d_hidden is None else d_hidden
        d_model, d_hidden = positive_int(d_model, "d_model"), positive_int(d_hidden, "d_hidden")
        if approximate not in ("none", "tanh"):
            raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {dropout!r}")
        self.d_model, self.d_hidden, self.approximate, self.p = d_model, d_hidden, approximate, float(dropout)
        self.fc = nn.Linear(d_model, d_hidden, bias=bias)  # W₁ (4C, C), b₁ (4C,)
        self.proj = nn.Linear(d_hidden, d_model, bias=bias)  # W₂ (C, 4C), b₂ (C,)

    def _check(self, x: torch.Tensor) -> None:
        if x.dim() < 1 or x.shape[-1] != self.d_model:
            raise ValueError(f"MLP expects input (..., {self.d_model}), got shape {tuple(x.shape)}")

    def forward(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
        self._check(x)
        return self._forward(x, generator)

    def _forward(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """:meth:`forward` without its check, for a model that checked its shapes once (the GPT's blocks)."""
        h = self.fc(x)  # (..., 4C)  h = x W₁ᵀ + b₁
        a = self.activation(h)  # (..., 4C)  a = GELU(h)
        y = self.proj(a)  # (..., C)  y = a W₂ᵀ + b₂
        if not (self.training and self.p > 0.0):
            return y
        return dropout(y, self.p, training=True, generator=generator)

    def activation(self, h: torch.Tensor) -> torch.Tensor:
        """GELU(h), elementwise (:func:`~transformer_lab.backprop.gelu`, differentiated by autograd)."""
        return gelu(h, self.approximate)

    def forward_with_cache(self, x: torch.Tensor, *, generator: torch.Generator | None = None):
        """The forward pass without autograd, returning ``(out, cache)`` for :meth:`backward`."""
        self._check(x)
        with torch.no_grad():
            h = self.fc(x)
            a = gelu(h, self.approximate)
            y = self.proj(a)
            mask = None
            if self.training and self.p > 0:
                mask = dropout_mask(y.shape, self.p, generator=generator, dtype=y.dtype, device=y.device)
                y = y * mask
        return y, {"x": x, "h": h, "a": a, "mask": mask}

    def backward(self, grad_out: torch.Tensor, cache: dict) -> dict[str, torch.Tensor]:
        """∂L/∂(x and every parameter) from ∂L/∂out, by the chain rule through dropout, proj, GELU, fc."""
        x, h, a, mask = cache["x"], cache["h"], cache["a"], cache["mask"]
        if tuple(grad_out.shape) != tuple(x.shape):
            raise ValueError(f"grad_out has shape {tuple(grad_out.shape)}, the MLP output has {tuple(x.shape)}")
        has_bias = self.fc.bias is not None
        with torch.no_grad():
            g = grad_out if mask is None else grad_out * mask  # dropout: ∂L/∂y = ∂L/∂out ⊙ m
            g_a, g_w2, g_b2 = linear_backward(g, a, self.proj.weight, bias=has_bias)  # ∂L/∂a = G W₂
            g_h = gelu_backward(g_a, h, self.approximate)  # ∂L/∂h = ∂L/∂a ⊙ GELU′(h)
            g_x, g_w1, g_b1 = linear_backward(g_h, x, self.fc.weight, bias=has_bias)  # ∂L/∂x = ∂L/∂h W₁
        grads = {"x": g_x, "fc.weight": g_w1, "proj.weight": g_w2}
        if has_bias:
            grads.update({"fc.bias": g_b1, "proj.bias": g_b2})
        return grads
