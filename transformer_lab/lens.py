"""Reading a trained GPT (chapter 8): the residual stream, each head's attention, and the logit lens.

For a prompt w_1 … w_T and a :class:`~transformer_lab.gpt.GPT` with L blocks, :func:`read` records

* the residual stream x_0 (embedding + positions), x_1, …, x_L (after each block), each (T, C), and its norm ‖x_l,t‖;
* every head's attention weights, (L, h, T, T): row t is how position t spreads its attention over keys j <= t;
* the **logit lens** (nostalgebraist, 2020): the next-token distribution read from *every* layer through the
  model's own final LayerNorm and tied head, softmax(LN_f(x_l) Eᵀ); at l = L it is the model's output;
* the entropy H = -Σ p ln p (chapter 5) of each of those distributions, in nats.

It runs the model's own forward pass once and listens with hooks: nothing of the model is re-implemented here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from transformer_lab.data import CharTokenizer
from transformer_lab.gpt import GPT
from transformer_lab.information import entropy
from transformer_lab.softmax import softmax


@dataclass(frozen=True)
class Reading:
    """What :func:`read` saw for one prompt (batch of one, T characters, L blocks, h heads, width C, V tokens)."""

    text: str  # the prompt
    residual: torch.Tensor  # (L + 1, T, C): x_0 … x_L
    attention: torch.Tensor  # (L, h, T, T): weights of head i of block l; row t sums to 1 over keys j <= t
    lens_logits: torch.Tensor  # (L + 1, T, V): LN_f(x_l) Eᵀ, the logit lens
    logits: torch.Tensor  # (T, V): the model's own output
    vocab: str  # the tokenizer's characters: token id i is vocab[i]

    @property
    def residual_norm(self) -> torch.Tensor:
        """‖x_l,t‖₂, (L + 1, T)."""
        return self.residual.norm(dim=-1)

    @property
    def probs(self) -> torch.Tensor:
        """The logit lens's distributions softmax(LN_f(x_l) Eᵀ), (L + 1, T, V)."""
        return softmax(self.lens_logits, dim=-1)

    @property
    def entropy(self) -> torch.Tensor:
        """H(p) = -Σ_v p_v ln p_v of each logit-lens distribution in nats, (L + 1, T)."""
        return entropy(self.probs.double()).float()

    def top(self, layer: int, position: int, k: int = 5) -> list[tuple[str, float]]:
        """The k most likely next characters read from x_layer at ``position``, with their probabilities."""
        p, i = self.probs[layer, position].topk(min(k, self.probs.shape[-1]))
        return [(self.vocab[j], float(q)) for q, j in zip(p, i.tolist(), strict=True)]


def check_prompt(prompt, tok: CharTokenizer, block_size: int) -> torch.Tensor:
    """The prompt's token ids (1, T), or a ValueError saying what was expected."""
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("the prompt must hold at least one character")
    if len(prompt) > block_size:
        raise ValueError(f"the prompt has {len(prompt)} characters; this model reads at most block_size = "
                         f"{block_size}")
    return tok.encode(prompt).view(1, -1)  # ValueError naming any unknown character


@torch.no_grad()
def read(model: GPT, tok: CharTokenizer, prompt: str) -> Reading:
    """Run ``model`` on ``prompt`` once and record what :class:`Reading` holds."""
    if not isinstance(model, GPT):
        raise ValueError(f"read expects a transformer_lab GPT, got {type(model).__name__}")
    idx = check_prompt(prompt, tok, model.config.block_size)
    stream = []
    hooks = [model.blocks[0].register_forward_pre_hook(lambda m, args: stream.append(args[0][0]))]  # x_0 (T, C)
    hooks += [b.register_forward_hook(lambda m, args, out: stream.append(out[0][0])) for b in model.blocks]  # x_l
    was_training = model.training
    model.eval()
    try:
        logits, weights = model(idx, need_weights=True)  # (1, T, V), L × (1, h, T, T)
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    residual = torch.stack(stream)  # (L + 1, T, C)
    lens = model.head(model.ln_f(residual))  # z_l = LN_f(x_l) Eᵀ   (L + 1, T, V)
    return Reading(prompt, residual, torch.stack([w[0] for w in weights]), lens, logits[0], tok.chars)


def format_reading(r: Reading, *, position: int = -1, top: int = 5, keys: int = 3) -> str:
    """The reading as text, layer by layer, at one query ``position`` (default: the last character)."""
    L1, T = r.residual_norm.shape
    t = position % T
    norm, H = r.residual_norm[:, t], r.entropy[:, t]
    lines = [f"prompt {r.text!r}: {T} characters; position {t} ({r.text[t]!r}), predicting the next character",
             "layer  |x_l|    entropy  logit lens: top next characters (probability)"]
    for l in range(L1):
        tops = "  ".join(f"{c!r} {p:.3f}" for c, p in r.top(l, t, top))
        name = "x_0" if l == 0 else f"x_{l}"
        lines.append(f"{name:<5} {float(norm[l]):7.2f}  {float(H[l]):6.3f}   {tops}")
        if l < L1 - 1:
            for i, w in enumerate(r.attention[l, :, t, :t + 1]):  # block l + 1's heads, row t
                p, j = w.topk(min(keys, t + 1))
                heads = "  ".join(f"{int(k)} {r.text[int(k)]!r} {float(q):.3f}" for q, k in zip(p, j, strict=True))
                lines.append(f"        block {l + 1} head {i + 1} attends to: {heads}")
    lines.append(f"x_{L1 - 1} read through the final LayerNorm and the tied head is the model's own output.")
    return "\n".join(lines)
