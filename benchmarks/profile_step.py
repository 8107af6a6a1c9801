"""Where a training step's time goes: ours against the built-in reference, operator by operator, in one process.

Runs both models' training steps (recipe config) under ``torch.profiler`` in alternating rounds and prints the
milliseconds per step of the forward pass, backward pass and update, then the operators whose time differs most.
Profiling inflates every operator's cost by a few microseconds, so the totals overstate the gap that
``train_speed.py`` measures; the *ranking* is what this script is for.

    python benchmarks/profile_step.py [--threads 1] [--rounds 6] [--steps 5] [--top 20]
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import clip, default_corpus, positive, recipe_models, stack

from transformer_lab.data import get_batch

PHASES = ("forward", "backward", "update")


def step_fn(model, kind: str, data: torch.Tensor, generator: torch.Generator):
    loss_of, opt = stack(model, kind)

    def step() -> None:
        x, y = get_batch(data, block_size=model.config.block_size, batch_size=12, generator=generator)
        with record_function("forward"):
            loss = loss_of(x, y)
        opt.zero_grad(set_to_none=True)
        with record_function("backward"):
            loss.backward()
        with record_function("update"):
            clip(model, opt)
            opt.step()

    return step


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=positive, default=6)
    ap.add_argument("--steps", type=positive, default=5, help="profiled steps per round and model")
    ap.add_argument("--top", type=positive, default=20, help="operators to list")
    ap.add_argument("--threads", type=positive, default=1, help="torch's intra-op threads")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    corpus = default_corpus()
    ours, ref = recipe_models(corpus.tokenizer.vocab_size)
    steps = {kind: step_fn(m, kind, corpus.train, torch.Generator().manual_seed(0))
             for kind, m in (("ours", ours), ("reference", ref))}
    for step in steps.values():  # warm-up
        for _ in range(3):
            step()
    ms = {kind: collections.defaultdict(float) for kind in steps}  # milliseconds per step
    n = args.rounds * args.steps
    for _ in range(args.rounds):
        for kind, step in steps.items():
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(args.steps):
                    step()
            for e in prof.key_averages():
                key = f"[{e.key}]" if e.key in PHASES else e.key
                ms[kind][key] += (e.cpu_time_total if e.key in PHASES else e.self_cpu_time_total) / n / 1000
    print("ms per step (profiled)                    ours  reference   difference")
    for phase in PHASES:
        o, r = ms["ours"][f"[{phase}]"], ms["reference"][f"[{phase}]"]
        print(f"  {phase:36s} {o:8.2f} {r:10.2f} {o - r:+12.2f}")
    ops = (set(ms["ours"]) | set(ms["reference"])) - {f"[{p}]" for p in PHASES}
    ranked = sorted(ops, key=lambda k: -abs(ms["ours"][k] - ms["reference"][k]))[:args.top]
    print("operators with the largest difference (self time)")
    for k in ranked:
        o, r = ms["ours"][k], ms["reference"][k]
        print(f"  {k[:36]:36s} {o:8.2f} {r:10.2f} {o - r:+12.2f}")
    return {kind: dict(v) for kind, v in ms.items()}


if __name__ == "__main__":
    main()
