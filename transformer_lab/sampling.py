"""Sampling the next token: temperature, top-k and top-p (nucleus) (chapter 2: probability).

Given logits ``z`` (..., V), :func:`filter_logits` applies, in this order,

* temperature ``τ > 0``:   z ← (z - max z) / τ      (τ → 0: argmax, tied maxima sharing; τ → ∞: uniform over
                                                    the finite logits; the shift changes no probability and
                                                    keeps z / τ finite)
* top-k:                   keep the k largest z_i   (ties with the k-th are kept, so more than k may survive)
* top-p (nucleus):         keep the smallest set of most probable tokens whose probability reaches p, the
                           probabilities being softmax of what temperature and top-k left (renormalised)

and sets every removed logit to ``-inf``; :func:`sample` draws one token per row from ``softmax`` of the result by
inverting the cumulative distribution with a seeded ``torch.Generator``. Greedy decoding (τ = 0) is not a
temperature: write ``logits.argmax(-1)``. float16 and bfloat16 logits are filtered and sampled in float32 (their
cumulative sums would lose the small probabilities); :func:`filter_logits` returns the input's dtype.
"""

from __future__ import annotations

import math

import torch

from transformer_lab.softmax import softmax

__all__ = ["filter_logits", "sample"]


def _validate(logits, temperature, top_k, top_p) -> None:
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point() or logits.dim() < 1:
        got = f"{logits.dtype} {tuple(logits.shape)}" if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits must be a floating-point tensor of shape (..., V), got {got}")
    if logits.shape[-1] < 1:
        raise ValueError(f"logits must have a vocabulary of at least one token, got shape {tuple(logits.shape)}")
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not (
            math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r} "
                         "(for greedy decoding use logits.argmax(-1))")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, int | float)
                              or not 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be None or a number in (0, 1], got {top_p!r}")


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    """float32 for float16/bfloat16 (their cumulative sums lose small probabilities), else the input's dtype."""
    return torch.promote_types(x.dtype, torch.float32)


def filter_logits(logits: torch.Tensor, *, temperature: float = 1.0, top_k: int | None = None,
                  top_p: float | None = None) -> torch.Tensor:
    """Logits (..., V) divided by ``temperature``, with ``-inf`` at every token top-k or top-p removes; same dtype
    (computed in float32 for float16/bfloat16).

    With ``temperature != 1`` each row's (finite) maximum is subtracted before the division, so every result is
    <= 0 and none overflows to ``+inf`` however small τ is: 0 at the maximum, and elsewhere a large negative number
    (-5000 for a gap of 0.5 at τ = 1e-4) that becomes ``-inf`` only once the quotient exceeds the dtype's range
    (softmax is unchanged by the shift); with τ = 1
    the kept logits are returned unchanged. ``top_k`` larger than V keeps everything; ``top_p = 1`` keeps
    everything; the most probable token is always kept, so every row keeps at least one token.
    """
    _validate(logits, temperature, top_k, top_p)
    return _filter(logits, temperature, top_k, top_p).to(logits.dtype)


def _filter(logits, temperature, top_k, top_p) -> torch.Tensor:
    """:func:`filter_logits` computed in :func:`_work_dtype` (float32 for float16/bfloat16 logits)."""
    logits = logits.to(_work_dtype(logits))
    if temperature == 1:
        z = logits
    else:
        m = logits.amax(dim=-1, keepdim=True)  # the row maximum   (..., 1)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # an all -inf or +inf row is left to sample
        # (z - max z) / τ <= 0: cannot overflow; the maximum is set to 0 exactly, since a τ below the dtype's
        # smallest number rounds to 0 there and 0 / 0 would be NaN; a -inf logit stays -inf, since a τ beyond
        # the dtype's range rounds to inf and -inf / inf would be NaN   (..., V)
        z = torch.where(logits == m, 0.0, (logits - m) / temperature)
        z = torch.where(torch.isneginf(logits), logits, z)
    if top_k is not None and top_k < z.shape[-1]:
        kth = torch.topk(z, top_k, dim=-1).values[..., -1:]  # the k-th largest logit   (..., 1)
        z = z.masked_fill(z < kth, float("-inf"))  # keep z_i >= z_(k)
    if top_p is not None and top_p < 1.0:
        sorted_z, order = torch.sort(z, dim=-1, descending=True)  # (..., V)
        probs = softmax(sorted_z, dim=-1)  # p_(1) >= p_(2) >= ...
        before = torch.cumsum(probs, dim=-1) - probs  # mass of the tokens ranked above this one
        drop_sorted = before >= top_p  # drop once the tokens above already reach p
        drop_sorted[..., 0] = False  # the first is always kept (a top_p below float32's range rounds to 0)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # back to vocabulary order
        z = z.masked_fill(drop, float("-inf"))
    return z


def sample(logits: torch.Tensor, *, temperature: float = 1.0, top_k: int | None = None,
           top_p: float | None = None, generator: torch.Generator | None = None,
           num_samples: int | None = None) -> torch.Tensor:
    """Token ids drawn from ``softmax(filter_logits(logits, ...))``, int64 (for float16/bfloat16 logits, from the
    softmax of the float32 filtered logits, before :func:`filter_logits` rounds them back to the input's dtype).

    logits (..., V) -> (...): one token per row; with ``num_samples=n``, (..., n): n independent tokens per row
    (the distribution is computed once, so many draws never build an (n, V) matrix).
    Inverse-CDF sampling: with ``u ~ U[0, 1)`` from ``generator``, return the first i with
    ``F_i = p_1 + ... + p_i > u · F_V`` (scaled by the computed total ``F_V``, which can round below 1; in
    round-to-nearest ``u · F_V < F_V`` for every u < 1), clamped to the last token of positive probability for
    safety; a token of probability 0 can never be drawn. p, F and u are float32 for
    float16/bfloat16 logits, else in the logits' dtype.
    """
    if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, int)
                                    or num_samples < 1):
        raise ValueError(f"num_samples must be None or an int >= 1, got {num_samples!r}")
    _validate(logits, temperature, top_k, top_p)
    probs = softmax(_filter(logits, temperature, top_k, top_p), dim=-1)  # (..., V), at least float32
    if torch.isnan(probs).any():
        raise ValueError("logits contain NaN or +inf, or a row is entirely -inf: there is no distribution to "
                         "sample from")
    cdf = torch.cumsum(probs, dim=-1)  # F_i   (..., V)
    n = 1 if num_samples is None else num_samples
    u = torch.rand((*probs.shape[:-1], n), generator=generator, dtype=probs.dtype, device=probs.device)
    idx = torch.searchsorted(cdf, u * cdf[..., -1:], right=True)  # first i with F_i > u F_V   (..., n)
    ids = torch.arange(probs.shape[-1], device=probs.device)
    last = torch.where(probs > 0, ids, 0).amax(dim=-1, keepdim=True)  # last token with p_i > 0 (against rounding)
    idx = torch.minimum(idx, last)
    return idx.squeeze(-1) if num_samples is None else idx
