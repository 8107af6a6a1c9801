"""The trainer (chapter 8): our AdamW and warm-up + cosine schedule (chapter 3), our cross-entropy (chapter 5).

:class:`Trainer` knows nothing about GPT internals: it needs a module mapping token ids (B, T) to logits
(B, T, V), a :class:`~transformer_lab.data.Corpus` and a :class:`TrainConfig`. It shows a tqdm bar with the loss
and tokens/s, evaluates train and val loss on fixed batches every ``eval_interval`` steps, writes atomic
checkpoints (:mod:`transformer_lab.checkpoint`), resumes a killed run so that its loss curve equals the
uninterrupted one (weights, optimizer moments, step, and every RNG state are restored), and stops with a message
naming the step when the loss or a gradient stops being finite.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from transformer_lab import checkpoint as ckpt
from transformer_lab._checks import positive_int
from transformer_lab.data import Corpus, get_batch
from transformer_lab.information import cross_entropy
from transformer_lab.optim import AdamW, WarmupCosine, decay_groups


@dataclass(frozen=True)
class TrainConfig:
    """How to train. Defaults are the widely published CPU recipe for character-level Shakespeare."""

    max_iters: int = 2000  # optimizer steps in the whole run
    batch_size: int = 12  # sequences per step (B)
    block_size: int = 64  # tokens per sequence (T); at most the model's context length
    lr: float = 1e-3  # peak learning rate, reached after warm-up
    min_lr: float = 1e-4  # the cosine's floor, reached at max_iters
    warmup: int = 100  # linear warm-up steps
    beta1: float = 0.9  # AdamW's first-moment decay
    beta2: float = 0.99  # AdamW's second-moment decay (0.99: few tokens per step, so a shorter memory)
    weight_decay: float = 0.1  # decoupled weight decay on matrices and embeddings only (decay_groups)
    grad_clip: float = 1.0  # clip the global gradient norm to this (0 = no clipping)
    eval_interval: int = 250  # evaluate (and checkpoint) every this many steps, and at the end
    eval_iters: int = 20  # batches per split in each evaluation (the same batches every time)
    seed: int = 1337  # seeds the batch sampler, the evaluation batches and dropout

    def __post_init__(self):
        for name in ("max_iters", "batch_size", "block_size", "eval_interval", "eval_iters"):
            object.__setattr__(self, name, positive_int(getattr(self, name), f"TrainConfig.{name}"))
        if not 0 <= self.warmup < self.max_iters:
            raise ValueError(f"TrainConfig.warmup must lie in [0, max_iters={self.max_iters}), got {self.warmup}")
        if not (0 < self.min_lr <= self.lr) or not math.isfinite(self.lr):
            raise ValueError(f"TrainConfig needs 0 < min_lr <= lr, got min_lr={self.min_lr}, lr={self.lr}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError(f"TrainConfig betas must lie in [0, 1), got {self.beta1}, {self.beta2}")
        if not (0 <= self.weight_decay < math.inf and 0 <= self.grad_clip < math.inf):
            raise ValueError(f"TrainConfig.weight_decay and grad_clip must be finite and >= 0, got "
                             f"{self.weight_decay!r} and {self.grad_clip!r}")
        if self.lr / (1 - self.beta1) > _FLOAT32_MAX:  # AdamW's first step is lr / (1 - beta1) in float32
            raise ValueError(f"TrainConfig.lr={self.lr} is too large: AdamW's first step lr / (1 - beta1) exceeds "
                             f"the largest float32 ({_FLOAT32_MAX:.3g})")
        if self.lr * self.weight_decay >= 1:  # decoupled decay multiplies the weights by 1 - lr * wd each step
            raise ValueError(f"TrainConfig needs lr * weight_decay < 1 (each step scales the weights by "
                             f"1 - lr * weight_decay), got lr={self.lr}, weight_decay={self.weight_decay}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63 - 1:
            raise ValueError(f"TrainConfig.seed must be an int in [0, 2**63 - 1), got {self.seed!r}")


_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def check_corpus(corpus: Corpus, config: TrainConfig) -> None:
    """Raise ValueError unless both splits of ``corpus`` hold a window of ``config.block_size`` (+ its target)."""
    for name, data in (("train", corpus.train), ("val", corpus.val)):
        if len(data) < config.block_size + 2:
            raise ValueError(f"the {name} split has {len(data)} tokens, too few for block_size {config.block_size}"
                             f" (it needs block_size + 2 = {config.block_size + 2}); use a longer text or a "
                             "smaller --block-size")


class TrainingDiverged(RuntimeError):
    """The loss or a gradient became NaN or infinite; the message names the step."""


@torch.no_grad()
def evaluate_loss(model: nn.Module, data: torch.Tensor, *, block_size: int, batch_size: int = 64,
                  max_windows: int | None = None) -> float:
    """Mean cross-entropy (nats/token) over consecutive, non-overlapping windows of ``data``: exact, no sampling."""
    n = (len(data) - 1) // block_size
    if n < 1:
        raise ValueError(f"data of {len(data)} tokens holds no window of block_size {block_size}")
    n = min(n, max_windows or n)
    starts = torch.arange(n) * block_size  # (N,)
    offsets = torch.arange(block_size)  # (T,)
    was_training = model.training
    model.eval()
    total = 0.0
    for i in range(0, n, batch_size):
        s = starts[i:i + batch_size, None] + offsets  # (b, T)
        total += float(cross_entropy(model(data[s]), data[s + 1], reduction="sum"))
    model.train(was_training)
    return total / (n * block_size)


class Trainer:
    """Trains ``model`` on ``corpus`` with ``config``; ``run()`` returns the history.

    ``history["loss"]`` holds every step's training loss; ``history["eval"]`` the periodic evaluations
    ``{"step", "train", "val"}``. ``checkpoint``: a path ``NAME.json`` written at every evaluation.
    ``meta``: JSON-able facts stored in the checkpoint (e.g. the model config, under ``"config"``).
    ``compile=True`` runs the training forward (and so its backward) through ``torch.compile``, which fuses the
    components' small operations into a few generated kernels: the same formulas, faster once compiled (the first
    step waits for the compiler), and equal to the uncompiled run up to float round-off.
    """

    def __init__(self, model: nn.Module, corpus: Corpus, config: TrainConfig = TrainConfig(), *,
                 checkpoint: str | Path | None = None, meta: dict[str, Any] | None = None, progress: bool = True,
                 compile: bool = False):
        self.model, self.corpus, self.config = model, corpus, config
        self.checkpoint = None if checkpoint is None else ckpt.json_path(checkpoint)
        self.meta = dict(meta or {})
        self.meta.setdefault("config", asdict(model.config) if dataclasses.is_dataclass(
            getattr(model, "config", None)) else {})
        self.progress = progress
        self.forward = torch.compile(model) if compile else model  # the training step's forward pass
        c = config
        check_corpus(corpus, c)
        # with clipping, the clipped norm already tells a non-finite gradient: AdamW need not check again
        self.optimizer = AdamW(decay_groups(model, c.weight_decay), lr=c.lr, betas=(c.beta1, c.beta2),
                               check_finite=c.grad_clip == 0)
        self.schedule = WarmupCosine(c.lr, c.min_lr, c.warmup, c.max_iters)
        self.generator = torch.Generator().manual_seed(c.seed)  # the batch sampler
        torch.manual_seed(c.seed)  # dropout draws from the global generator
        g = torch.Generator().manual_seed(c.seed + 1)  # fixed evaluation batches
        self.eval_batches = {split: [get_batch(data, block_size=c.block_size, batch_size=c.batch_size,
                                               generator=g) for _ in range(c.eval_iters)]
                             for split, data in (("train", corpus.train), ("val", corpus.val))}
        self.step = 0
        self.history: dict[str, list] = {"loss": [], "eval": []}
        self.tokens_per_s = 0.0

    # ------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean loss on the fixed evaluation batches of each split."""
        was_training = self.model.training
        self.model.eval()
        out = {split: sum(float(cross_entropy(self.model(x), y)) for x, y in batches) / len(batches)
               for split, batches in self.eval_batches.items()}
        self.model.train(was_training)
        return out

    # ------------------------------------------------------------ checkpoints
    def save(self, path: str | Path | None = None, *, weights_only: bool = False) -> Path:
        """Write a resumable checkpoint (weights, optimizer, step, RNG states, history, corpus hash).

        ``weights_only=True`` leaves out the optimizer's moments: a small release checkpoint that loads for
        sampling but cannot be resumed.
        """
        path = path or self.checkpoint
        if path is None:
            raise ValueError("no checkpoint path: pass checkpoint= to Trainer or a path to save()")
        meta = {**self.meta, "step": self.step, "train_config": asdict(self.config),
                "corpus_sha256": self.corpus.sha256, "corpus_name": self.corpus.name,
                "vocab": self.corpus.tokenizer.chars, "history": self.history,
                "rng": {"batches": ckpt.encode_rng(self.generator.get_state()),
                        "torch": ckpt.encode_rng(torch.get_rng_state())}}
        return ckpt.save(path, model=self.model, meta=meta, optimizer=None if weights_only else self.optimizer)

    def resume(self, path: str | Path) -> None:
        """Continue from a checkpoint written by :meth:`save`; refuses one from another config or corpus.

        The whole record is checked first (configs, corpus, step, history, RNG states, weights, optimizer state);
        the model, the optimizer and the RNGs are touched only once every check has passed."""
        record, tensors = ckpt.read(path)
        bad = ckpt.CheckpointError
        if record.get("corpus_sha256") != self.corpus.sha256:
            raise bad(
                f"{path} was trained on a different text (corpus sha256 {str(record.get('corpus_sha256'))[:12]}..., "
                f"this run's is {self.corpus.sha256[:12]}...)")
        saved_train, mine = record.get("train_config"), asdict(self.config)
        if saved_train != mine:
            saved_train = saved_train if isinstance(saved_train, dict) else {}
            diff = sorted(k for k in mine if saved_train.get(k) != mine[k])
            raise bad(f"{path} was written with another training config; differing: {diff}")
        if record["config"] != self.meta["config"]:
            diff = sorted(k for k in set(record["config"]) | set(self.meta["config"])
                          if record["config"].get(k) != self.meta["config"].get(k))
            raise bad(f"{path} holds a model with another config; differing fields: {diff}")
        step = record.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= self.config.max_iters:
            raise bad(f"{path}: 'step' must be an int in [0, max_iters={self.config.max_iters}], got "
                      f"{str(step)[:40]}")
        history = _checked_history(record.get("history"), step, path)
        states = _checked_rng(record.get("rng"), path)
        got = ckpt.check_model_state({k: tuple(v.shape) for k, v in ckpt.model_tensors(self.model).items()},
                                     tensors, source=str(path))
        optim_state = ckpt.optimizer_state(self.optimizer, self.model, record, tensors)
        # every check passed: now change the model, the optimizer, the step, the history and the RNGs
        ckpt.load_model_state(self.model, {f"model.{k}": v for k, v in got.items()}, source=str(path))
        self.optimizer.load_state_dict(optim_state)
        self.step = step
        self.history = history
        self.generator.set_state(states["batches"])
        torch.set_rng_state(states["torch"])

    # ------------------------------------------------------------ the loop
    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """One optimizer step on a batch; returns the loss before the step."""
        lr = self.schedule.apply(self.optimizer, self.step)  # η(s): warm-up, then cosine
        logits = self.forward(x)  # (B, T, V)
        loss = cross_entropy(logits, y)  # mean of -log p(y_t | x_{<=t})
        value = float(loss.detach())
        if not math.isfinite(value):
            raise TrainingDiverged(f"training stopped at step {self.step}: the loss is {value} (lr {lr:.3g}); "
                                   "lower the learning rate or check the data")
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.config.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
            if not torch.isfinite(norm):
                raise TrainingDiverged(f"training stopped at step {self.step}: the gradient norm is {float(norm)}"
                                       f" (lr {lr:.3g}); lower the learning rate or check the data")
        try:
            self.optimizer.step()
        except ValueError as exc:  # AdamW's own finiteness check
            raise TrainingDiverged(f"training stopped at step {self.step}: {exc}") from exc
        except RuntimeError as exc:  # e.g. "value cannot be converted to type float without overflow"
            raise TrainingDiverged(f"training stopped at step {self.step}: the optimizer step failed ({exc}; "
                                   f"lr {lr:.3g}); lower the learning rate") from exc
        self.step += 1
        return value

    def run(self, *, until: int | None = None, callback=None) -> dict[str, list]:
        """Train from the current step to ``max_iters`` (or stop after step ``until``, as a kill would)."""
        c = self.config
        end = c.max_iters if until is None else min(until, c.max_iters)
        self.model.train()
        if self.step == 0 and not self.history["eval"]:
            self._evaluate_and_save()
        bar = tqdm(total=c.max_iters, initial=self.step, disable=not self.progress, unit="step",
                   dynamic_ncols=True, leave=False)
        tokens = c.batch_size * c.block_size
        try:
            while self.step < end:
                t0 = time.perf_counter()
                x, y = get_batch(self.corpus.train, block_size=c.block_size, batch_size=c.batch_size,
                                 generator=self.generator)  # (B, T), (B, T)
                loss = self.train_step(x, y)
                dt = time.perf_counter() - t0
                self.history["loss"].append(loss)
                rate = tokens / max(dt, 1e-9)
                self.tokens_per_s = rate if self.tokens_per_s == 0 else 0.9 * self.tokens_per_s + 0.1 * rate
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{self.tokens_per_s:,.0f}", refresh=False)
                if self.step % c.eval_interval == 0 or self.step == c.max_iters:
                    ev = self._evaluate_and_save()
                    bar.write(f"step {self.step:5d}: train {ev['train']:.4f}, val {ev['val']:.4f}")
                if callback is not None:
                    callback(self)
        finally:
            bar.close()
        return self.history

    def _evaluate_and_save(self) -> dict[str, float]:
        ev = {"step": self.step, **self.evaluate()}
        if not all(math.isfinite(ev[k]) for k in ("train", "val")):  # a diverged model never replaces a good save
            kept = "" if self.checkpoint is None else f"; the last good checkpoint {self.checkpoint} is kept"
            raise TrainingDiverged(f"training stopped at step {self.step}: the evaluation loss is train "
                                   f"{ev['train']}, val {ev['val']} (lr {self.optimizer.param_groups[0]['lr']:.3g})"
                                   f"{kept}; lower the learning rate or check the data")
        self.history["eval"].append(ev)
        if self.checkpoint is not None:
            self.save()
        return ev


def _checked_history(history: Any, step: int, path) -> dict[str, list]:
    """A checkpoint's ``history``: one finite loss per step taken, evaluations at steps <= ``step``."""
    bad = ckpt.CheckpointError
    if not isinstance(history, dict) or not isinstance(history.get("loss"), list) or not isinstance(
            history.get("eval"), list):
        raise bad(f"{path}: 'history' must be an object with lists 'loss' and 'eval'")
    loss = history["loss"]
    if len(loss) != step or not all(_finite(v) for v in loss):
        raise bad(f"{path}: 'history.loss' must hold {step} finite numbers (one per step taken), got {len(loss)} "
                  "entries" + ("" if all(_finite(v) for v in loss) else ", some not finite numbers"))
    for ev in history["eval"]:
        if not (isinstance(ev, dict) and isinstance(ev.get("step"), int) and not isinstance(ev["step"], bool)
                and 0 <= ev["step"] <= step and _finite(ev.get("train")) and _finite(ev.get("val"))):
            raise bad(f"{path}: each 'history.eval' entry must be {{'step': 0..{step}, 'train': a finite number, "
                      f"'val': a finite number}}, got {str(ev)[:60]}")
    return {**history, "loss": list(loss), "eval": [dict(ev) for ev in history["eval"]]}


def _finite(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v)


def _checked_rng(rng: Any, path) -> dict[str, torch.Tensor]:
    """The two generator states of a checkpoint, decoded and tried on a scratch generator."""
    bad = ckpt.CheckpointError
    if not isinstance(rng, dict):
        raise bad(f"{path}: 'rng' must be an object with the generator states 'batches' and 'torch'")
    size = len(torch.Generator().get_state())
    out = {}
    for key in ("batches", "torch"):
        text = rng.get(key)
        try:
            state = ckpt.decode_rng(text)
            if len(state) != size:
                raise ValueError(f"{len(state)} bytes, a CPU generator state has {size}")
            torch.Generator().set_state(state)  # the generator's own checks, on a scratch generator
        except (TypeError, ValueError, RuntimeError) as exc:
            raise bad(f"{path}: 'rng.{key}' is not a saved generator state ({str(exc)[:80]})") from exc
        out[key] = state
    return out
