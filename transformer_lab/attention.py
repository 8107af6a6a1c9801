"""Attention, multi-head attention, token embedding and weight tying (chapter 1: linear algebra).

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V

Everything is written with plain tensor operations (matrix products, reshapes, the softmax), differentiated by
autograd, with shape comments beside each line and keyword arguments ``query=, key=, value=, mask=`` so a query
can never be passed as a key.
Masks are boolean with ``True`` = "may attend", the convention of ``F.scaled_dot_product_attention``.

Dtypes: float32 and float64 inputs are computed in their own dtype; float16 and bfloat16 inputs are computed in
float32 and the results rounded back once. In float16 itself the scores S would overflow to inf past 65504, giving
inf - inf = NaN, and the products and row sums would lose digits.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from transformer_lab._checks import positive_int, shape_or_type
from transformer_lab.positional import causal_mask

_HALF = (torch.float16, torch.bfloat16)

__all__ = ["Embedding", "MultiHeadAttention", "attention_formula", "merge_heads", "scaled_dot_product_attention",
           "split_heads", "tie_weights"]


def _broadcast(*shapes) -> tuple[int, ...] | None:
    """The shape that ``shapes`` broadcast to (NumPy's rules), or None if they do not.

    Plain Python on tuples: ``torch.broadcast_shapes`` does the same in many more steps, and the capstone asks
    this once per layer and step.
    """
    n = max(len(s) for s in shapes)
    out = []
    for dims in zip(*((1,) * (n - len(s)) + tuple(s) for s in shapes), strict=True):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            return None
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _check_mask(mask: torch.Tensor, scores_shape: torch.Size) -> None:
    """``mask`` must be a bool tensor that broadcasts to ``scores_shape`` = (..., T_q, T_k)."""
    want = "(..., T_q, T_k) = " + str(tuple(scores_shape))
    if not isinstance(mask, torch.Tensor):
        raise ValueError(f"mask must be a bool tensor broadcastable to {want}, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must have dtype torch.bool (True = may attend), got {mask.dtype}")
    if _broadcast(mask.shape, scores_shape) != tuple(scores_shape):
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to the scores' shape {want}")


def attention_formula(*, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``softmax(Q Kᵀ / √d_k) V`` written as the formula, for reading; returns ``(out, weights)``.

    Shapes and mask as in :func:`scaled_dot_product_attention`, which also checks its inputs, has dropout and a
    causal option, and gives a fully masked row weights 0, where this formula gives 0/0 = NaN.
    """
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])  # S = Q Kᵀ / √d_k   (..., T_q, T_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # S_ij = -inf where key j may not be attended
    weights = torch.softmax(scores, dim=-1)  # A = softmax(S), row by row
    return weights @ value, weights  # O = A V   (..., T_q, d_v)


def scaled_dot_product_attention(*, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 mask: torch.Tensor | None = None, scale: float | None = None,
                                 dropout: float = 0.0, generator: torch.Generator | None = None,
                                 is_causal: bool = False, need_weights: bool = True):
    """``softmax(Q Kᵀ · scale) V`` with an optional boolean mask; returns ``(out, weights)``.

    query (..., T_q, d_k), key (..., T_k, d_k), value (..., T_k, d_v), leading dims broadcastable;
    mask bool, broadcastable to (..., T_q, T_k), True = may attend; ``scale`` defaults to ``1/√d_k``.
    out (..., T_q, d_v); weights (..., T_q, T_k), rows summing to 1 without dropout (a fully masked row gives
    weights 0 and output 0, as PyTorch does; with dropout the kept weights are divided by 1 - dropout).
    ``dropout`` (training only) zeroes weights with that probability.
    float16 / bfloat16 inputs are computed in float32, and out and weights returned in query's dtype.
    ``is_causal=True`` (no ``mask`` then) applies the causal mask of :func:`~transformer_lab.positional.causal_mask`:
    query i sees keys j <= i + (T_k - T_q), aligned bottom-right (the queries are the last T_q positions, as with
    a key-value cache); ``F.scaled_dot_product_attention(is_causal=True)`` aligns top-left (j <= i), so the two
    differ when T_q != T_k. ``need_weights=False`` returns ``(out, None)``.
    Plain tensor operations, differentiated by autograd; the GPT uses :func:`transformer_lab.fast.fast_attention`.
    """
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.dim() < 2 or not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor of shape (..., T, d) with at least 2 dims, "
                             f"got {shape_or_type(t)}")
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(f"query (..., T_q, d_k) and key (..., T_k, d_k) must share d_k: "
                         f"got query {shape_or_type(query)} and key {shape_or_type(key)}")
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(f"key (..., T_k, d_k) and value (..., T_k, d_v) must share T_k: "
                         f"got key {shape_or_type(key)} and value {shape_or_type(value)}")
    batch = _broadcast(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    if batch is None:
        raise ValueError(f"the leading (batch, head) dims of query {shape_or_type(query)}, key "
                         f"{shape_or_type(key)} and value {shape_or_type(value)} do not broadcast")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    if len({torch.float32 if t.dtype in _HALF else t.dtype for t in (query, key, value)}) > 1:
        raise ValueError(f"query, key and value must share a dtype (float16 and bfloat16 count as float32, in which "
                         f"they are computed): got {query.dtype}, {key.dtype}, {value.dtype}")
    T_q, T_k = query.shape[-2], key.shape[-2]
    if is_causal:
        if mask is not None:
            raise ValueError("give either mask or is_causal=True, not both")
        if T_k < T_q:
            raise ValueError(f"is_causal needs T_k >= T_q (the queries are the last T_q positions), got "
                             f"T_q={T_q}, T_k={T_k}")
    elif mask is not None:
        _check_mask(mask, torch.Size((*batch, T_q, T_k)))
    if query.dtype in _HALF or key.dtype in _HALF or value.dtype in _HALF:  # computed in float32, rounded once
        wide = [t.float() if t.dtype in _HALF else t for t in (query, key, value)]
        out, weights = scaled_dot_product_attention(query=wide[0], key=wide[1], value=wide[2], mask=mask, scale=scale,
                                                    dropout=dropout, generator=generator, is_causal=is_causal,
                                                    need_weights=need_weights)
        return out.to(query.dtype), (None if weights is None else weights.to(query.dtype))
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale  # 1/√d_k
    if is_causal:
        mask = causal_mask(T_q, T_k, device=query.device)  # query i sees keys j <= i + (T_k - T_q)
    scores = (query @ key.transpose(-2, -1)) * scale  # S = Q Kᵀ · scale   (..., T_q, T_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # S_ij = -inf where key j may not be attended
    weights = torch.softmax(scores, dim=-1)  # P = softmax(S), row by row
    if mask is not None:
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)  # a row with no key: 0, not 0/0 = NaN
    if dropout > 0.0:
        keep = torch.rand(weights.shape, generator=generator, dtype=weights.dtype, device=weights.device) >= dropout
        weights = weights * keep / (1.0 - dropout)  # inverted dropout: E[A] = P
    out = weights @ value  # O = A V   (..., T_q, d_v)
    return out, (weights if need_weights else None)


def split_heads(x: torch.Tensor, n_head: int) -> torch.Tensor:
    """(B, T, C) -> (B, h, T, d_k) with d_k = C / h: a reshape and a transpose, no arithmetic."""
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise ValueError(f"split_heads expects x of shape (B, T, C), got {shape_or_type(x)}")
    if not isinstance(n_head, int) or n_head < 1 or x.shape[-1] % n_head:
        raise ValueError(f"C = {x.shape[-1]} must be divisible by n_head, got n_head={n_head!r}")
    B, T, C = x.shape
    return x.view(B, T, n_head, C // n_head).transpose(1, 2)  # (B, T, h, d_k) -> (B, h, T, d_k)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, h, T, d_k) -> (B, T, h·d_k): the inverse of :func:`split_heads` (concatenate the heads)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError(f"merge_heads expects x of shape (B, h, T, d_k), got {shape_or_type(x)}")
    B, h, T, d_k = x.shape
    return x.transpose(1, 2).reshape(B, T, h * d_k)  # (B, T, h, d_k) -> (B, T, C)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with the parameters of ``nn.MultiheadAttention`` (``batch_first=True``).

    ``in_proj`` = Linear(C, 3C): its weight (3C, C) equals ``in_proj_weight`` there and stacks
    ``[W_Qᵀ; W_Kᵀ; W_Vᵀ]`` in the book's row convention ``Q = X W_Q``; ``out_proj`` = Linear(C, C), weight ``W_Oᵀ``.
    Dropout, as in PyTorch, acts on the attention weights.

        head_i = Attention(X_q W_Q^(i), X_k W_K^(i), X_v W_V^(i)),   MHA = concat(head_1 … head_h) W_O
    """

    def __init__(self, d_model: int, n_head: int, *, bias: bool = True, dropout: float = 0.0):
        super().__init__()
        d_model, n_head = positive_int(d_model, "d_model"), positive_int(n_head, "n_head")
        if d_model % n_head:
            raise ValueError(f"d_model % n_head must be 0 (d_k = d_model / n_head), got d_model={d_model}, "
                             f"n_head={n_head}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.d_model, self.n_head, self.d_k, self.dropout = d_model, n_head, d_model // n_head, dropout
        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=bias)  # weight [W_Qᵀ; W_Kᵀ; W_Vᵀ]   (3C, C)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)  # weight W_Oᵀ   (C, C)
        nn.init.xavier_uniform_(self.in_proj.weight)  # as nn.MultiheadAttention
        if bias:
            nn.init.zeros_(self.in_proj.bias)
            nn.init.zeros_(self.out_proj.bias)

    def _project(self, x: torch.Tensor, i: int) -> torch.Tensor:
        C = self.d_model
        w = self.in_proj.weight[i * C:(i + 1) * C]  # W_Qᵀ, W_Kᵀ or W_Vᵀ   (C, C)
        b = None if self.in_proj.bias is None else self.in_proj.bias[i * C:(i + 1) * C]
        y = x @ w.T  # x Wᵀ   (B, T, C)
        return y if b is None else y + b

    def forward(self, *, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: torch.Tensor | None = None, is_causal: bool = False, need_weights: bool = False):
        """query (B, T_q, C), key and value (B, T_k, C) -> out (B, T_q, C).

        mask bool, True = may attend: (T_q, T_k), (B, T_q, T_k), or broadcastable to (B, h, T_q, T_k);
        or ``is_causal=True``, the causal mask (see :func:`scaled_dot_product_attention`).
        Returns ``out``; with ``need_weights=True`` returns ``(out, weights)``, weights (B, h, T_q, T_k) per head.
        A query whose every key is masked (a padding row) gets weights 0 and head outputs 0, as
        ``F.scaled_dot_product_attention`` gives, so its ``out`` is the output projection's bias b_O (0 without
        bias); ``nn.MultiheadAttention`` returns NaN there. Such rows have attention entropy 0
        (``information.attention_entropy``), so padded batches need no special case.
        """
        C = self.d_model
        for name, t in (("query", query), ("key", key), ("value", value)):
            if not isinstance(t, torch.Tensor) or t.dim() != 3 or t.shape[-1] != C:
                raise ValueError(f"{name} must have shape (B, T, C={C}), got {shape_or_type(t)}")
        if not query.shape[0] == key.shape[0] == value.shape[0]:
            raise ValueError(f"query, key and value must share the batch size B: got {shape_or_type(query)}, "
                             f"{shape_or_type(key)}, {shape_or_type(value)}")
        if key.shape[1] != value.shape[1]:
            raise ValueError(f"key and value must share T_k: got key {shape_or_type(key)}, "
                             f"value {shape_or_type(value)}")
        if isinstance(mask, torch.Tensor) and mask.dim() == 3:
            mask = mask.unsqueeze(1)  # (B, T_q, T_k) -> (B, 1, T_q, T_k): the same mask for every head
        if query is key and key is value:  # self-attention: one product for Q, K and V
            q, k, v = self.split_qkv(query)
        else:
            q, k, v = (split_heads(self._project(t, i), self.n_head) for i, t in enumerate((query, key, value)))
        out, weights = self.attend(q, k, v, mask=mask, is_causal=is_causal, need_weights=need_weights)
        return (out, weights) if need_weights else out

    def split_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Self-attention's queries, keys and values of x (B, T, C), each (B, h, T, d_k), from one product.

        [Q K V] = X [W_Q W_K W_V] = X · in_proj.weightᵀ; unbind + transpose = split + :func:`split_heads`, and
        autograd gathers the three gradients with one copy.
        """
        B, T, _ = x.shape
        qkv = self.in_proj(x).view(B, T, 3, self.n_head, self.d_k)  # (B, T, 3, h, d_k)
        return tuple(t.transpose(1, 2) for t in qkv.unbind(2))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: torch.Tensor | None = None,
               is_causal: bool = False, need_weights: bool = False):
        """The heads' attention, concatenated and projected: q (B, h, T_q, d_k), k, v (B, h, T_k, d_k) ->
        ``(out (B, T_q, C), weights (B, h, T_q, T_k) or None)``; dropout on the weights in training only."""
        p = self.dropout if self.training else 0.0
        out, weights = scaled_dot_product_attention(query=q, key=k, value=v, mask=mask, dropout=p,
                                                    is_causal=is_causal, need_weights=need_weights)
        return self.out_proj(merge_heads(out)), weights  # concat(heads) W_Oᵀ + b_O   (B, T_q, C)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_head={self.n_head}, d_k={self.d_k}, dropout={self.dropout}"


def _check_ids(idx: torch.Tensor, vocab_size: int) -> None:
    """Token ids must be an integer tensor with values in [0, vocab_size).

    The range is not read while ``torch.compile`` traces (reading it would split the graph); the trainer's ids come
    from a checked corpus."""
    if not isinstance(idx, torch.Tensor) or idx.is_floating_point() or idx.is_complex() or idx.dtype == torch.bool:
        raise ValueError(f"idx must be an integer tensor of token ids, got "
                         f"{idx.dtype if isinstance(idx, torch.Tensor) else type(idx).__name__}")
    if idx.numel() and not torch.compiler.is_compiling() and (int(idx.min()) < 0 or int(idx.max()) >= vocab_size):
        raise ValueError(f"token ids must lie in [0, vocab_size={vocab_size}), got values in "
                         f"[{int(idx.min())}, {int(idx.max())}]")


class Embedding(nn.Module):
    """Token embedding: ``weight`` E (V, C); ``forward(idx) = E[idx]`` = one_hot(idx) @ E, idx (...) -> (..., C)."""

    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        vocab_size, d_model = positive_int(vocab_size, "vocab_size"), positive_int(d_model, "d_model")
        self.vocab_size, self.d_model = vocab_size, d_model
        self.weight = nn.Parameter(torch.randn(vocab_size, d_model))  # E (V, C), N(0, 1) as nn.Embedding

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        _check_ids(idx, self.vocab_size)
        return self.weight[idx]  # row idx of E = one_hot(idx) E   (..., C)

    def extra_repr(self) -> str:
        return f"vocab_size={self.vocab_size}, d_model={self.d_model}"


def tie_weights(head: nn.Module, embedding: nn.Module) -> None:
    """Make ``head.weight`` the very same Parameter as ``embedding.weight`` (both (V, C)): logits = x Eᵀ."""
    for name, m in (("head", head), ("embedding", embedding)):
        if not isinstance(getattr(m, "weight", None), torch.Tensor):
            raise ValueError(f"{name} must be a module with a .weight tensor, got {type(m).__name__}")
    if head.weight.shape != embedding.weight.shape:
        raise ValueError(f"to tie, head.weight (vocab_size, d_model) must have the embedding's shape "
                         f"{tuple(embedding.weight.shape)}, got {tuple(head.weight.shape)}")
    head.weight = embedding.weight  # one Parameter, two uses: E embeds tokens and scores them
