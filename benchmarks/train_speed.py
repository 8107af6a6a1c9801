"""Training throughput of our GPT against the built-in reference GPT, same config, same run.

Both models train on the same batches; timing alternates between them in short rounds, so a busy, shared
machine slows both alike, and the ratio (ours / reference tokens per second) is what we quote. Also reports
the share of the machine's measured matmul peak (FLOP/s) that our training step uses.

    python benchmarks/train_speed.py [--steps 30] [--rounds 5] [--threads N] [--cpu-time] [--compile]

``--compile`` runs both models through ``torch.compile`` (the warm-up, which includes compiling, is timed and
printed) to see whether fusing the operations closes the gap.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import default_corpus, recipe_models, stack, time_steps


def matmul_peak(n: int = 512, repeat: int = 20) -> float:
    """The best FLOP/s of an (n, n) @ (n, n) float32 product on this machine: our 'peak'."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def train_flops_per_token(model) -> float:
    """≈ 6 N + 6 L T C FLOPs per token for a forward + backward pass (Kaplan et al., 2020; N = non-embedding)."""
    c = model.config
    n = sum(p.numel() for n_, p in model.named_parameters() if "emb" not in n_)
    return 6 * n + 6 * c.n_layer * c.block_size * c.d_model + 6 * c.d_model * c.vocab_size


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30, help="training steps per timed round")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds per model")
    ap.add_argument("--batch-size", type=int, default=12)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--cpu-time", action="store_true", help="time with process CPU time instead of wall time")
    ap.add_argument("--compile", action="store_true", help="torch.compile both models first")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.process_time if args.cpu_time else time.perf_counter
    corpus = default_corpus()
    ours, ref = recipe_models(corpus.tokenizer.vocab_size, block_size=args.block_size)
    stacks = {"ours": (ours, *stack(ours, "ours")), "reference": (ref, *stack(ref, "reference"))}
    if args.compile:
        stacks = {k: (torch.compile(m), loss_fn, opt) for k, (m, loss_fn, opt) in stacks.items()}
    times: dict[str, list[float]] = {k: [] for k in stacks}
    for kind, (model, loss_fn, opt) in stacks.items():  # warm-up (and compilation)
        t0 = time.perf_counter()
        time_steps(model, loss_fn, opt, corpus.train, steps=5, batch_size=args.batch_size,
                   block_size=args.block_size, generator=torch.Generator().manual_seed(0))
        if args.compile:
            print(f"  {kind}: compiled and warmed up in {time.perf_counter() - t0:.1f} s")
    for r in range(args.rounds):
        order = list(stacks) if r % 2 == 0 else list(reversed(stacks))
        for kind in order:
            model, loss_fn, opt = stacks[kind]
            times[kind].append(time_steps(model, loss_fn, opt, corpus.train, steps=args.steps,
                                          batch_size=args.batch_size, block_size=args.block_size,
                                          generator=torch.Generator().manual_seed(r), clock=clock))
    tokens = args.steps * args.batch_size * args.block_size
    tps = {k: tokens / min(v) for k, v in times.items()}  # the best round: the least disturbed by other work
    pair_ratios = [r / o for o, r in zip(times["ours"], times["reference"], strict=True)]
    peak = matmul_peak()
    flops = train_flops_per_token(ours) * tps["ours"]
    out = {"tokens_per_s_ours": tps["ours"], "tokens_per_s_reference": tps["reference"],
           "ratio": tps["ours"] / tps["reference"], "median_pair_ratio": statistics.median(pair_ratios),
           "matmul_peak_gflops": peak / 1e9,
           "train_gflops": flops / 1e9, "peak_share": flops / peak, "threads": torch.get_num_threads()}
    print(f"training throughput, recipe config (L=4, h=4, C=128, T=64, B=12), {torch.get_num_threads()} threads, "
          f"{'process CPU' if args.cpu_time else 'wall'} time{', both compiled' if args.compile else ''}")
    print(f"  ours      {tps['ours']:10,.0f} tokens/s")
    print(f"  reference {tps['reference']:10,.0f} tokens/s")
    print(f"  ratio ours / reference = {out['ratio']:.2f}x (best rounds); median of the {args.rounds} "
          f"back-to-back pairs {out['median_pair_ratio']:.2f}x")
    print(f"  matmul peak {out['matmul_peak_gflops']:.1f} GFLOP/s; our step uses {out['train_gflops']:.1f} "
          f"GFLOP/s = {100 * out['peak_share']:.0f}% of it")
    return out


if __name__ == "__main__":
    main()
