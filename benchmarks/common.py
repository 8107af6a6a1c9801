"""Shared helpers for the capstone's benchmarks: build the recipe models and time training steps."""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from transformer_lab.data import Corpus, get_batch, load_corpus
from transformer_lab.fast import FastAdamW
from transformer_lab.gpt import GPT, GPTConfig
from transformer_lab.information import cross_entropy
from transformer_lab.optim import decay_groups
from transformer_lab.reference import ReferenceGPT

RESULTS = Path(__file__).resolve().parent / "results"  # one JSON file per benchmark, read by the book's fast page


def positive(text: str) -> int:
    """An argparse type: a count (steps, rounds, threads, ...) of at least 1, else a clear usage error."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {n}")
    return n


def add_out(ap: argparse.ArgumentParser, name: str) -> None:
    """The ``--out`` option: where the benchmark writes its ratios (default ``results/NAME.json``; ``-``: nowhere)."""
    ap.add_argument("--out", default=str(RESULTS / f"{name}.json"),
                    help="write the ratios here as JSON (default %(default)s; '-': nowhere)")


def write_result(out: str, name: str, rows: list[dict], **details) -> None:
    """Write ``{"benchmark": name, "rows": rows, "machine": ..., **details}`` to ``out`` as JSON, unless it is ``-``.

    Each row is ``{"compares": what the ratio divides, "ratio": the number}``; the first row is the one quoted."""
    if out == "-":
        return
    machine = {"torch": torch.__version__, "python": platform.python_version(), "cpu": platform.processor()
               or platform.machine(), "cpus": os.cpu_count(), "kernels": torch.backends.cpu.get_cpu_capability()}
    doc = {"benchmark": name, "rows": [{**r, "ratio": round(float(r["ratio"]), 4)} for r in rows],
           "machine": machine, **details}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}")


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


def builtin_loss(model):
    """``loss_of(x, y)`` with torch's cross-entropy: the mean over the B·T positions of the cross-entropy of
    ``model(x)``'s logits (B, T, V) against the targets y (B, T)."""

    def loss_of(x, y):
        return F.cross_entropy(model(x).flatten(0, 1), y.flatten())

    return loss_of


def stack(model, kind: str, *, compile: bool = False):
    """(loss_of, optimizer) for a model: ``loss_of(x, y)`` is the mean cross-entropy of ``model(x)`` against ``y``;
    ours uses the book's loss and optimizer, the reference torch's built-ins. With ``compile``, ``loss_of`` (the
    forward and the loss) runs through ``torch.compile`` as one function, as the trainer compiles it.

    Ours is set up as the trainer sets it up: clipping's norm checks finiteness (so AdamW need not), the groups
    flattened, and with ``compile`` (a compiled model) the flat update and the clipping compiled too."""
    if kind == "ours":
        opt = FastAdamW(decay_groups(model, 0.1), lr=1e-3, betas=(0.9, 0.99), check_finite=False)
        opt.flatten_(compile=compile)

        def loss_of(x, y):
            return cross_entropy(model(x), y)
    else:
        opt = torch.optim.AdamW(decay_groups(model, 0.1), lr=1e-3, betas=(0.9, 0.99))
        loss_of = builtin_loss(model)
    return (torch.compile(loss_of) if compile else loss_of), opt


def clip(model, opt, max_norm: float = 1.0) -> torch.Tensor:
    """Clip the gradients as the trainer does: ours through :meth:`FastAdamW.clip_grad_norm_` (one compiled kernel over
    the flat gradients when the update is compiled), the reference with torch's ``clip_grad_norm_``."""
    if isinstance(opt, FastAdamW):
        return opt.clip_grad_norm_(model.parameters(), max_norm)
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


def time_steps(model, loss_of, opt, data, *, steps: int, batch_size: int, block_size: int,
               generator: torch.Generator, clock=time.perf_counter) -> float:
    """Seconds for ``steps`` full training steps (batch, forward, loss, backward, clip, update).

    ``clock``: ``time.perf_counter`` (wall time) or ``time.process_time`` (this process's CPU time, steadier
    on a machine shared with other work).
    """
    model.train()
    t0 = clock()
    for _ in range(steps):
        x, y = get_batch(data, block_size=block_size, batch_size=batch_size, generator=generator)
        loss = loss_of(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        clip(model, opt)
        opt.step()
    return clock() - t0


def alternate(runs: dict, data, *, rounds: int, steps: int, clock=time.perf_counter, **kw) -> dict[str, list[float]]:
    """{name: seconds of each round}: ``rounds`` rounds of ``steps`` training steps of every ``(model, loss_of, opt)``
    in ``runs``, alternating between them, the order reversed every other round; round r's batches come from seed r,
    the same for every run, so a busy, shared machine slows them alike."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(rounds):
        for name in list(runs) if r % 2 == 0 else list(reversed(runs)):
            times[name].append(time_steps(*runs[name], data, steps=steps, clock=clock,
                                          generator=torch.Generator().manual_seed(r), **kw))
    return times


def median_ratio(times: list[float], base: list[float]) -> float:
    """The median over rounds of base / times, each round's ratio taken within the round: speed relative to ``base``."""
    return statistics.median(b / t for t, b in zip(times, base, strict=True))


def step_parser(doc: str, name: str, *, steps: int, rounds: int) -> argparse.ArgumentParser:
    """The options of a benchmark ``name`` that times whole training steps of several variants in alternating
    rounds."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    add_out(ap, name)
    ap.add_argument("--steps", type=positive, default=steps, help="training steps per timed round")
    ap.add_argument("--rounds", type=positive, default=rounds, help="alternating rounds per variant")
    ap.add_argument("--batch-size", type=positive, default=12)
    ap.add_argument("--block-size", type=positive, default=64)
    ap.add_argument("--threads", type=positive, nargs="+", default=[1, 2], help="torch thread counts (default 1 2)")
    ap.add_argument("--cpu-time", action="store_true", help="time with process CPU time instead of wall time")
    return ap


def per_thread_count(args, measure, report) -> dict:
    """``{"runs": [measure(args, threads, corpus, clock) for each of args.threads]}``, each reported as it ends;
    ``clock`` is wall time, or this process's CPU time with ``--cpu-time``."""
    clock = time.process_time if args.cpu_time else time.perf_counter
    corpus = default_corpus()
    results = []
    for threads in args.threads:
        out = measure(args, threads, corpus, clock)
        report(out, args)
        results.append(out)
    return {"runs": results}


def speed_rows(result: dict, first: str, base: str) -> list[dict]:
    """One row per variant and thread count of ``per_thread_count``'s result: its speed relative to ``base``;
    ``first`` (at the first thread count) leads."""
    rows = [(name != first, i, {"compares": f"{name}: speed relative to {base}, {run['threads']} thread(s)",
                                "ratio": v["ratio"]})
            for i, run in enumerate(result["runs"]) for name, v in run["variants"].items() if name != base]
    return [row for *_, row in sorted(rows, key=lambda r: r[:2])]
