"""Residual blocks, pre-LN and post-LN (chapter 7, numerical analysis).

A Transformer block adds each sub-layer's output to its input, ``x + F(x)``, so the Jacobian of a block is
``I + dF/dx``: the identity gives gradients a path through any depth (the whole story while the branches are
small). Where the LayerNorm sits decides what the residual stream does:

* **pre-LN** (GPT-2, our capstone):  ``x + F(LN(x))`` -- the stream itself is never normalised;
* **post-LN** (the original Transformer): ``LN(x + F(x))`` -- every block renormalises the stream.

:func:`depth_profile` measures, for a stack of blocks, the activation and gradient size at every depth: the
numbers behind chapter 7's figure on vanishing and exploding signals. :func:`output_sensitivity` measures how much
a small change of every weight moves the stack's output (the "amplification effect" of Liu et al., 2020).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ._checks import positive_int, shape_or_type
from .norm import LayerNorm, layer_norm

__all__ = ["ARRANGEMENTS", "PostLNResidual", "PreLNResidual", "depth_profile", "make_block", "output_sensitivity"]

ARRANGEMENTS = ("plain", "residual", "post-ln", "pre-ln")
"""Ways to stack a sub-layer F: ``F(x)``, ``x + F(x)``, ``LN(x + F(x))``, ``x + F(LN(x))``."""


def _check_sublayer(cls: str, d_model: int, sublayer) -> None:
    positive_int(d_model, f"{cls}: d_model")
    if not callable(sublayer):
        raise ValueError(f"{cls}: sublayer must be callable (an nn.Module or function x -> x), "
                         f"got {type(sublayer).__name__}")


def _check_input(cls: str, d_model: int, x) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != d_model:
        raise ValueError(f"{cls}({d_model}): expected x of shape (..., {d_model}), got {shape_or_type(x)}")


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


def _mlp_weights(n_layer: int, C: int, gain: float, g: torch.Generator, dtype: torch.dtype):
    """``W_1 ~ N(0, 2 / C)`` (He: keeps the mean square through a ReLU) and ``W_2 ~ N(0, gain^2 / C)``,
    each (n_layer, C, C), so that ``F(v) = relu(v W_1) W_2`` multiplies the rms of ``v`` by about ``gain``."""
    W1 = torch.randn(n_layer, C, C, generator=g, dtype=dtype) * (2.0 / C) ** 0.5  # Var(W_1) = 2 / C
    W2 = torch.randn(n_layer, C, C, generator=g, dtype=dtype) * (gain / C**0.5)  # Var(W_2) = gain^2 / C
    return W1, W2


def _stack(arrangement: str, x: torch.Tensor, W1: torch.Tensor, W2: torch.Tensor) -> list[torch.Tensor]:
    """``[x_0, x_1, ..., x_L]``: ``x`` (N, C) pushed through one block of ``arrangement`` per layer of weights."""
    xs = [x]
    for l in range(W1.shape[0]):
        F = lambda v, l=l: torch.relu(v @ W1[l]) @ W2[l]  # noqa: E731  F(v) = relu(v W_1) W_2
        xs.append(make_block(arrangement, x.shape[-1], F).to(x.dtype)(xs[-1]))  # the arrangement's block around F
    return xs


def _check_profile_args(fn: str, arrangement: str, n_layer, gain) -> None:
    if arrangement not in ARRANGEMENTS:
        raise ValueError(f"arrangement must be one of {ARRANGEMENTS}, got {arrangement!r}")
    positive_int(n_layer, f"{fn}: n_layer")
    if not gain > 0:
        raise ValueError(f"{fn}: gain must be > 0, got {gain}")


def depth_profile(arrangement: str, *, n_layer: int, d_model: int = 64, n_tokens: int = 256, gain: float = 1.0,
                  seed: int = 0, dtype: torch.dtype = torch.float32,
                  final_norm: bool = False) -> dict[str, torch.Tensor]:
    """Push random tokens through ``n_layer`` blocks of ``arrangement`` and measure every depth.

    Each sub-layer is a two-layer ReLU MLP ``F(x) = relu(x W_1) W_2`` with ``W_1 ~ N(0, 2 / C)`` (He
    initialisation, which keeps the mean square through a ReLU) and ``W_2 ~ N(0, gain^2 / C)``, so ``F``
    multiplies the root mean square of its input by about ``gain``; LayerNorms have weight 1 and bias 0. The
    loss is ``sum(x_L * r)`` for a fixed random ``r``, so the gradient entering the top is unit-variance noise;
    with ``final_norm=True`` it is ``sum(LN(x_L) * r)``, a last LayerNorm before the loss as in GPT-2, and the
    gradient entering ``x_L`` is ``r`` through that LayerNorm's Jacobian (about ``r / rms(x_L)``).
    Returns ``{"activation_rms": (n_layer + 1,), "gradient_rms": (n_layer + 1,)}``: the root mean square of the
    stream ``x_l`` and of ``dLoss/dx_l`` at the input (index 0) and after every block.
    """
    _check_profile_args("depth_profile", arrangement, n_layer, gain)
    g = torch.Generator().manual_seed(seed)
    W1, W2 = _mlp_weights(n_layer, d_model, gain, g, dtype)
    x = torch.randn(n_tokens, d_model, generator=g, dtype=dtype)  # (N, C) unit-variance input
    r = torch.randn(n_tokens, d_model, generator=g, dtype=dtype)
    xs = _stack(arrangement, x.requires_grad_(), W1, W2)
    for t in xs[1:]:
        t.retain_grad()
    top = layer_norm(xs[-1]) if final_norm else xs[-1]  # LN(x_L) with weight 1, bias 0, or x_L itself
    (top * r).sum().backward()
    rms = lambda t: t.detach().pow(2).mean().sqrt()  # noqa: E731
    return {"activation_rms": torch.stack([rms(t) for t in xs]), "gradient_rms": torch.stack([rms(t.grad) for t in xs])}


@torch.no_grad()
def output_sensitivity(arrangement: str, *, n_layer: int, d_model: int = 64, n_tokens: int = 256,
                       gain: float = 1.0, delta: float = 0.01, seed: int = 0) -> float:
    """How much a small random change of every weight changes the output of the stack: the amplification effect.

    The stack is :func:`depth_profile`'s (same sub-layers, float32). Every weight matrix ``W`` becomes
    ``W + delta * W'`` with ``W'`` an independent draw of the same distribution (a relative change of about
    ``delta``, like one optimiser step), and the result is ``rms(x_L(W + dW) - x_L(W)) / rms(x_L(W))``.
    """
    _check_profile_args("output_sensitivity", arrangement, n_layer, gain)
    if not delta > 0:
        raise ValueError(f"output_sensitivity: delta must be > 0, got {delta}")
    g = torch.Generator().manual_seed(seed)
    W1, W2 = _mlp_weights(n_layer, d_model, gain, g, torch.float32)
    x = torch.randn(n_tokens, d_model, generator=g)  # (N, C)
    D1, D2 = _mlp_weights(n_layer, d_model, gain, g, torch.float32)  # the direction of the change
    before = _stack(arrangement, x, W1, W2)[-1]  # x_L(W)
    after = _stack(arrangement, x, W1 + delta * D1, W2 + delta * D2)[-1]  # x_L(W + dW)
    return ((after - before).pow(2).mean().sqrt() / before.pow(2).mean().sqrt()).item()
