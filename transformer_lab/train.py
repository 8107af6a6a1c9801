"""The trainer (chapter 8): our AdamW and warm-up + cosine schedule (chapter 3), our cross-entropy (chapter 5).

:class:`Trainer` knows nothing about GPT internals: it needs a module mapping token ids (B, T) to logits
(B, T, V), a :class:`~transformer_lab.data.Corpus` and a :class:`TrainConfig`. It shows a tqdm bar with the loss
and tokens/s, evaluates train and val loss on fixed batches every ``eval_interval`` steps, writes atomic
checkpoints (:mod:`transformer_lab.checkpoint`), resumes a killed run so that its loss curve equals the
uninterrupted one (weights, optimizer moments, step, and every RNG state are restored), and stops with a message
naming the step when the loss or a gradient stops being finite.

Beyond one CPU (:mod:`transformer_lab.distributed`): the model may live on any device (batches follow it);
``precision`` runs the forward under ``torch.autocast`` in bfloat16 or float16 (with a gradient scaler for
float16); ``grad_accum`` = K sums the gradients of K micro-batches of ``batch_size`` before each step; and under
torchrun the model is wrapped in ``DistributedDataParallel``, each rank computing the gradient of its rows of the
global batch (``world.size`` · K · ``batch_size`` windows per step) and only rank 0 writing.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import subprocess
import tempfile
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from transformer_lab import checkpoint as ckpt
from transformer_lab import distributed
from transformer_lab._checks import positive_int
from transformer_lab.data import Corpus, get_batch
from transformer_lab.distributed import World
from transformer_lab.fast import FastAdamW
from transformer_lab.information import cross_entropy
from transformer_lab.optim import WarmupCosine, decay_groups


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
    grad_accum: int = 1  # K: micro-batches of batch_size whose gradients are summed before each step

    def __post_init__(self):
        for name in ("max_iters", "batch_size", "block_size", "eval_interval", "eval_iters", "grad_accum"):
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


def compile_problem(device: torch.device | str = "cpu") -> str | None:
    """Why ``torch.compile`` cannot train on ``device`` here, in one line, or None when it can.

    The CPU backend (inductor) writes C++ and builds it with the compiler inductor itself picks (``$CXX`` or
    ``g++``): that compiler must exist and build a tiny shared library within 30 s. CUDA needs Triton.
    """
    import torch._dynamo

    kind = torch.device(device).type
    if not torch._dynamo.is_dynamo_supported():
        return "torch.compile does not support this Python version"
    if kind == "cuda":
        from torch.utils._triton import has_triton
        return None if has_triton() else "torch.compile on CUDA needs Triton, which is not installed"
    if kind != "cpu":
        return f"torch.compile's default backend is not used on {kind} here"
    return _cpu_compiler_problem()


@functools.cache
def _cpu_compiler_problem() -> str | None:
    from torch._inductor import cpp_builder

    try:
        cxx = cpp_builder.get_cpp_compiler()
    except Exception as exc:  # inductor raises its own InvalidCxxCompiler (or an OSError)
        return f"no working C++ compiler for torch.compile's CPU backend ({type(exc).__name__}; set CXX)"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            done = subprocess.run([cxx, "-x", "c++", "-shared", "-fPIC", "-o", os.path.join(tmp, "smoke.so"), "-"],
                                  input='extern "C" int smoke() { return 1; }', capture_output=True, text=True,
                                  timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"the C++ compiler {cxx} did not build a test library ({type(exc).__name__})"
    if done.returncode != 0:
        first = (done.stderr.strip().splitlines() or ["no message"])[0][:120]
        return f"the C++ compiler {cxx} failed on a test library ({first})"
    return None


def compile_cache_dir(base: Path) -> Path:
    """Where under ``base`` the compiled kernels for PyTorch's current CPU kernel set go: one folder per set
    (``AVX512``, ``AVX2``, ``DEFAULT``, as ``$ATEN_CPU_CAPABILITY`` picks). Inductor's caches do not tell the sets
    apart: a kernel generated with vector instructions, found again by a run on the portable set, fails to
    compile."""
    return base / torch.backends.cpu.get_cpu_capability().lower()


def use_compile_cache() -> Path:
    """Keep torch.compile's on-disk caches (inductor's FX graph cache, the AOTAutograd cache) in this user's cache
    directory (both are on by default in torch 2.13), so that a second run reuses the first run's compiled kernels;
    ``$TORCHINDUCTOR_CACHE_DIR``, when set, wins."""
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(compile_cache_dir(base / "transformer_lab" / "inductor"))
    return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])


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
    device = next(model.parameters()).device  # the windows go where the model is
    starts = torch.arange(n, device=data.device) * block_size  # (N,)
    offsets = torch.arange(block_size, device=data.device)  # (T,)
    was_training = model.training
    model.eval()
    total = 0.0
    for i in range(0, n, batch_size):
        s = starts[i:i + batch_size, None] + offsets  # (b, T)
        total += float(cross_entropy(model(data[s].to(device)), data[s + 1].to(device), reduction="sum"))
    model.train(was_training)
    return total / (n * block_size)


class Trainer:
    """Trains ``model`` on ``corpus`` with ``config``; ``run()`` returns the history.

    ``history["loss"]`` holds every step's training loss; ``history["eval"]`` the periodic evaluations
    ``{"step", "train", "val"}``. ``checkpoint``: a path ``NAME.json`` written at every evaluation.
    ``meta``: JSON-able facts stored in the checkpoint (e.g. the model config, under ``"config"``).
    ``compile=True`` runs the training forward with its loss (and so their backward) through ``torch.compile``, which
    fuses the components' small operations into a few generated kernels, and compiles the optimizer's update and the
    gradient clipping too (:meth:`~transformer_lab.fast.FastAdamW.flatten_`): the same formulas, faster once compiled
    (the first step waits for the compiler, or reads its kernels from :func:`use_compile_cache`'s directory), and
    equal to the uncompiled run up to float round-off. :func:`compile_problem` tells whether this machine can compile.

    The model trains on the device it is on. ``precision``: ``torch.float32`` (plain), ``torch.bfloat16`` or
    ``torch.float16`` (forward under ``torch.autocast``; float16 with ``torch.amp.GradScaler``). ``world``: this
    process's place in a torchrun job (:func:`~transformer_lab.distributed.world_from_env`, after
    :func:`~transformer_lab.distributed.init`); with more than one rank the model is wrapped in
    ``DistributedDataParallel`` and only rank 0 writes checkpoints and shows progress.
    """

    def __init__(self, model: nn.Module, corpus: Corpus, config: TrainConfig = TrainConfig(), *,
                 checkpoint: str | Path | None = None, meta: dict[str, Any] | None = None, progress: bool = True,
                 compile: bool = False, precision: torch.dtype = torch.float32, world: World | None = None):
        world = world or World()
        self.model, self.corpus, self.config, self.world = model, corpus, config, world
        self.device = next(model.parameters()).device
        self.precision = precision
        self.checkpoint = None if checkpoint is None else ckpt.json_path(checkpoint)
        self.meta = dict(meta or {})
        self.meta.setdefault("config", asdict(model.config) if dataclasses.is_dataclass(
            getattr(model, "config", None)) else {})
        self.progress = progress and world.is_main
        check_corpus(corpus, config)  # before anything is set up (or broadcast to the other ranks)
        V = getattr(getattr(model, "config", None), "vocab_size", None)
        if isinstance(V, int) and corpus.tokenizer.vocab_size > V:  # then every token id is a valid class id
            raise ValueError(f"the corpus has {corpus.tokenizer.vocab_size} distinct characters, more than the "
                             f"model's vocab_size={V}; build the model with vocab_size=corpus.tokenizer.vocab_size")
        self.ddp = None
        if world.size > 1:  # averages the ranks' gradients during backward (and broadcasts rank 0's weights now)
            self.ddp = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[self.device] if self.device.type == "cuda" else None)
        self._wrapped = self.ddp or model  # what the training forward calls
        self.loss_of = self._loss_of
        # float16's narrow range needs the loss scaled up before backward (and the gradients down after)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=precision == torch.float16)
        c = config
        # with clipping, the clipped norm already tells a non-finite gradient: AdamW need not check again
        self.optimizer = FastAdamW(decay_groups(model, c.weight_decay), lr=c.lr, betas=(c.beta1, c.beta2),
                               check_finite=c.grad_clip == 0)
        # one tensor per group: the update in eight operations per group, not per tensor (one kernel when compiled)
        self.optimizer.flatten_()
        self.compiled = False
        if compile:
            self.compile_()
        self.schedule = WarmupCosine(c.lr, c.min_lr, c.warmup, c.max_iters)
        self.generator = torch.Generator().manual_seed(c.seed)  # the batch sampler, the same on every rank
        torch.manual_seed(c.seed + world.rank)  # dropout draws from the global generator, its own on each rank
        g = torch.Generator().manual_seed(c.seed + 1)  # fixed evaluation batches, each split among the ranks
        self.eval_batches = {split: [self._rows(*get_batch(data, block_size=c.block_size,
                                                           batch_size=self.global_batch, generator=g))
                                     for _ in range(c.eval_iters)]
                             for split, data in (("train", corpus.train), ("val", corpus.val))}
        self.step = 0
        self.history: dict[str, list] = {"loss": [], "eval": []}
        self.tokens_per_s = 0.0
        self.step_seconds: list[float] = []  # wall time of this process's first steps (the first holds a compile)

    def compile_(self, *, blocks: bool = False) -> None:
        """Run the training forward with its loss (and so their backward), the update and the clipping through
        ``torch.compile`` from the next step on (the class docstring says what that does).

        ``blocks=True`` compiles each of the model's ``blocks`` instead of the whole forward with its loss: the
        blocks are alike, so they share one compiled code and the compile takes a fraction of the time, while the
        token lookup, the last LayerNorm, the head and the loss stay eager (a less fused, slower step)."""
        use_compile_cache()
        if blocks:
            for block in self.model.blocks:
                block.compile()
        else:  # one graph at the recipe's shapes in one process; under torchrun, DDP's forward splits it in two
            self.loss_of = torch.compile(self._loss_of)
        self.optimizer.flatten_(compile=True)
        self.compiled = True

    def eagerly(self):
        """A context in which compiled parts of the model run eagerly: evaluation, whose no-gradient mode and batch
        shapes would otherwise make the compiled blocks compile again, a cost no faster step repays."""
        return torch.compiler.set_stance("force_eager") if self.compiled else nullcontext()

    @property
    def global_batch(self) -> int:
        """Windows per optimizer step over all ranks: N · K · B."""
        return self.world.size * self.config.grad_accum * self.config.batch_size

    def _rows(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's K · B rows of a global batch."""
        rows = distributed.rank_rows(self.world, self.config.grad_accum * self.config.batch_size)
        return x[rows], y[rows]

    def _micro_batches(self, x: torch.Tensor, y: torch.Tensor):
        """The K micro-batches of B rows of this rank's rows, on the model's device."""
        B = self.config.batch_size
        for i in range(0, len(x), B):
            yield x[i:i + B].to(self.device), y[i:i + B].to(self.device)

    def _loss_of(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The mean of -log p(y_t | x_{<=t}) over the rows x, y (B, T): the forward under autocast, the loss in
        float32 (or wider)."""
        with self._autocast():
            logits = self._wrapped(x)  # (B, T, V)
        wide = logits.to(torch.promote_types(logits.dtype, torch.float32))  # 16-bit logits: in float32
        return cross_entropy(wide, y)

    def _autocast(self):
        if self.precision == torch.float32:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.precision)

    # ------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean loss on the fixed evaluation batches of each split (each rank evaluates its rows; averaged)."""
        was_training = self.model.training
        self.model.eval()
        K = self.config.grad_accum
        out = {}
        with self.eagerly():
            for split, batches in self.eval_batches.items():
                local = sum(float(cross_entropy(self.model(xb), yb)) for x, y in batches
                            for xb, yb in self._micro_batches(x, y)) / (len(batches) * K)
                out[split] = distributed.mean_over_ranks(torch.tensor(local), self.world)
        self.model.train(was_training)
        return out

    # ------------------------------------------------------------ checkpoints
    def save(self, path: str | Path | None = None, *, weights_only: bool = False) -> Path:
        """Write a resumable checkpoint (weights, optimizer, step, RNG states, history, corpus hash).

        ``weights_only=True`` leaves out the optimizer's moments: a small release checkpoint that loads for
        sampling but cannot be resumed. Under torchrun every rank must call it (the ranks' dropout RNG states are
        gathered); only rank 0 writes.
        """
        path = path or self.checkpoint
        if path is None:
            raise ValueError("no checkpoint path: pass checkpoint= to Trainer or a path to save()")
        states = distributed.gather_objects(ckpt.encode_rng(torch.get_rng_state()), self.world)
        rng = {"batches": ckpt.encode_rng(self.generator.get_state()), "torch": states[0]}
        if self.world.size > 1:
            rng["torch_ranks"] = states
        meta = {**self.meta, "step": self.step, "train_config": asdict(self.config),
                "corpus_sha256": self.corpus.sha256, "corpus_name": self.corpus.name,
                "vocab": self.corpus.tokenizer.chars, "history": self.history, "rng": rng,
                "world_size": self.world.size, "precision": str(self.precision).removeprefix("torch.")}
        if self.scaler.is_enabled():
            meta["grad_scaler"] = self.scaler.state_dict()
        path = ckpt.json_path(path)
        if not self.world.is_main:
            return path
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
        saved_train = {"grad_accum": 1, **saved_train} if isinstance(saved_train, dict) else {}
        split = ("batch_size", "grad_accum")  # how the global batch is split may change; its size may not
        diff = sorted(k for k in mine if k not in split and saved_train.get(k) != mine[k])
        saved_global = _global_batch(saved_train, record)
        if saved_global != self.global_batch:
            diff.append(f"global batch ({saved_global} windows a step, here {self.global_batch})")
        if diff:
            raise bad(f"{path} was written with another training config; differing: {diff}")
        if record["config"] != self.meta["config"]:
            diff = sorted(k for k in set(record["config"]) | set(self.meta["config"])
                          if record["config"].get(k) != self.meta["config"].get(k))
            raise bad(f"{path} holds a model with another config; differing fields: {diff}")
        precision, saved = str(self.precision).removeprefix("torch."), str(record.get("precision", "float32"))[:40]
        if saved != precision:
            raise bad(f"{path} was trained in {saved}; this run would continue it in {precision}: resume with "
                      f"--dtype {saved}")
        step = record.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= self.config.max_iters:
            raise bad(f"{path}: 'step' must be an int in [0, max_iters={self.config.max_iters}], got "
                      f"{str(step)[:40]}")
        history = _checked_history(record.get("history"), step, path)
        states = _checked_rng(record.get("rng"), path, self.world)
        got = ckpt.check_model_state({k: tuple(v.shape) for k, v in ckpt.model_tensors(self.model).items()},
                                     tensors, source=str(path))
        optim_state = ckpt.optimizer_state(self.optimizer, self.model, record, tensors)
        scaler = record.get("grad_scaler")
        if self.scaler.is_enabled() and scaler is not None and not (
                isinstance(scaler, dict) and _finite(scaler.get("scale")) and scaler["scale"] > 0):
            raise bad(f"{path}: 'grad_scaler' must hold a finite positive 'scale', got {str(scaler)[:60]}")
        # every check passed: now change the model, the optimizer, the step, the history and the RNGs
        ckpt.load_model_state(self.model, {f"model.{k}": v for k, v in got.items()}, source=str(path))
        self.optimizer.load_state_dict(optim_state)
        self.step = step
        self.history = history
        self.generator.set_state(states["batches"])
        torch.set_rng_state(states["torch"])
        if states["torch"] is states.get("rank0") and self.world.rank > 0:  # another job shape wrote it
            torch.manual_seed(self.config.seed + self.world.rank + 7919 * step)  # a fresh dropout stream
        if self.scaler.is_enabled() and scaler is not None:
            self.scaler.load_state_dict(scaler)

    # ------------------------------------------------------------ the loop
    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """One optimizer step on this rank's K · B rows x, y (K·B, T); returns the loss before the step, averaged
        over the global batch.

        Each micro-batch's mean loss is divided by K before backward, so the summed gradient is the gradient of
        the mean over the K micro-batches; DistributedDataParallel then averages over the N ranks:
        g = (1/(N K)) Σ_r Σ_k ∇L_{r,k}, the gradient of the mean loss over the whole global batch.
        """
        lr = self.schedule.apply(self.optimizer, self.step)  # η(s): warm-up, then cosine
        K = self.config.grad_accum
        self.optimizer.zero_grad(set_to_none=True)
        losses = []
        for k, (xb, yb) in enumerate(self._micro_batches(x, y)):
            # the ranks' gradients are averaged once, after the last micro-batch, not after each
            sync = nullcontext() if self.ddp is None or k == K - 1 else self.ddp.no_sync()
            with sync:
                loss = self.loss_of(xb, yb) / K
                self.scaler.scale(loss).backward()
            losses.append(loss.detach())
        value = distributed.mean_over_ranks(sum(losses), self.world)  # the same number on every rank
        if not math.isfinite(value):
            raise TrainingDiverged(f"training stopped at step {self.step}: the loss is {value} (lr {lr:.3g}); "
                                   "lower the learning rate or check the data")
        self.scaler.unscale_(self.optimizer)  # no-op unless float16: the true gradients, before clipping
        if self.config.grad_clip > 0:
            norm = self.optimizer.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)  # torch's formula
            if not torch.isfinite(norm) and not self.scaler.is_enabled():  # the scaler skips such a step
                raise TrainingDiverged(f"training stopped at step {self.step}: the gradient norm is {float(norm)}"
                                       f" (lr {lr:.3g}); lower the learning rate or check the data")
        try:
            self.scaler.step(self.optimizer)  # optimizer.step(), skipped by the float16 scaler on inf gradients
            self.scaler.update()
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
        tokens = self.global_batch * c.block_size
        try:
            while self.step < end:
                t0 = time.perf_counter()
                x, y = self._rows(*get_batch(self.corpus.train, block_size=c.block_size,
                                             batch_size=self.global_batch, generator=self.generator))  # (K·B, T)
                loss = self.train_step(x, y)
                dt = time.perf_counter() - t0
                if len(self.step_seconds) < 64:
                    self.step_seconds.append(dt)
                self.history["loss"].append(loss)
                rate = tokens / max(dt, 1e-9)
                self.tokens_per_s = rate if self.tokens_per_s == 0 else 0.9 * self.tokens_per_s + 0.1 * rate
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{self.tokens_per_s:,.0f}", refresh=False)
                if self.step % c.eval_interval == 0 or self.step == c.max_iters:
                    ev = self._evaluate_and_save()
                    if self.world.is_main:
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


def _global_batch(train_config: dict, record: dict) -> int | None:
    """Windows per step of the run that wrote ``record``: batch_size · grad_accum · world_size."""
    n, b, k = record.get("world_size", 1), train_config.get("batch_size"), train_config.get("grad_accum")
    ok = all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (n, b, k))
    return n * b * k if ok else None


def _checked_rng(rng: Any, path, world: World) -> dict[str, torch.Tensor]:
    """The generator states of a checkpoint, decoded and tried on a scratch generator.

    ``torch`` is this rank's dropout RNG: taken from ``torch_ranks`` (a torchrun checkpoint) when this job has as
    many ranks as the one that wrote it, else rank 0's (``out["rank0"]`` is then the same object)."""
    bad = ckpt.CheckpointError
    if not isinstance(rng, dict):
        raise bad(f"{path}: 'rng' must be an object with the generator states 'batches' and 'torch'")
    size = len(torch.Generator().get_state())
    ranks = rng.get("torch_ranks")
    same_shape = isinstance(ranks, list) and len(ranks) == world.size
    if same_shape:
        rng = {**rng, "torch": ranks[world.rank]}
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
    if not same_shape:
        out["rank0"] = out["torch"]
    return out
