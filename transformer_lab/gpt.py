"""The mini-GPT (chapter 8): a decoder-only Transformer assembled from the book's components.

    x_0 = E[idx] + P                            token embedding (ch. 1) + positions (learned, or ch. 6)
    x_{l-½} = x_{l-1} + drop(MHA(LN(x_{l-1}), causal))  our attention (ch. 1), LayerNorm (ch. 7), causal mask (ch. 6)
    x_l = x_{l-½} + MLP(LN(x_{l-½}))                    our GELU MLP (ch. 4), dropout on its output inside
    logits = LN(x_L) Eᵀ                                 the head tied to the embedding (ch. 1, 2); l = 1, ..., L

The blocks use the chapters' modules in their fast form (:mod:`transformer_lab.fast`): the same parameters and
numbers, fewer passes over memory. Generation (:meth:`GPT.generate`) keeps a key/value cache, so each new token
costs one position's projections and MLP instead of the whole window's (its attention still reads all cached
positions), and samples with chapter 2's temperature / top-k / top-p.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from transformer_lab._checks import positive_int, shape_or_type
from transformer_lab.attention import Embedding, tie_weights
from transformer_lab.fast import FastLayerNorm, FastMLP, FastMultiHeadAttention
from transformer_lab.numerics import init_gpt_weights
from transformer_lab.positional import LearnedPositions, apply_rope, sinusoidal_encoding
from transformer_lab.regularization import dropout
from transformer_lab.sampling import sample
from transformer_lab.softmax import LMHead

POSITIONS = ("learned", "sinusoidal", "rope")


@dataclass(frozen=True)
class GPTConfig:
    """The shape of a GPT. Defaults: the shape of nanoGPT's published CPU recipe for character-level Shakespeare,
    except that by default every linear layer and LayerNorm has a bias (``bias=True``; nanoGPT's ``train.py``, and so
    that recipe, uses none)."""

    vocab_size: int = 64  # V: distinct tokens (characters); set it from the tokenizer
    block_size: int = 64  # T_max: the longest context the model attends over
    n_layer: int = 4  # L: Transformer blocks
    n_head: int = 4  # h: attention heads per block (d_k = d_model / n_head)
    d_model: int = 128  # C: width of the residual stream
    dropout: float = 0.0  # p: dropout on embeddings, attention weights, attention output, MLP output (as nanoGPT)
    bias: bool = True  # biases in the linear maps and LayerNorms
    positions: str = "learned"  # "learned" (a (T_max, C) table), "sinusoidal" (fixed, ch. 6) or "rope" (ch. 6)
    gelu: str = "tanh"  # the MLP's GELU: "tanh" approximation (GPT-2) or "none" (exact, erf)

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "d_model"):
            object.__setattr__(self, name, positive_int(getattr(self, name), f"GPTConfig.{name}"))
        if self.d_model % self.n_head:
            raise ValueError(f"GPTConfig: d_model={self.d_model} must be divisible by n_head={self.n_head}")
        if self.positions not in POSITIONS:
            raise ValueError(f"GPTConfig.positions must be one of {POSITIONS}, got {self.positions!r}")
        if self.positions == "rope" and (self.d_model // self.n_head) % 2:
            raise ValueError(f"RoPE rotates pairs: d_k = d_model / n_head = {self.d_model // self.n_head} must be even")
        if self.positions == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"sinusoidal positions need an even d_model, got {self.d_model}")
        if not isinstance(self.bias, bool):  # a checkpoint's JSON could say "no", which is truthy
            raise ValueError(f"GPTConfig.bias must be true or false, got {self.bias!r}")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, int | float) \
                or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must lie in [0, 1), got {self.dropout!r}")
        if self.gelu not in ("tanh", "none"):
            raise ValueError(f"GPTConfig.gelu must be 'tanh' or 'none', got {self.gelu!r}")


class Block(nn.Module):
    """One pre-LN Transformer block: x + MHA(LN(x)), then x + MLP(LN(x)). x (B, T, C) -> (B, T, C)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        c = config
        self.config = c
        self.ln1 = FastLayerNorm(c.d_model, bias=c.bias)
        self.attn = FastMultiHeadAttention(c.d_model, c.n_head, bias=c.bias, dropout=c.dropout)
        self.ln2 = FastLayerNorm(c.d_model, bias=c.bias)
        self.mlp = FastMLP(c.d_model, bias=c.bias, dropout=c.dropout, approximate=c.gelu)

    def attention(self, h: torch.Tensor, *, positions: torch.Tensor, cache: list | None = None,
                  need_weights: bool = False):
        """Causal self-attention of h (B, T, C) at ``positions`` (T,), through an optional [K, V] cache.

        Chapter 1's module does the work (:meth:`~transformer_lab.attention.MultiHeadAttention.split_qkv`, then
        :meth:`~transformer_lab.fast.FastMultiHeadAttention._attend_causal`); between the two, RoPE rotates Q and
        K and the cache prepends the keys and values of earlier positions.
        """
        q, k, v = self.attn.split_qkv(h)  # (B, h, T, d_k) each
        if self.config.positions == "rope":
            q, k = apply_rope(q, positions), apply_rope(k, positions)  # rotate pair i by m·ω_i
        if cache is not None:
            if cache:  # keys and values of the earlier positions, computed once
                k, v = torch.cat((cache[0], k), dim=-2), torch.cat((cache[1], v), dim=-2)  # (B, h, T_k, d_k)
            cache[:] = [k, v]
        out, weights = self.attn._attend_causal(q, k, v, need_weights=need_weights)  # (B, T, C)
        return (out, weights) if need_weights else out

    def forward(self, x: torch.Tensor, *, positions: torch.Tensor, cache: list | None = None,
                need_weights: bool = False):
        """x (B, T, C) -> (B, T, C). The GPT checked the shapes at its entry, so the components' own checks are
        skipped here (their ``_forward``): the same formulas, less Python work per step."""
        a = self.attention(self.ln1._forward(x), positions=positions, cache=cache, need_weights=need_weights)
        weights = None
        if need_weights:
            a, weights = a
        if self.training and self.config.dropout > 0.0:
            a = dropout(a, self.config.dropout)
        x = x + a  # x ← x + drop(MHA(LN(x)))   (B, T, C)
        x = x + self.mlp._forward(self.ln2._forward(x))  # x ← x + MLP(LN(x))   (B, T, C)
        return (x, weights) if need_weights else x


class KVCache:
    """Per-layer keys and values of the positions seen so far: ``layers[l] = [K, V]``, each (B, h, T_k, d_k)."""

    def __init__(self, n_layer: int):
        self.layers: list[list] = [[] for _ in range(n_layer)]

    def __len__(self) -> int:
        return 0 if not self.layers[0] else self.layers[0][0].shape[-2]


class GPT(nn.Module):
    """A GPT built from the book's components. ``forward(idx)``: idx (B, T) token ids -> logits (B, T, V)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise ValueError(f"GPT expects a GPTConfig, got {type(config).__name__}")
        c = self.config = config
        self.tok_emb = Embedding(c.vocab_size, c.d_model)  # E (V, C)
        if c.positions == "learned":
            self.pos_emb = LearnedPositions(c.block_size, c.d_model)  # P (T_max, C), learned (ch. 6)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.ln_f = FastLayerNorm(c.d_model, bias=c.bias)
        self.head = LMHead(c.d_model, c.vocab_size)  # W (V, C) ...
        tie_weights(self.head, self.tok_emb)  # ... = E: one matrix embeds tokens and scores them
        init_gpt_weights(self, n_layer=c.n_layer)  # N(0, 0.02), residual projections / √(2L)

    def num_params(self) -> int:
        """Trainable parameters, the tied matrix counted once."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor, *, cache: KVCache | None = None, need_weights: bool = False):
        """idx (B, T) -> logits (B, T, V). With ``cache``, idx holds only the new tokens after ``len(cache)``.

        ``need_weights=True`` also returns the attention weights, a list of L tensors (B, h, T, T_k).
        """
        c = self.config
        if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.is_floating_point():
            raise ValueError(f"idx must be an integer tensor of shape (B, T), got {shape_or_type(idx)}")
        _, T = idx.shape
        start = 0 if cache is None else len(cache)
        if T < 1 or start + T > c.block_size:
            raise ValueError(f"the context holds {start + T} tokens (cached {start} + new {T}); it must be 1 to "
                             f"block_size={c.block_size}")
        positions = torch.arange(start, start + T, device=idx.device)  # (T,) absolute positions of the new tokens
        x = self.tok_emb(idx)  # (B, T, C)
        if c.positions == "learned":
            x = x + self.pos_emb.weight[start:start + T]  # x_t = E[idx_t] + P[t]: rows start … start + T - 1 of P
        elif c.positions == "sinusoidal":
            pe = sinusoidal_encoding(start + T, c.d_model, dtype=x.dtype, device=x.device)  # (start + T, C)
            x = x + pe[start:]  # x_t = E[idx_t] + PE(t)
        x = dropout(x, c.dropout, training=self.training)
        weights = []
        for l, block in enumerate(self.blocks):
            layer_cache = None if cache is None else cache.layers[l]
            x = block(x, positions=positions, cache=layer_cache, need_weights=need_weights)
            if need_weights:
                x, w = x
                weights.append(w)
        logits = self.head(self.ln_f._forward(x))  # z = LN(x) Eᵀ   (B, T, V); the head's one check per forward
        return (logits, weights) if need_weights else logits

    @torch.inference_mode()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, greedy: bool = False,
                 use_cache: bool = True, generator: torch.Generator | None = None,
                 window: str = "half", on_token: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
        """Extend idx (B, T0) by ``max_new_tokens`` tokens -> (B, T0 + max_new_tokens).

        ``on_token``, if given, is called with each new token (B,) as soon as it is drawn (to stream the text).

        The model attends over a window of at most ``block_size`` tokens. When the window is full it moves
        forward by half a block (``window="half"``) or by one token, i.e. it is cropped to the last
        ``block_size`` tokens as nanoGPT does (``window="crop"``). ``use_cache=True`` re-fills the cache from the
        new window each time it moves (with "crop", every step once full: no saving there), so for either
        policy the cached and uncached paths compute the same logits up to round-off.
        """
        if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.shape[1] < 1:
            raise ValueError("idx must be a (B, T0) tensor of token ids with T0 >= 1")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        if window not in ("half", "crop"):
            raise ValueError(f"window must be 'half' or 'crop', got {window!r}")
        T_max = self.config.block_size
        shift = (T_max // 2 or 1) if window == "half" else 1  # how far a full window moves
        was_training = self.training
        self.eval()
        start = max(0, idx.shape[1] - T_max)  # the window is idx[:, start:]
        cache, fed = None, 0  # fed: tokens of the window already in the cache
        for _ in range(max_new_tokens):
            if idx.shape[1] - start > T_max:  # the window is one token over: move it on
                start += shift
                cache, fed = None, 0
            ctx = idx[:, start:]  # the window   (B, ≤ T_max)
            if use_cache:
                if cache is None:
                    cache = KVCache(self.config.n_layer)
                logits = self(ctx[:, fed:], cache=cache)[:, -1]  # only the tokens the cache has not seen
                fed = ctx.shape[1]
            else:
                logits = self(ctx)[:, -1]  # recompute the whole window   (B, V)
            if greedy:
                nxt = logits.argmax(dim=-1)  # (B,)
            else:
                nxt = sample(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
            idx = torch.cat((idx, nxt.view(-1, 1).to(idx.dtype)), dim=1)
            if on_token is not None:
                on_token(idx[:, -1])
        self.train(was_training)
        return idx
