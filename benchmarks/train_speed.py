"""Training throughput: our GPT eager and compiled (`train` when it compiles) against the built-in reference GPT, eager
and compiled, in one run.

All four start from the same weights and train on the same batches; timing alternates between them in short rounds
(the order reversed every other round), so a busy, shared machine slows them alike. For each thread count it prints
tokens/s (the median of the rounds), each one's ratio to the eager built-in reference (the median of the rounds'
ratios: the number we quote) and the share of the machine's measured float32 matmul peak (FLOP/s) each step uses.
"Compiled" runs the model's forward and its loss through ``torch.compile`` as one function, as
``Trainer(compile=True)`` does (which for ours also compiles the optimizer's flat update and the clipping,
:meth:`~transformer_lab.fast.FastAdamW.flatten_`); its kernels are kept
in :func:`~transformer_lab.train.use_compile_cache`'s directory, and the warm-up that compiles (or reads the cache)
is timed and printed.

    python benchmarks/train_speed.py [--threads 1 2] [--steps 20] [--rounds 7] [--cpu-time] [--eager-only]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    alternate,
    median_ratio,
    per_thread_count,
    recipe_models,
    speed_rows,
    stack,
    step_parser,
    time_steps,
    write_result,
)

from transformer_lab.train import compile_problem, use_compile_cache

BASE = "reference eager"  # every ratio is against the eager built-in reference


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


def variants(vocab_size: int, block_size: int, compiled: bool) -> dict:
    """{name: (the model, loss_of(x, y), optimizer)}: ours and the reference, eager (and compiled)."""
    out = {}
    for mode in ("eager", "compiled") if compiled else ("eager",):
        ours, ref = recipe_models(vocab_size, block_size=block_size)  # the same initial weights for all four
        for kind, model in (("ours", ours), ("reference", ref)):
            out[f"{kind} {mode}"] = (model, *stack(model, kind, compile=mode == "compiled"))
    return out


def measure(args, threads: int, corpus, clock) -> dict:
    torch.set_num_threads(threads)
    torch._dynamo.reset()  # compile afresh for this thread count (inductor's kernels are built for it)
    runs = variants(corpus.tokenizer.vocab_size, args.block_size, not args.eager_only)
    steps = dict(batch_size=args.batch_size, block_size=args.block_size)
    for name, (model, loss_of, opt) in runs.items():  # warm-up (and compilation)
        t0 = time.perf_counter()
        time_steps(model, loss_of, opt, corpus.train, steps=3, generator=torch.Generator().manual_seed(0), **steps)
        if "compiled" in name:
            print(f"  {threads} thread(s): {name}: compiled (or read from the cache) and warmed up in "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)
    times = alternate(runs, corpus.train, rounds=args.rounds, steps=args.steps, clock=clock, **steps)
    tokens = args.steps * args.batch_size * args.block_size
    peak = matmul_peak()
    flops = train_flops_per_token(runs[BASE][0])
    out = {"threads": threads, "matmul_peak_gflops": peak / 1e9, "variants": {}}
    for name, t in times.items():
        tps = tokens / statistics.median(t)
        out["variants"][name] = {
            "tokens_per_s": tps,
            "ratio": median_ratio(t, times[BASE]),  # of the per-round ratios
            "peak_share": flops * tps / peak}
    return out


def report(out: dict, args) -> None:
    print(f"training throughput, recipe config (L=4, h=4, C=128, T={args.block_size}, B={args.batch_size}), "
          f"{out['threads']} thread(s), {'process CPU' if args.cpu_time else 'wall'} time, median of "
          f"{args.rounds} alternating rounds of {args.steps} steps")
    for name, v in out["variants"].items():
        note = "  <- `train` when it compiles" if name == "ours compiled" else ""
        print(f"  {name:19s} {v['tokens_per_s']:9,.0f} tokens/s  {v['ratio']:5.2f}x the eager reference  "
              f"{100 * v['peak_share']:3.0f}% of the {out['matmul_peak_gflops']:.0f} GFLOP/s matmul peak{note}")


def main(argv=None) -> dict:
    ap = step_parser(__doc__, "train_speed", steps=20, rounds=7)
    ap.add_argument("--eager-only", action="store_true", help="leave out the two compiled variants")
    args = ap.parse_args(argv)
    if not args.eager_only:
        use_compile_cache()
        problem = compile_problem("cpu")
        if problem:
            print(f"note: compiled variants left out: {problem}")
            args.eager_only = True
    result = per_thread_count(args, measure, report)
    first = "ours eager" if args.eager_only else "ours compiled"
    write_result(args.out, "train_speed", speed_rows(result, first, BASE), steps=args.steps, rounds=args.rounds)
    return result


if __name__ == "__main__":
    main()
