"""The published CPU recipe, trained end to end: our GPT as the default `train` runs it, and the eager built-in
reference GPT, in the same run.

Recipe: 4 layers, 4 heads, 128 dims, block 64, batch 12, 2000 iterations, lr 1e-3 -> 1e-4 cosine, warm-up 100,
beta2 0.99, dropout 0, weight decay 0.1, gradient clipping 1. Both models start from the same weights and see the
same batches; ours trains with the book's AdamW and cross-entropy, its forward and loss through ``torch.compile`` as the
default `train` does (``--eager`` for the eager step; the compile, or reading its cache, is inside the timed wall
time), the reference eagerly with torch's AdamW and cross-entropy. The two runs advance in alternating blocks of
``--block`` steps (the order reversed every other block), so a shared machine's changing load slows both alike.
Reports the val loss over the whole val split, the wall time of each (the sum of its blocks; its first step, which
holds the compile, also alone), and their ratio.

    python benchmarks/recipe.py [--max-iters 2000] [--block 100] [--eager] [--skip-reference]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import clip, default_corpus, positive, recipe_models, stack

from transformer_lab.data import get_batch
from transformer_lab.optim import WarmupCosine
from transformer_lab.train import compile_problem, evaluate_loss, use_compile_cache


class Run:
    """One model's training run, advanced ``n`` steps at a time; ``seconds`` sums the wall time of its blocks."""

    def __init__(self, model, kind: str, corpus, *, max_iters: int, seed: int = 1337, compile: bool = False):
        self.model, self.corpus, self.max_iters = model, corpus, max_iters
        self.loss_of, self.opt = stack(model, kind, compile=compile)  # compiled on the first step, in the timing
        self.schedule = WarmupCosine(1e-3, 1e-4, min(100, max_iters // 10), max_iters)
        self.generator = torch.Generator().manual_seed(seed)
        self.step, self.seconds = 0, 0.0
        self.first_step_s = 0.0  # the first step alone: with compile, the compile (or reading its cache)

    def advance(self, n: int) -> None:
        model, opt = self.model, self.opt
        model.train()
        t0 = time.perf_counter()
        for _ in range(min(n, self.max_iters - self.step)):
            self.schedule.apply(opt, self.step)
            x, y = get_batch(self.corpus.train, block_size=64, batch_size=12, generator=self.generator)
            loss = self.loss_of(x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            clip(model, opt)
            opt.step()
            self.step += 1
            if self.step == 1:
                self.first_step_s = time.perf_counter() - t0
        self.seconds += time.perf_counter() - t0


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-iters", type=positive, default=2000)
    ap.add_argument("--block", type=positive, default=100, help="steps per alternating block")
    ap.add_argument("--eager", action="store_true", help="train ours eagerly (--no-compile) instead")
    ap.add_argument("--skip-reference", action="store_true")
    args = ap.parse_args(argv)
    if args.block < 1 or args.max_iters < 1:
        ap.error("--block and --max-iters must be >= 1")
    compile = not args.eager
    if compile:
        use_compile_cache()
        problem = compile_problem("cpu")
        if problem:
            print(f"note: ours trains eagerly: {problem}")
            compile = False
    corpus = default_corpus()
    ours, ref = recipe_models(corpus.tokenizer.vocab_size)
    kinds = [("ours", ours)] + ([] if args.skip_reference else [("reference", ref)])
    runs = {kind: Run(model, kind, corpus, max_iters=args.max_iters, compile=kind == "ours" and compile)
            for kind, model in kinds}
    order = list(runs.values())
    for i in range(-(-args.max_iters // args.block)):  # alternating blocks, the order reversed every other block
        for run in order if i % 2 == 0 else order[::-1]:
            run.advance(args.block)
    out = {}
    for kind, run in runs.items():
        mode = "compiled" if kind == "ours" and compile else "eager"
        val = evaluate_loss(run.model, corpus.val, block_size=64)
        out[kind] = {"val_loss": val, "seconds": run.seconds, "first_step_s": run.first_step_s, "mode": mode}
        print(f"  {kind:9s} ({mode:8s}) val loss {val:.4f} nats/char after {args.max_iters} steps, "
              f"{run.seconds:.1f} s wall (its first step {run.first_step_s:.1f} s)", flush=True)
    if "reference" in out:
        print(f"  time ratio reference / ours = {out['reference']['seconds'] / out['ours']['seconds']:.2f}x; "
              f"val loss ours - reference = {out['ours']['val_loss'] - out['reference']['val_loss']:+.4f}")
    return out


if __name__ == "__main__":
    main()
