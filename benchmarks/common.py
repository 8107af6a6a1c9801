"""Shared helpers for the capstone's benchmarks: build the recipe models and time training steps."""

from __future__ import annotations

import functools
import time

import torch
import torch.nn.functional as F

from transformer_lab.data import Corpus, get_batch, load_corpus
from transformer_lab.gpt import GPT, GPTConfig
from transformer_lab.information import cross_entropy
from transformer_lab.optim import AdamW, decay_groups
from transformer_lab.reference import ReferenceGPT


@functools.cache
def default_corpus() -> Corpus:
    """The default corpus, tokenised and hashed once per process (``bench`` runs every script in one)."""
    return load_corpus()


def recipe_models(vocab_size: int, seed: int = 0, **overrides) -> tuple[GPT, ReferenceGPT]:
    """Our GPT and the reference with the published recipe's shape and the same initial weights."""
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=vocab_size, **overrides)
    ours = GPT(config)
    ref = ReferenceGPT(config)
    ref.load_state_dict(ours.state_dict())
    return ours, ref


def stack(model, kind: str, *, compile: bool = False):
    """(loss function, optimizer) for a model: ours uses the book's, the reference torch's built-ins.

    Ours is set up as the trainer sets it up: clipping's norm checks finiteness (so AdamW need not), the groups
    flattened, and with ``compile`` (a compiled model) the flat update compiled too."""
    if kind == "ours":
        opt = AdamW(decay_groups(model, 0.1), lr=1e-3, betas=(0.9, 0.99), check_finite=False)
        opt.flatten_(compile=compile)
        return cross_entropy, opt
    opt = torch.optim.AdamW(decay_groups(model, 0.1), lr=1e-3, betas=(0.9, 0.99))
    return (lambda z, y: F.cross_entropy(z.flatten(0, 1), y.flatten())), opt


def time_steps(model, loss_fn, opt, data, *, steps: int, batch_size: int, block_size: int,
               generator: torch.Generator, clock=time.perf_counter) -> float:
    """Seconds for ``steps`` full training steps (batch, forward, loss, backward, clip, update).

    ``clock``: ``time.perf_counter`` (wall time) or ``time.process_time`` (this process's CPU time, steadier
    on a machine shared with other work).
    """
    model.train()
    t0 = clock()
    for _ in range(steps):
        x, y = get_batch(data, block_size=block_size, batch_size=batch_size, generator=generator)
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return clock() - t0
