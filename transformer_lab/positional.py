"""Combinatorics of order (chapter 6): learned, sinusoidal, rotary and ALiBi positions, the causal mask, counting.

* ``LearnedPositions``     a trained table P (n_pos, d_model): position t gets row P[t]; no row beyond n_pos - 1
* ``sinusoidal_encoding``  PE(pos, 2i) = sin(pos · ω_i),  PE(pos, 2i+1) = cos(pos · ω_i),  ω_i = base^{-2i/d}
* ``relative_rotation``    R(k) with PE(pos + k) = R(k) · PE(pos): block-diagonal 2×2 rotations by k·ω_i
* ``apply_rope``           rotary encoding: pair (x_{2i}, x_{2i+1}) of token m rotated by the angle m·ω_i, so
                           ⟨RoPE(q, m), RoPE(k, n)⟩ depends on m - n only
* ``alibi_slopes``, ``alibi_bias``  ALiBi: head h adds m_h · (j - i) to the score of query i and key j,
                           m_h = 2^{-8h/H} (h = 1 … H, H a power of 2)
* ``causal_mask``          bool (T, T_k), True where query i may attend to key j (j <= i + T_k - T)
* counting                 ``causal_pairs(n) = n(n+1)/2`` of ``attention_pairs(n) = n²``; head splits of d_model
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch
from torch import nn

from transformer_lab._checks import positive_int


def _check_base(base) -> None:
    if not isinstance(base, numbers.Real) or isinstance(base, bool | np.bool_) or not math.isfinite(base) \
            or not base > 0:
        raise ValueError(f"base must be a finite number > 0, got {base!r}")


def sinusoidal_frequencies(d_model: int, *, base: float = 10000.0, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The d_model/2 angular frequencies ω_i = base^{-2i/d_model}, i = 0 … d_model/2 - 1.  -> (d_model/2,), CPU."""
    d_model = positive_int(d_model, "d_model")
    if d_model % 2:
        raise ValueError(f"d_model must be even (sin/cos pairs), got {d_model}")
    _check_base(base)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64, device="cpu")  # 2i
    return (float(base) ** (-two_i / d_model)).to(dtype or torch.get_default_dtype())  # ω_i = base^{-2i/d}


def sinusoidal_encoding(n_pos: int, d_model: int, *, base: float = 10000.0,
                        dtype: torch.dtype | None = None, device=None) -> torch.Tensor:
    """The sinusoidal positional encoding of Vaswani et al. (2017) for positions 0 … n_pos-1.  -> (n_pos, d_model).

    PE(pos, 2i) = sin(pos / base^{2i/d}), PE(pos, 2i+1) = cos(pos / base^{2i/d}). Computed in float64 on the CPU,
    then cast to ``dtype`` and moved to ``device``.
    """
    n_pos = positive_int(n_pos, "n_pos")
    omega = sinusoidal_frequencies(d_model, base=base, dtype=torch.float64)  # (d/2,)
    angle = torch.arange(n_pos, dtype=torch.float64, device="cpu")[:, None] * omega[None, :]  # (n_pos, d/2): pos·ω_i
    pe = torch.empty(n_pos, d_model, dtype=torch.float64, device="cpu")
    pe[:, 0::2] = torch.sin(angle)  # PE(pos, 2i)
    pe[:, 1::2] = torch.cos(angle)  # PE(pos, 2i+1)
    return pe.to(dtype or torch.get_default_dtype()).to(device)


def relative_rotation(k: float, d_model: int, *, base: float = 10000.0,
                      dtype: torch.dtype | None = None) -> torch.Tensor:
    """The matrix R(k) with PE(pos + k) = R(k) · PE(pos) for every pos.  -> (d_model, d_model).

    Block-diagonal; block i is [[cos kω_i, sin kω_i], [-sin kω_i, cos kω_i]] acting on (sin, cos) pairs.
    """
    if not isinstance(k, numbers.Real) or isinstance(k, bool | np.bool_) or not math.isfinite(k):
        raise ValueError(f"k must be a finite number (an offset in positions), got {k!r}")
    k = float(k)  # a Python or NumPy number
    omega = sinusoidal_frequencies(d_model, base=base, dtype=torch.float64)  # (d/2,)
    c, s = torch.cos(k * omega), torch.sin(k * omega)  # (d/2,)
    R = torch.zeros(d_model, d_model, dtype=torch.float64)
    i = torch.arange(0, d_model, 2)
    R[i, i], R[i, i + 1] = c, s  # sin(θ + φ) = cos φ · sin θ + sin φ · cos θ
    R[i + 1, i], R[i + 1, i + 1] = -s, c  # cos(θ + φ) = -sin φ · sin θ + cos φ · cos θ
    return R.to(dtype or torch.get_default_dtype())


def apply_rope(x: torch.Tensor, positions: torch.Tensor | None = None, *, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding, interleaved pairs.  x (..., T, d) -> (..., T, d), d even.

    Su et al. (2021 preprint; 2024 journal, the book's su2024roformer).

    Pair (x_{2i}, x_{2i+1}) of the token at position m is rotated by the angle m·ω_i, ω_i = base^{-2i/d}:
    x'_{2i} = x_{2i} cos mω_i - x_{2i+1} sin mω_i,  x'_{2i+1} = x_{2i} sin mω_i + x_{2i+1} cos mω_i.
    ``positions``: (T,) or broadcastable to (..., T); default 0 … T-1. Apply to queries and keys, not values.
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError("x must be a floating-point torch.Tensor of shape (..., T, d)")
    if x.dim() < 2:
        raise ValueError(f"x must have shape (..., T, d), got {tuple(x.shape)}")
    T, d = x.shape[-2], x.shape[-1]
    if d % 2:
        raise ValueError(f"the last dimension of x must be even for RoPE (rotated in pairs), got d = {d}")
    if d == 0:
        raise ValueError("the last dimension of x must be > 0")
    if positions is None:
        positions = torch.arange(T, device=x.device)
    if not isinstance(positions, torch.Tensor) or positions.dtype == torch.bool:
        raise ValueError("positions must be a numeric torch.Tensor of shape (T,) or (..., T)")
    if positions.dim() == 0 or positions.shape[-1] != T:
        raise ValueError(f"positions must end in the sequence length T = {T}, got shape {tuple(positions.shape)}")
    wide = torch.float32 if x.device.type == "mps" else torch.float64  # the angles' dtype (MPS has no float64)
    omega = sinusoidal_frequencies(d, base=base, dtype=wide).to(x.device)  # (d/2,)
    angle = positions.to(device=x.device, dtype=wide)[..., None] * omega  # (..., T, d/2): m · ω_i
    cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]  # (..., T, d/2) the two halves of each pair
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # (..., T, d/2, 2): rotate by mω_i
    return out.flatten(-2)  # (..., T, d), pairs interleaved back


def causal_mask(T: int, T_k: int | None = None, *, device=None) -> torch.Tensor:
    """Causal attention mask, bool (T, T_k), True = may attend: query i sees keys j <= i + (T_k - T).

    With T_k = T (the default) it is lower-triangular. T_k > T is the key-value-cache case: the T queries are
    the last T of T_k positions.
    """
    T = positive_int(T, "T")
    T_k = T if T_k is None else T_k
    T_k = positive_int(T_k, "T_k")
    if T_k < T:
        raise ValueError(f"T_k must be >= T (each query sees its own position), got T={T}, T_k={T_k}")
    i = torch.arange(T, device=device)[:, None]  # (T, 1) queries
    j = torch.arange(T_k, device=device)[None, :]  # (1, T_k) keys
    return j <= i + (T_k - T)  # (T, T_k)


class LearnedPositions(nn.Embedding):
    """Learned absolute positions (GPT-2's ``wpe``): a table P (n_pos, d_model) ~ N(0, std²), trained with the model.

    ``forward(positions)``: integer positions (...), each in 0 … n_pos-1 -> rows P[positions] (..., d_model).
    A position the table has no row for is an error: a learned table cannot encode a position it never had.
    An ``nn.Embedding`` (one N(0, 1) draw of the table, then scaled), so GPT-2-style initialisers treat it as one.
    """

    def __init__(self, n_pos: int, d_model: int, *, std: float = 0.02):
        n_pos = positive_int(n_pos, "n_pos")
        d_model = positive_int(d_model, "d_model")
        super().__init__(n_pos, d_model)  # weight P (n_pos, d_model) ~ N(0, 1)
        with torch.no_grad():
            self.weight.mul_(std)  # P ~ N(0, std²)
        self.n_pos, self.d_model = n_pos, d_model

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        if not isinstance(positions, torch.Tensor) or positions.is_floating_point() or positions.dtype == torch.bool:
            raise ValueError("positions must be an integer torch.Tensor")
        if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= self.n_pos):
            raise ValueError(f"positions must lie in [0, n_pos={self.n_pos}): a learned table has no row for "
                             f"position {int(positions.max()) if int(positions.min()) >= 0 else int(positions.min())}")
        return self.weight[positions]  # (..., d_model)

    def extra_repr(self) -> str:
        return f"n_pos={self.n_pos}, d_model={self.d_model}"


def alibi_slopes(n_head: int, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """ALiBi's head slopes (Press et al., 2022).  -> (n_head,).

    For H a power of 2: m_h = 2^{-8h/H}, h = 1 … H (a geometric sequence from 2^{-8/H} down to 2^{-8}). Otherwise,
    as in the authors' code: the slopes for the largest power of 2, H' < H, then every other slope of 2H'.
    """
    n_head = positive_int(n_head, "n_head")

    def power_of_two(H: int) -> list[float]:
        return [2.0 ** (-8.0 * h / H) for h in range(1, H + 1)]

    H = 2 ** math.floor(math.log2(n_head))
    slopes = power_of_two(H) + power_of_two(2 * H)[0::2][:n_head - H]
    return torch.tensor(slopes, dtype=torch.float64, device="cpu").to(dtype or torch.get_default_dtype())


def alibi_bias(T: int, T_k: int | None = None, *, n_head: int, device=None,
               dtype: torch.dtype | None = None) -> torch.Tensor:
    """ALiBi's additive score bias, (n_head, T, T_k): entry (h, i, j) = m_h · (j - i'), i' = i + T_k - T.

    i' is query i's absolute position (the queries are the last T of T_k, as in :func:`causal_mask`). For the
    keys a causal model lets it see, j <= i', the bias is -m_h · (distance) <= 0: a linear penalty on distance.
    Add it to the scores before the softmax, together with the causal mask (the bias is > 0 where j > i').
    """
    T = positive_int(T, "T")
    T_k = T if T_k is None else T_k
    T_k = positive_int(T_k, "T_k")
    if T_k < T:
        raise ValueError(f"T_k must be >= T (the queries are the last T of T_k positions), got T={T}, T_k={T_k}")
    dtype = dtype or torch.get_default_dtype()
    i = torch.arange(T, device=device, dtype=dtype)[:, None] + (T_k - T)  # (T, 1) absolute query positions
    j = torch.arange(T_k, device=device, dtype=dtype)[None, :]  # (1, T_k)
    m = alibi_slopes(n_head, dtype=dtype).to(device)[:, None, None]  # (H, 1, 1)
    return m * (j - i)  # (H, T, T_k)


# ---------------------------------------------------------------- counting
def attention_pairs(n: int) -> int:
    """Ordered (query, key) pairs full self-attention scores over n tokens: n²."""
    n = positive_int(n, "n")
    return n * n


def causal_pairs(n: int) -> int:
    """(query, key) pairs a causal mask admits over n tokens: Σ_{i=1}^{n} i = n(n+1)/2."""
    n = positive_int(n, "n")
    return n * (n + 1) // 2


def valid_head_counts(d_model: int) -> list[int]:
    """The numbers of heads h that split d_model into equal heads of width d_k = d_model / h: its divisors."""
    d_model = positive_int(d_model, "d_model")
    return [h for h in range(1, d_model + 1) if d_model % h == 0]


def head_partitions(d_model: int, n_head: int) -> int:
    """Ways to deal the d_model projected coordinates (columns of W_Q, W_K, W_V) into n_head unordered heads of d_k
    each: d! / ((d_k!)^h · h!). Every head still reads all d_model input coordinates; only the outputs are split.

    All of them give the same family of models (one permutation of the columns of W_Q, W_K, W_V and the rows of
    W_O maps one onto another), which is why the code simply slices contiguous blocks.
    """
    d_model = positive_int(d_model, "d_model")
    n_head = positive_int(n_head, "n_head")
    if d_model % n_head:
        raise ValueError(f"n_head={n_head} must divide d_model={d_model}")
    d_k = d_model // n_head
    return math.factorial(d_model) // (math.factorial(d_k) ** n_head * math.factorial(n_head))
