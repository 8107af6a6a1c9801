"""Softmax, log-softmax and the language-model head (chapter 2: probability).

The output layer of a language model turns a vector of scores (logits) into a distribution over the vocabulary:

    P(y | x) = softmax(W x + b),    softmax(z)_i = exp(z_i) / sum_j exp(z_j).

Both functions here subtract the row maximum first (softmax is invariant to adding a constant, chapter 2 proves
it), so no ``exp`` ever overflows. float16 and bfloat16 inputs are computed in float32 and rounded once to the
input's dtype, as the attention core does. Everything is differentiable by autograd, in
reverse and forward mode (``torch.func.jacrev``, ``jacfwd``, ``jvp``, ``hessian``), with one limit: forward mode
nested in forward mode (``jacfwd(jacfwd(softmax))``, a ``jvp`` of a ``jvp``) silently gives a second derivative of
0 through the custom ``autograd.Function`` (a limit of PyTorch's custom Functions); for second derivatives use
``hessian`` (forward over reverse) or ``jacrev(jacrev(...))``, which are exact.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from transformer_lab._checks import positive_int, shape_or_type

__all__ = ["LMHead", "log_softmax", "softmax", "softmax_jacobian"]


def _check_float(x: torch.Tensor, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor (float16, bfloat16, float32 or float64), "
                         f"got {x.dtype}")
    if x.dim() == 0:
        raise ValueError(f"{name} must have at least one dimension (..., n), got a scalar")


def _check_dim(x: torch.Tensor, dim: int) -> int:
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim={dim} is out of range for a tensor of shape {tuple(x.shape)} ({x.dim()} dims)")
    return dim % x.dim()


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``exp(x - max) / sum(exp(x - max))`` along ``dim``; same shape as ``x``, entries in [0, 1] summing to 1.

    A slice that is entirely ``-inf`` has no distribution and gives NaN, as ``torch.softmax`` does. float16 and
    bfloat16 inputs are computed in float32 and the result is rounded once to the input's dtype.
    """
    _check_float(x, "x")
    dim = _check_dim(x, dim)
    if x.dtype in _HALF:  # exp, sum and divide in float32: one rounding to the half dtype at the end
        return _Softmax.apply(x.float(), dim).to(x.dtype)
    return _Softmax.apply(x, dim)


_HALF = (torch.float16, torch.bfloat16)


class _Softmax(torch.autograd.Function):
    """softmax with its backward and forward-mode derivatives written from the Jacobian, ∂L/∂z = Jᵀg = p ⊙ (g − ⟨g, p⟩)
    and ṗ = J t = p ⊙ (t − ⟨t, p⟩) (J is symmetric).

    One saved tensor and three operations instead of autograd's trace through max, exp, sum and divide: the
    backward pass is chapter 2's Jacobian, written once. (The attention core has its own in-place copy of the
    forward, fused with the masking, in :mod:`transformer_lab.attention`.)
    """

    generate_vmap_rule = True  # so torch.func transforms (jacrev, jacfwd, vmap) work through it

    @staticmethod
    def forward(x: torch.Tensor, dim: int) -> torch.Tensor:
        m = x.amax(dim=dim, keepdim=True)  # softmax(z) = softmax(z - c): shift by the max
        e = torch.exp(x - m)  # e_i = exp(z_i - max z) <= 1: never overflows
        return e / e.sum(dim=dim, keepdim=True)  # p_i = e_i / sum_j e_j

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)
        ctx.dim = inputs[1]

    @staticmethod
    def jvp(ctx, t: torch.Tensor, _dim_tangent):
        """Forward mode (torch.func.jvp, jacfwd, hessian): ṗ = J t = p ⊙ (t − ⟨t, p⟩).

        Not differentiable by an enclosing forward mode: jvp of a jvp returns 0 (see the module docstring).
        """
        (p,) = ctx.saved_tensors
        return p * (t - (t * p).sum(dim=ctx.dim, keepdim=True))

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        (p,) = ctx.saved_tensors
        return p * (g - (g * p).sum(dim=ctx.dim, keepdim=True)), None  # (diag(p) - p pᵀ) g


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``x - logsumexp(x)`` along ``dim``, computed as ``(x - m) - log(sum(exp(x - m)))`` with ``m = max(x)``.

    float16 and bfloat16 inputs are computed in float32 and the result is rounded once to the input's dtype.
    """
    _check_float(x, "x")
    dim = _check_dim(x, dim)
    if x.dtype in _HALF:
        return log_softmax(x.float(), dim).to(x.dtype)
    m = x.amax(dim=dim, keepdim=True).detach()
    shifted = x - m  # z - m <= 0
    return shifted - torch.log(torch.exp(shifted).sum(dim=dim, keepdim=True))  # log p_i = z_i - LSE(z)


def softmax_jacobian(p: torch.Tensor) -> torch.Tensor:
    """The Jacobian of softmax written in terms of its output: ``J = diag(p) - p pᵀ``.

    ``p`` (..., n), a probability vector (the output of :func:`softmax`); returns (..., n, n) with
    ``J[..., i, j] = ∂p_i/∂z_j = p_i (δ_ij - p_j)``.
    """
    _check_float(p, "p")
    return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)  # J = diag(p) - p pᵀ   (..., n, n)


class LMHead(nn.Module):
    """The language-model head: logits ``z = x Wᵀ + b`` over the vocabulary, ``P(y | x) = softmax(z)``.

    ``weight`` has shape (vocab_size, d_model), like ``nn.Linear(d_model, vocab_size)`` and like the embedding
    matrix, so the two can be tied (:func:`transformer_lab.attention.tie_weights`).
    """

    def __init__(self, d_model: int, vocab_size: int, *, bias: bool = False):
        super().__init__()
        d_model, vocab_size = positive_int(d_model, "d_model"), positive_int(vocab_size, "vocab_size")
        self.d_model, self.vocab_size = d_model, vocab_size
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))  # W (V, C)
        self.bias = nn.Parameter(torch.zeros(vocab_size)) if bias else None  # b (V,)
        bound = 1 / math.sqrt(d_model)  # nn.Linear's default initialisation
        nn.init.uniform_(self.weight, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., C) -> logits (..., V)."""
        if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != self.d_model:
            raise ValueError(f"LMHead expects x of shape (..., d_model={self.d_model}), got {shape_or_type(x)}")
        logits = x @ self.weight.T  # z = x Wᵀ   (..., V)
        if self.bias is not None:
            logits = logits + self.bias  # z = x Wᵀ + b
        return logits

    def probs(self, x: torch.Tensor) -> torch.Tensor:
        """``P(y | x) = softmax(x Wᵀ + b)``: x (..., C) -> (..., V), each row a distribution."""
        return softmax(self(x), dim=-1)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, vocab_size={self.vocab_size}, bias={self.bias is not None}"
