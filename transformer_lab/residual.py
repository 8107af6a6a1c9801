"""Residual blocks, pre-LN and post-LN (chapter 7, numerical analysis).

A Transformer block adds each sub-layer's output to its input, ``x + F(x)``, so the Jacobian of a block is
``I + dF/dx``: the identity carries gradients through any depth. Where the LayerNorm sits decides what the
residual stream does:

* **pre-LN** (GPT-2, our capstone):  ``x + F(LN(x))`` -- the stream itself is never normalised;
* **post-LN** (the original Transformer): ``LN(x + F(x))`` -- every block renormalises the stream.

:func:`depth_profile` measures, for a stack of blocks, the activation and gradient size at every depth: the
numbers behind chapter 7's figure on vanishing and exploding signals.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .norm import LayerNorm

__all__ = ["ARRANGEMENTS", "PostLNResidual", "PreLNResidual", "depth_profile", "make_block"]

ARRANGEMENTS = ("plain", "residual", "post-ln", "pre-ln")
"""Ways to stack a sub-layer F: ``F(x)``, ``x + F(x)``, ``LN(x + F(x))``, ``x + F(LN(x))``."""


def _check_sublayer(cls: str, d_model: int, sublayer) -> None:
    if not isinstance(d_model, int) or isinstance(d_model, bool) or d_model < 1:
        raise ValueError(f"{cls}: d_model must be a positive int, got {d_model!r}")
    if not callable(sublayer):
        raise ValueError(f"{cls}: sublayer must be callable (an nn.Module or function x -> x), "
                         f"got {type(sublayer).__name__}")


def _check_input(cls: str, d_model: int, x) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != d_model:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{cls}({d_model}): expected x of shape (..., {d_model}), got {shape}")


class _LNResidual(nn.Module):
    """A residual connection around ``sublayer`` with one LayerNorm; subclasses place the LayerNorm."""

    def __init__(self, d_model: int, sublayer: Callable[[torch.Tensor], torch.Tensor], *, eps: float = 1e-5):
        super().__init__()
        _check_sublayer(type(self).__name__, d_model, sublayer)
        self.d_model = d_model
        self.ln = LayerNorm(d_model, eps=eps)
        self.sublayer = sublayer


class PreLNResidual(_LNResidual):
    """``x + sublayer(LN(x))`` for ``x`` (..., d_model): the GPT-2 / capstone arrangement."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_input("PreLNResidual", self.d_model, x)
        return x + self.sublayer(self.ln(x))  # x_{l+1} = x_l + F(LN(x_l))   (..., C)


class PostLNResidual(_LNResidual):
    """``LN(x + sublayer(x))`` for ``x`` (..., d_model): the original Transformer's arrangement."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_input("PostLNResidual", self.d_model, x)
        return self.ln(x + self.sublayer(x))  # x_{l+1} = LN(x_l + F(x_l))   (..., C)


class _Plain(nn.Module):
    def __init__(self, sublayer):
        super().__init__()
        self.sublayer = sublayer

    def forward(self, x):
        return self.sublayer(x)  # x_{l+1} = F(x_l)


class _Residual(nn.Module):
    def __init__(self, sublayer):
        super().__init__()
        self.sublayer = sublayer

    def forward(self, x):
        return x + self.sublayer(x)  # x_{l+1} = x_l + F(x_l)


def make_block(arrangement: str, d_model: int, sublayer: Callable[[torch.Tensor], torch.Tensor]) -> nn.Module:
    """One block of the given ``arrangement`` (one of :data:`ARRANGEMENTS`) around ``sublayer``."""
    if arrangement not in ARRANGEMENTS:
        raise ValueError(f"arrangement must be one of {ARRANGEMENTS}, got {arrangement!r}")
    _check_sublayer("make_block", d_model, sublayer)
    return {"plain": lambda: _Plain(sublayer), "residual": lambda: _Residual(sublayer),
            "post-ln": lambda: PostLNResidual(d_model, sublayer),
            "pre-ln": lambda: PreLNResidual(d_model, sublayer)}[arrangement]()


def depth_profile(arrangement: str, *, n_layer: int, d_model: int = 64, n_tokens: int = 256, gain: float = 1.0,
                  seed: int = 0, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Push random tokens through ``n_layer`` blocks of ``arrangement`` and measure every depth.

    Each sub-layer is a two-layer ReLU MLP ``F(x) = relu(x W_1) W_2`` with ``W_1 ~ N(0, 2 / C)`` (He
    initialisation, which keeps the mean square through a ReLU) and ``W_2 ~ N(0, gain^2 / C)``, so ``F``
    multiplies the root mean square of its input by about ``gain``; LayerNorms have weight 1 and bias 0. The
    loss is ``sum(x_L * r)`` for a fixed random ``r``, so the gradient entering the top is unit-variance noise.
    Returns ``{"activation_rms": (n_layer + 1,), "gradient_rms": (n_layer + 1,)}``: the root mean square of the
    stream ``x_l`` and of ``dLoss/dx_l`` at the input (index 0) and after every block.
    """
    if not isinstance(n_layer, int) or n_layer < 1:
        raise ValueError(f"depth_profile: n_layer must be a positive int, got {n_layer!r}")
    if not gain > 0:
        raise ValueError(f"depth_profile: gain must be > 0, got {gain}")
    g = torch.Generator().manual_seed(seed)
    C = d_model
    W1 = torch.randn(n_layer, C, C, generator=g, dtype=dtype) * (2.0 / C) ** 0.5  # He: Var(W_1) = 2 / C
    W2 = torch.randn(n_layer, C, C, generator=g, dtype=dtype) * (gain / C**0.5)  # Var(W_2) = gain^2 / C
    x = torch.randn(n_tokens, C, generator=g, dtype=dtype)  # (N, C) unit-variance input
    r = torch.randn(n_tokens, C, generator=g, dtype=dtype)
    xs = [x.requires_grad_()]
    for l in range(n_layer):
        F = lambda v, l=l: torch.relu(v @ W1[l]) @ W2[l]  # noqa: E731  F(v) = relu(v W_1) W_2
        out = make_block(arrangement, C, F).to(dtype)(xs[-1])  # the arrangement's block around F
        out.retain_grad()
        xs.append(out)
    (xs[-1] * r).sum().backward()
    rms = lambda t: t.detach().pow(2).mean().sqrt()  # noqa: E731
    return {"activation_rms": torch.stack([rms(t) for t in xs]), "gradient_rms": torch.stack([rms(t.grad) for t in xs])}
