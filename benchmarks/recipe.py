"""The published CPU recipe, trained end to end: our GPT as the default `train` runs it, and the eager built-in
reference GPT, in the same run.

Recipe: 4 layers, 4 heads, 128 dims, block 64, batch 12, 2000 iterations, lr 1e-3 -> 1e-4 cosine, warm-up 100,
beta2 0.99, dropout 0, weight decay 0.1, gradient clipping 1. Both models start from the same weights and see the
same batches; ours trains with the book's AdamW and cross-entropy, its forward through ``torch.compile`` as the
default `train` does (``--eager`` for the eager step; the compile, or reading its cache, is inside the timed wall
time), the reference eagerly with torch's AdamW and cross-entropy. Reports the val loss over the whole val split
and the wall time of each, and their ratio.

    python benchmarks/recipe.py [--max-iters 2000] [--eager] [--skip-reference]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import default_corpus, recipe_models, stack

from transformer_lab.data import get_batch
from transformer_lab.optim import WarmupCosine
from transformer_lab.train import compile_problem, evaluate_loss, use_compile_cache


def train(model, kind: str, corpus, *, max_iters: int, seed: int = 1337, compile: bool = False
          ) -> tuple[float, float]:
    loss_fn, opt = stack(model, kind)
    schedule = WarmupCosine(1e-3, 1e-4, min(100, max_iters // 10), max_iters)
    g = torch.Generator().manual_seed(seed)
    model.train()
    t0 = time.perf_counter()
    forward = torch.compile(model) if compile else model  # compiled on the first step, inside the timed span
    for step in range(max_iters):
        schedule.apply(opt, step)
        x, y = get_batch(corpus.train, block_size=64, batch_size=12, generator=g)
        loss = loss_fn(forward(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    seconds = time.perf_counter() - t0
    return evaluate_loss(model, corpus.val, block_size=64), seconds


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-iters", type=int, default=2000)
    ap.add_argument("--eager", action="store_true", help="train ours eagerly (--no-compile) instead")
    ap.add_argument("--skip-reference", action="store_true")
    args = ap.parse_args(argv)
    compile = not args.eager
    if compile:
        use_compile_cache()
        problem = compile_problem("cpu")
        if problem:
            print(f"note: ours trains eagerly: {problem}")
            compile = False
    corpus = default_corpus()
    ours, ref = recipe_models(corpus.tokenizer.vocab_size)
    out = {}
    kinds = [("ours", ours)] + ([] if args.skip_reference else [("reference", ref)])
    for kind, model in kinds:
        mode = "compiled" if kind == "ours" and compile else "eager"
        val, secs = train(model, kind, corpus, max_iters=args.max_iters, compile=mode == "compiled")
        out[kind] = {"val_loss": val, "seconds": secs, "mode": mode}
        print(f"  {kind:9s} ({mode:8s}) val loss {val:.4f} nats/char after {args.max_iters} steps, {secs:.0f} s "
              "wall", flush=True)
    if "reference" in out:
        print(f"  time ratio reference / ours = {out['reference']['seconds'] / out['ours']['seconds']:.2f}x; "
              f"val loss ours - reference = {out['ours']['val_loss'] - out['reference']['val_loss']:+.4f}")
    return out


if __name__ == "__main__":
    main()
