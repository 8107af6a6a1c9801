"""Numerical safety: log-sum-exp, the naive softmax it replaces, the 1/sqrt(d_k) scale, GPT-2 initialisation
(chapter 7, numerical analysis).

* ``logsumexp(z) = m + log sum_i exp(z_i - m)`` with ``m = max_i z_i``: every exponent is <= 0, so nothing
  overflows, and the largest term is exactly 1, so the sum cannot underflow to 0 either.
* ``naive_softmax`` exponentiates raw scores: it is here only to show the overflow the shift prevents.
* ``score_scale(d_k) = 1 / sqrt(d_k)``: for unit-variance q, k the dot product has variance d_k; the scale
  brings it back to 1, which keeps the softmax out of saturation. That is a variance argument: inside the softmax
  the max-shift already prevents overflow. In float16 the product Q K^T itself can pass 65504 before any softmax;
  applying the scale to Q before the product makes that less likely, computing the scores in float32 prevents it.
* ``init_gpt_weights`` is the initialisation the capstone uses (GPT-2 / nanoGPT).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ._checks import positive_int
from .attention import Embedding
from .norm import LayerNorm
from .softmax import softmax, softmax_jacobian

__all__ = ["init_gpt_weights", "logsumexp", "naive_softmax", "score_scale", "softmax_saturation"]


def _check_tensor(fn: str, x, dim: int) -> int:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{fn}: x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{fn}: x must be a floating-point tensor, got {x.dtype}")
    if x.dim() < 1:
        raise ValueError(f"{fn}: x must have at least one dimension, got a scalar")
    if not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"{fn}: dim={dim!r} is out of range for x with {x.dim()} dimensions")
    if x.shape[dim] == 0:
        raise ValueError(f"{fn}: dimension {dim} of x {tuple(x.shape)} is empty")
    return dim % x.dim()


def logsumexp(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``log(sum(exp(x), dim))`` computed stably; ``x`` (..., n, ...) -> the shape of ``x`` without ``dim``.

    Shifts by the (detached) maximum ``m``: ``LSE(x) = m + log sum exp(x - m)``. The shift is a constant for
    the derivative, so the gradient is exactly ``softmax(x)``. Rows that are all ``-inf`` give ``-inf`` (an
    empty sum), rows containing ``+inf`` give ``+inf``, as ``torch.logsumexp`` does.
    """
    dim = _check_tensor("logsumexp", x, dim)
    m = x.detach().amax(dim=dim, keepdim=True)  # m = max_i x_i            (..., 1, ...)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # all -inf (or +inf) rows: shift by 0
    s = torch.exp(x - m).sum(dim=dim, keepdim=True)  # sum_i e^{x_i - m} in [1, n]
    return (m + torch.log(s)).squeeze(dim)  # LSE(x) = m + log sum_i e^{x_i - m}


def naive_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``exp(x) / sum(exp(x))`` with no shift, for demonstrations only. It fails once ``log sum exp(x)`` exceeds the
    dtype's ``log(max)`` (about 11.09 in float16, 88.7 in bfloat16 and float32, 709.8 in float64): zeros while only
    the sum overflows, ``inf / inf = nan`` once an ``exp(x_i)`` overflows too."""
    dim = _check_tensor("naive_softmax", x, dim)
    e = torch.exp(x)  # e^{x_i}, may be inf
    return e / e.sum(dim=dim, keepdim=True)  # p_i = e^{x_i} / sum_j e^{x_j}


def score_scale(d_k: int) -> float:
    """The attention-score factor ``1 / sqrt(d_k)`` that makes ``Var(q . k / sqrt(d_k)) = 1``."""
    d_k = positive_int(d_k, "score_scale: d_k")
    return 1.0 / math.sqrt(d_k)


def softmax_saturation(d_k: int, *, n_keys: int = 64, n_queries: int = 512, scaled: bool = True,
                       seed: int = 0) -> dict[str, torch.Tensor]:
    """Attention of random unit-variance queries over random keys, with or without the 1/sqrt(d_k) scale.

    Returns per-query ``max_weight`` (the largest attention weight), ``entropy`` (nats), ``grad_norm``
    (the Frobenius norm of the softmax Jacobian diag(p) - p p^T with respect to the scores, which goes to 0 as the
    softmax saturates) and ``query_grad_norm`` (the norm of dL/dq = c K^T J g for an upstream gradient g on the
    weights with N(0, 1) entries, c the score scale: what reaches the query), each (n_queries,), and ``scores``
    (n_queries, n_keys). g is drawn after q and k, so the other outputs do not depend on it, and scaled and unscaled
    calls with the same seed share q, k and g. The entropy of p = softmax(s) is taken from the scores,
    H(p) = -sum_i p_i (s_i - LSE(s)) = LSE(s) - sum_i p_i s_i, with this chapter's log-sum-exp.
    """
    if not isinstance(n_keys, int) or n_keys < 2:
        raise ValueError(f"softmax_saturation: n_keys must be an int >= 2, got {n_keys!r}")
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n_queries, d_k, generator=g, dtype=torch.float64)  # (N, d_k), entries ~ N(0, 1)
    k = torch.randn(n_keys, d_k, generator=g, dtype=torch.float64)  # (n, d_k)
    scores = q @ k.T * (score_scale(d_k) if scaled else 1.0)  # s = q . k / sqrt(d_k)   (N, n)
    p = softmax(scores, dim=-1)  # chapter 2's stable softmax   (N, n)
    # ||diag(p) - p p^T||_F, formed explicitly: the expanded sum of powers of p cancels when p is one-hot
    grad_norm = torch.linalg.matrix_norm(softmax_jacobian(p))
    entropy = logsumexp(scores, dim=-1) - (p * scores).sum(-1)  # H(p) = LSE(s) - p . s   (N,)
    upstream = torch.randn(n_queries, n_keys, generator=g, dtype=torch.float64)  # dL/dp   (N, n)
    score_grad = (softmax_jacobian(p) @ upstream[..., None])[..., 0]  # dL/ds = J g (J symmetric)   (N, n)
    query_grad = score_grad @ k * (score_scale(d_k) if scaled else 1.0)  # dL/dq = c K^T dL/ds   (N, d_k)
    return {"max_weight": p.amax(-1), "entropy": entropy, "grad_norm": grad_norm,
            "query_grad_norm": torch.linalg.vector_norm(query_grad, dim=-1), "scores": scores}


def _is_layer_norm(m: nn.Module) -> bool:
    return isinstance(m, nn.LayerNorm | LayerNorm)


def _is_embedding(m: nn.Module) -> bool:
    return isinstance(m, nn.Embedding | Embedding)


@torch.no_grad()
def init_gpt_weights(module: nn.Module, *, n_layer: int, std: float = 0.02,
                     residual_projections: tuple[str, ...] = ("out_proj", "proj"),
                     generator: torch.Generator | None = None) -> nn.Module:
    """GPT-2 initialisation of every submodule of ``module``, in place; returns ``module``.

    * ``nn.Linear`` and embedding weights ~ ``N(0, std^2)``; biases 0;
    * the Linear layers that write into the residual stream (submodule names ending in one of
      ``residual_projections``: attention ``out_proj`` and MLP ``proj``) ~ ``N(0, (std / sqrt(2 n_layer))^2)``:
      the stream receives ``2 n_layer`` such additions, so the variance they add in total does not grow with
      depth;
    * LayerNorm weight 1, bias 0.
    """
    if not isinstance(module, nn.Module):
        raise ValueError(f"init_gpt_weights: module must be an nn.Module, got {type(module).__name__}")
    n_layer = positive_int(n_layer, "init_gpt_weights: n_layer")
    if not std > 0:
        raise ValueError(f"init_gpt_weights: std must be > 0, got {std}")
    proj_std = std / math.sqrt(2 * n_layer)  # sigma_proj = 0.02 / sqrt(2 L)
    for name, m in module.named_modules():
        if isinstance(m, nn.Linear):
            is_proj = name.split(".")[-1] in residual_projections
            nn.init.normal_(m.weight, mean=0.0, std=proj_std if is_proj else std, generator=generator)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif _is_embedding(m):
            nn.init.normal_(m.weight, mean=0.0, std=std, generator=generator)
        elif _is_layer_norm(m):
            if m.weight is not None:
                nn.init.ones_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    return module
