"""The reference GPT (chapter 8): the same model written with PyTorch's built-in layers.

``nn.Embedding``, ``nn.LayerNorm``, ``nn.Linear``, ``nn.GELU`` and the fused ``F.scaled_dot_product_attention``,
with parameter names equal to :class:`transformer_lab.gpt.GPT`'s, so ``ref.load_state_dict(gpt.state_dict())``
gives a model that must produce the same logits (tested). Sinusoidal and rotary positions are computed here by
their own formulas (RoPE with complex numbers), independently of chapter 6's code. It is also the speed reference
for the capstone's training benchmark.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from transformer_lab.gpt import GPTConfig


def _rotate(t: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """RoPE as complex multiplication: the pair (t_2i, t_2i+1) is t_2i + i t_2i+1, times e^{i m ω_i}."""
    real, cplx = (torch.float64, torch.complex128) if t.dtype == torch.float64 else (torch.float32, torch.complex64)
    z = torch.view_as_complex(t.to(real).reshape(*t.shape[:-1], -1, 2).contiguous())  # (B, h, T, d_k/2)
    return torch.view_as_real(z * rope.to(cplx)).flatten(-2).to(t.dtype)


def multihead_reference(ours: nn.Module) -> nn.MultiheadAttention:
    """PyTorch's ``nn.MultiheadAttention`` (``batch_first=True``) carrying the weights of our
    :class:`~transformer_lab.attention.MultiHeadAttention` ``ours``, in its dtype: the chapter 1 reference."""
    w = ours.in_proj.weight
    ref = nn.MultiheadAttention(ours.d_model, ours.n_head, batch_first=True, bias=ours.in_proj.bias is not None,
                                dtype=w.dtype, device=w.device)
    with torch.no_grad():
        ref.in_proj_weight.copy_(w)
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        if ours.in_proj.bias is not None:
            ref.in_proj_bias.copy_(ours.in_proj.bias)
            ref.out_proj.bias.copy_(ours.out_proj.bias)
    return ref


class ReferenceBlock(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.c = c
        self.ln1 = nn.LayerNorm(c.d_model, bias=c.bias)
        self.attn = nn.Module()
        self.attn.in_proj = nn.Linear(c.d_model, 3 * c.d_model, bias=c.bias)
        self.attn.out_proj = nn.Linear(c.d_model, c.d_model, bias=c.bias)
        self.ln2 = nn.LayerNorm(c.d_model, bias=c.bias)
        self.mlp = nn.Module()
        self.mlp.fc = nn.Linear(c.d_model, 4 * c.d_model, bias=c.bias)
        self.mlp.proj = nn.Linear(4 * c.d_model, c.d_model, bias=c.bias)
        self.gelu = nn.GELU(approximate=c.gelu)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor, rope: torch.Tensor | None) -> torch.Tensor:
        B, T, C = x.shape
        h = self.c.n_head
        q, k, v = self.attn.in_proj(self.ln1(x)).split(C, dim=-1)
        q, k, v = (t.view(B, T, h, C // h).transpose(1, 2) for t in (q, k, v))  # (B, h, T, d_k)
        if rope is not None:
            q, k = _rotate(q, rope), _rotate(k, rope)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.c.dropout if self.training else 0.0)
        x = x + self.drop(self.attn.out_proj(y.transpose(1, 2).reshape(B, T, C)))  # dropout on weights and output
        return x + self.drop(self.mlp.proj(self.gelu(self.mlp.fc(self.ln2(x)))))


class ReferenceGPT(nn.Module):
    """The reference model: idx (B, T) -> logits (B, T, V), built from torch built-ins only."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        c = self.config = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        if c.positions == "learned":
            self.pos_emb = nn.Embedding(c.block_size, c.d_model)
        self.blocks = nn.ModuleList(ReferenceBlock(c) for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.d_model, bias=c.bias)
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight
        self.drop = nn.Dropout(c.dropout)

    def _sinusoidal(self, T: int) -> torch.Tensor:
        pos = torch.arange(T, dtype=torch.float64)[:, None]
        inv_freq = torch.exp(-math.log(10000.0) * torch.arange(0, self.config.d_model, 2, dtype=torch.float64)
                             / self.config.d_model)
        ang = pos * inv_freq  # (T, C/2)
        return torch.stack((ang.sin(), ang.cos()), dim=-1).flatten(-2)  # sin at even, cos at odd columns

    def _rope(self, T: int) -> torch.Tensor:
        d_k = self.config.d_model // self.config.n_head
        inv_freq = 1.0 / 10000.0 ** (torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq  # (T, d_k/2)
        return torch.polar(torch.ones_like(ang), ang)  # e^{i m ω}   (T, d_k/2) complex128

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        x = self.tok_emb(idx)
        if self.config.positions == "learned":
            x = x + self.pos_emb(torch.arange(T))
        elif self.config.positions == "sinusoidal":
            x = x + self._sinusoidal(T).to(x.dtype)
        rope = self._rope(T) if self.config.positions == "rope" else None
        x = self.drop(x)
        for block in self.blocks:
            x = block(x, rope)
        return self.head(self.ln_f(x))
