"""The build-up ladder (chapter 8): a GPT assembled one component at a time, each rung trained the same way.

    bigram       x = E[w],                                   z = x Eᵀ        (embedding and tied head only)
    attention    x ← MHA₁(x) in each block                   (one head, causal; ch. 1, 6)
    multi-head   x ← MHA_h(x)                                (h heads of width C / h; same parameters)
    mlp          x ← MLP(MHA_h(x))                           (GELU feed-forward; ch. 4)
    residual     x ← x + MHA_h(x),  x ← x + MLP(x)           (the residual stream; ch. 7)
    layernorm    x ← x + MHA_h(LN(x)), x ← x + MLP(LN(x)), z = LN(x) Eᵀ   (pre-LN; ch. 7)
    + positions  the book's :class:`~transformer_lab.gpt.GPT`, with learned, sinusoidal or RoPE positions (ch. 6)

Every rung before the last has no positional information at all; the three position rungs each add one choice
to the layernorm rung, and each of them *is* a ``GPT``. Every rung is built from the package's components
(``Embedding``, ``tie_weights``, ``LMHead``, ``MultiHeadAttention``, ``MLP``, ``LayerNorm``, ``GPT``; the last
three in their fast form, :mod:`transformer_lab.fast`, as the GPT uses them), initialised
by ``init_gpt_weights``, and trained by :class:`~transformer_lab.train.Trainer` with one :class:`TrainConfig`
and one seed, so that the rungs differ only in their architecture.
"""

from __future__ import annotations

import contextlib
import io
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from torch import nn

from transformer_lab.attention import Embedding, tie_weights
from transformer_lab.checkpoint import _atomic_write
from transformer_lab.data import Corpus
from transformer_lab.fast import FastLayerNorm, FastMLP, FastMultiHeadAttention
from transformer_lab.gpt import GPT, GPTConfig
from transformer_lab.information import ngram_baselines_nats
from transformer_lab.numerics import init_gpt_weights
from transformer_lab.softmax import LMHead
from transformer_lab.train import TrainConfig, Trainer, evaluate_loss


@dataclass(frozen=True)
class Rung:
    """One rung: which components the model has. ``n_head = 0``: no blocks at all (the bigram)."""

    name: str  # short name, used in tables and on the command line
    adds: str  # the component this rung adds to the one it is built on
    n_head: int = 0  # attention heads per block (0: no blocks)
    mlp: bool = False  # a GELU MLP after the attention in each block
    residual: bool = False  # x + F(x) instead of F(x)
    layernorm: bool = False  # pre-LN in each block and a final LayerNorm before the head
    positions: str | None = None  # None, or GPTConfig.positions: "learned", "sinusoidal", "rope"
    parent: str | None = None  # the rung this one adds to


def _rungs(n_head: int) -> tuple[Rung, ...]:
    chain = (Rung("bigram", "token embedding and the tied head"),
             Rung("attention", "one causal attention head per block", n_head=1, parent="bigram"),
             Rung("multi-head", f"{n_head} heads instead of one", n_head=n_head, parent="attention"),
             Rung("mlp", "the GELU MLP", n_head=n_head, mlp=True, parent="multi-head"),
             Rung("residual", "residual connections", n_head=n_head, mlp=True, residual=True, parent="mlp"),
             Rung("layernorm", "pre-LN LayerNorms and a final LayerNorm", n_head=n_head, mlp=True, residual=True,
                  layernorm=True, parent="residual"))
    top = chain[-1]
    return chain + tuple(replace(top, name=p, adds=f"{p} positions", positions=p, parent="layernorm")
                         for p in ("learned", "sinusoidal", "rope"))


@dataclass(frozen=True)
class LadderConfig:
    """The shape every rung shares and the one training budget every rung gets."""

    d_model: int = 32  # C: width of the residual stream
    n_layer: int = 2  # L: blocks (rungs with attention)
    n_head: int = 4  # h from the multi-head rung on (d_k = C / h, even for RoPE)
    block_size: int = 32  # T: context length in training and evaluation
    batch_size: int = 16  # sequences per step
    max_iters: int = 2000  # the full budget: optimizer steps per rung (`python -m transformer_lab ladder`)
    lr: float = 3e-3  # peak learning rate (warm-up, then cosine to lr / 10)
    warmup: int = 20  # linear warm-up steps
    eval_windows: int = 256  # validation loss over the first this many whole T-character windows of the val split
    seed: int = 0  # the same weights' seed and the same batches for every rung

    @property
    def rungs(self) -> tuple[Rung, ...]:
        return _rungs(self.n_head)

    def gpt_config(self, vocab_size: int, positions: str = "learned") -> GPTConfig:
        return GPTConfig(vocab_size=vocab_size, block_size=self.block_size, n_layer=self.n_layer,
                         n_head=self.n_head, d_model=self.d_model, positions=positions)

    def train_config(self) -> TrainConfig:
        return TrainConfig(max_iters=self.max_iters, batch_size=self.batch_size, block_size=self.block_size,
                           lr=self.lr, min_lr=self.lr / 10, warmup=min(self.warmup, self.max_iters - 1),
                           eval_interval=self.max_iters, eval_iters=1, seed=self.seed)


SHORT = LadderConfig(max_iters=90)
"""The short budget chapter 8 trains while the page is built (a few seconds for all nine rungs)."""
FULL = LadderConfig()
"""The full budget of ``python -m transformer_lab ladder`` (a few minutes on one thread)."""


CURVE_EVERY = 10
"""Training steps per point of a rung's stored loss curve."""


class RungBlock(nn.Module):
    """A block with the rung's components: [LN →] MHA [+ x], then [[LN →] MLP [+ x]].  x (B, T, C) -> (B, T, C).

    Parameter names are :class:`~transformer_lab.gpt.Block`'s (``ln1``, ``attn``, ``ln2``, ``mlp``).
    """

    def __init__(self, config: GPTConfig, rung: Rung):
        super().__init__()
        c, self.rung = config, rung
        self.attn = FastMultiHeadAttention(c.d_model, rung.n_head, bias=c.bias)
        if rung.mlp:
            self.mlp = FastMLP(c.d_model, bias=c.bias, approximate=c.gelu)
        if rung.layernorm:
            self.ln1 = FastLayerNorm(c.d_model, bias=c.bias)
            if rung.mlp:
                self.ln2 = FastLayerNorm(c.d_model, bias=c.bias)

    def _sublayer(self, x: torch.Tensor, f, ln: str) -> torch.Tensor:
        h = getattr(self, ln)(x) if self.rung.layernorm else x  # LN(x) or x
        return x + f(h) if self.rung.residual else f(h)  # x + F(·) or F(·)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._sublayer(x, lambda h: self.attn(query=h, key=h, value=h, is_causal=True), "ln1")  # causal MHA
        return self._sublayer(x, self.mlp, "ln2") if self.rung.mlp else x


class RungModel(nn.Module):
    """A rung without positions: idx (B, T) -> logits (B, T, V), names as in ``GPT`` (``tok_emb``, ``blocks``,
    ``ln_f``, ``head``), the head tied to the embedding, ``init_gpt_weights`` as ``GPT``."""

    def __init__(self, config: GPTConfig, rung: Rung):
        super().__init__()
        if rung.positions is not None:
            raise ValueError(f"rung {rung.name!r} has positions: it is a GPT, build it with build_rung")
        self.config, self.rung = config, rung
        self.tok_emb = Embedding(config.vocab_size, config.d_model)  # E (V, C)
        if rung.n_head:
            self.blocks = nn.ModuleList(RungBlock(config, rung) for _ in range(config.n_layer))
        if rung.layernorm:
            self.ln_f = FastLayerNorm(config.d_model, bias=config.bias)
        self.head = LMHead(config.d_model, config.vocab_size)
        tie_weights(self.head, self.tok_emb)  # z = x Eᵀ
        init_gpt_weights(self, n_layer=config.n_layer)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.dim() != 2 or idx.shape[1] > self.config.block_size:
            raise ValueError(f"idx must be (B, T) with T <= {self.config.block_size}, got {tuple(idx.shape)}")
        x = self.tok_emb(idx)  # (B, T, C): no positions
        for block in getattr(self, "blocks", ()):
            x = block(x)
        if self.rung.layernorm:
            x = self.ln_f(x)
        return self.head(x)  # (B, T, V)


def build_rung(rung: Rung, vocab_size: int, config: LadderConfig = FULL) -> nn.Module:
    """The rung's model, its weights drawn from ``config.seed``: a :class:`RungModel`, or a ``GPT`` for the
    position rungs."""
    torch.manual_seed(config.seed)
    if rung.positions is not None:
        return GPT(config.gpt_config(vocab_size, rung.positions))
    return RungModel(config.gpt_config(vocab_size), rung)


def fit_rung(rung: Rung, corpus: Corpus, config: LadderConfig = FULL) -> tuple[nn.Module, dict]:
    """Build and train one rung: ``(model, the trainer's history)``, the trainer's evaluation lines silenced."""
    model = build_rung(rung, corpus.tokenizer.vocab_size, config)
    trainer = Trainer(model, corpus, config.train_config(), progress=False)
    with contextlib.redirect_stdout(io.StringIO()):
        history = trainer.run()
    return model, history


def train_rung(rung: Rung, corpus: Corpus, config: LadderConfig = FULL) -> dict:
    """Build, train and evaluate one rung: ``{name, adds, parent, params, val_loss, first_loss, curve,
    cpu_seconds}``.

    ``val_loss``: nats per character over the first ``config.eval_windows`` whole windows of the val split;
    ``curve``: the training loss averaged over each :data:`CURVE_EVERY` steps; ``cpu_seconds``: building and training
    the rung.
    """
    t0 = time.process_time()
    model, history = fit_rung(rung, corpus, config)
    seconds = time.process_time() - t0
    val = evaluate_loss(model, corpus.val, block_size=config.block_size, max_windows=config.eval_windows)
    losses = torch.tensor(history["loss"])
    curve = losses[:len(losses) // CURVE_EVERY * CURVE_EVERY].view(-1, CURVE_EVERY).mean(1)  # means of 10 steps
    return {"name": rung.name, "adds": rung.adds, "parent": rung.parent,
            "params": sum(p.numel() for p in model.parameters()),  # the tied matrix once
            "val_loss": val, "first_loss": float(losses[0]), "curve": [round(float(v), 5) for v in curve],
            "cpu_seconds": round(seconds, 2)}


def scored_baselines(corpus: Corpus, config: LadderConfig = FULL) -> dict:
    """The n-gram baselines (n = 1, 2, 3; nats per character), counted on the training text and scored on the
    characters the rungs are scored on: the first ``config.eval_windows`` whole windows of the val split."""
    n_val = len(corpus.val)
    scored = corpus.text[-n_val:][: config.eval_windows * config.block_size + 1]
    return ngram_baselines_nats(corpus.text[:-n_val], orders=(1, 2, 3), held_out=scored)


def run_ladder(corpus: Corpus, config: LadderConfig = FULL, *, report=None) -> dict:
    """Train every rung with the same budget; returns the table with the n-gram baselines beside it.

    ``report(row)`` is called after each rung. The result is JSON-able: ``{"config", "threads", "torch",
    "baselines": {n: nats}, "rungs": [row, ...]}``.
    """
    rows = []
    for rung in config.rungs:
        rows.append(train_rung(rung, corpus, config))
        if report is not None:
            report(rows[-1])
    baselines = scored_baselines(corpus, config)
    return {"config": asdict(config), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "corpus_sha256": corpus.sha256, "baselines": {str(n): v for n, v in baselines.items()}, "rungs": rows}


TABLE = Path(__file__).resolve().parent / "checkpoints" / "ladder.json"
"""The full-budget table that ships with the package (written by ``python -m transformer_lab ladder``)."""


def save_table(table: dict, path: str | Path = TABLE) -> Path:
    """Write ``table`` as JSON, atomically (a temporary file renamed over ``path``)."""
    path = Path(path)
    text = json.dumps(table, indent=1, allow_nan=False)
    _atomic_write(path, lambda tmp: Path(tmp).write_text(text + "\n", encoding="utf-8"))
    return path


def load_table(path: str | Path = TABLE) -> dict:
    """The table written by :func:`save_table`."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def format_table(table: dict) -> str:
    """The table as text: one line per rung, the baselines below."""
    lines = [f"{'rung':<11} {'adds':<42} {'params':>7} {'val loss':>9}"]
    for r in table["rungs"]:
        lines.append(f"{r['name']:<11} {r['adds']:<42} {r['params']:>7,} {r['val_loss']:>9.4f}")
    lines += [f"{n}-gram Kneser-Ney baseline: {v:.4f}" for n, v in table["baselines"].items()]
    return "\n".join(lines)
