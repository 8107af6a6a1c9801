"""Generation speed: 500 tokens with the key/value cache against recomputing the whole context each step.

Both paths use the same model and the same windowing, so greedy decoding gives the same tokens (checked here);
the ratio of the two wall times, measured in this run, is what we quote.

    python benchmarks/generate_speed.py [--tokens 500] [--checkpoint PATH] [--threads 1,2]

Measured once per torch thread count (default 1 and 2): a cached step is too small to gain from a second thread,
recomputing the whole context is not, so the ratio depends on it and both are printed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_out, positive, write_result

from transformer_lab.cli import load_model


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=positive, default=500)
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--repeat", type=positive, default=3, help="alternating repeats; the best of each is kept")
    ap.add_argument("--threads", default="1,2", help="comma-separated torch thread counts to measure")
    add_out(ap, "generate_speed")
    args = ap.parse_args(argv)
    model, tok, _ = load_model(args.checkpoint)
    prompt = tok.encode("ROMEO:\n").view(1, -1)
    before = torch.get_num_threads()
    try:
        result = {n: _measure(model, prompt, args, n) for n in (int(t) for t in args.threads.split(","))}
    finally:
        torch.set_num_threads(before)
    write_result(args.out, "generate_speed", [
        {"compares": f"{args.tokens} tokens: recomputing the context / the KV cache, wall time, {n} thread(s)",
         "ratio": r["speedup"]} for n, r in result.items()], tokens=args.tokens,
        same_tokens=all(r["same"] for r in result.values()))
    return result


def _measure(model, prompt, args, threads: int) -> dict:
    torch.set_num_threads(threads)
    best = {True: float("inf"), False: float("inf")}
    outs = {}
    for _ in range(args.repeat):
        for use_cache in (True, False):
            t0 = time.perf_counter()
            outs[use_cache] = model.generate(prompt, args.tokens, greedy=True, use_cache=use_cache)
            best[use_cache] = min(best[use_cache], time.perf_counter() - t0)
    same = torch.equal(outs[True], outs[False])
    c = model.config
    out = {"cache_s": best[True], "no_cache_s": best[False], "speedup": best[False] / best[True], "same": same}
    print(f"generation of {args.tokens} tokens, model L={c.n_layer}, C={c.d_model}, context {c.block_size}, "
          f"{torch.get_num_threads()} threads")
    print(f"  with KV cache     {best[True]:.2f} s  ({args.tokens / best[True]:,.0f} tokens/s)")
    print(f"  recomputing       {best[False]:.2f} s  ({args.tokens / best[False]:,.0f} tokens/s)")
    print(f"  speed-up {out['speedup']:.1f}x; greedy tokens identical: {same}")
    return out


if __name__ == "__main__":
    main()
