"""Where the eager gap is, measured inside the model: our eager GPT with PyTorch's fused kernels swapped in for our
components, one at a time and all at once, against our GPT and the eager built-in reference, in one run.

``components.py`` times each part alone; this script times whole training steps (batch, forward, loss, backward,
clipping, update) of our GPT in which one component's computation is replaced by the built-in's: LayerNorm by
``F.layer_norm``, our tanh-GELU by ``F.gelu``, our causal attention by ``F.scaled_dot_product_attention``, our
cross-entropy by ``F.cross_entropy``, the token lookup by ``F.embedding``, and all five at once. Everything else,
the glue between the components, the weights and our flattened AdamW with its clipping, stays ours. All variants
start from the same weights, train on the same batches and are checked to give our model's loss (to float32
round-off) before timing, which alternates between them in short rounds (the order reversed every other round).
For each thread count it prints the median over rounds of each variant's ratio to the eager reference (the number
we quote) and to our unchanged model: a swap that speeds our model up by r shows that component costing 1 - 1/r of
our step more than its fused kernel, in place. "All five" against the reference is what the rest of our model
costs or saves.

    python benchmarks/swap.py [--threads 1 2] [--steps 10] [--rounds 9] [--cpu-time]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import default_corpus, recipe_models, stack, time_steps

from transformer_lab.data import get_batch

BASE, OURS = "reference", "ours"


def fused_layer_norm(ln, x):
    return F.layer_norm(x, (ln.d_model,), ln.weight, ln.bias, ln.eps)


def fused_gelu(mlp, x, generator=None):
    return mlp.proj(F.gelu(mlp.fc(x), approximate="tanh"))  # the recipe has no dropout


def fused_attention(attn, q, k, v, *, need_weights=False):
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, h, T, d_k)
    B, _, T, _ = out.shape
    return attn.out_proj(out.transpose(1, 2).reshape(B, T, attn.d_model)), None


def fused_embedding(emb, idx):
    return F.embedding(idx, emb.weight)


SWAPS = {  # name: (the modules whose name starts so, the method replaced, its fused stand-in, how many per model)
    "LayerNorm": ("ln", "_forward", fused_layer_norm, 9),
    "GELU": ("mlp", "_forward", fused_gelu, 4),
    "attention": ("attn", "_attend_causal", fused_attention, 4),
    "token lookup": ("tok_emb", "forward", fused_embedding, 1),
}


def swapped(model, names) -> torch.nn.Module:
    """``model`` (the recipe GPT) with the fused stand-ins of ``names`` bound in place of its components' methods."""
    for name in set(names) & set(SWAPS):
        part, method, fused, count = SWAPS[name]
        modules = [m for n, m in model.named_modules() if n.rsplit(".", 1)[-1].startswith(part)]
        if len(modules) != count:
            raise AssertionError(f"{name}: expected {count} modules named {part}*, found {len(modules)}")
        for module in modules:
            setattr(module, method, types.MethodType(fused, module))
    return model


def variants(vocab_size: int, block_size: int) -> dict:
    """{name: (model, loss_of(x, y), optimizer)}, all from the same initial weights."""
    names = [*SWAPS, "loss"]
    plan = {OURS: [], **{f"ours, fused {n}": [n] for n in names}, "ours, all five fused": names, BASE: None}
    out = {}
    for name, swaps in plan.items():
        ours, ref = recipe_models(vocab_size, block_size=block_size)
        if swaps is None:
            out[name] = (ref, *stack(ref, "reference"))
            continue
        model = swapped(ours, swaps)
        loss_of, opt = stack(model, "ours")
        if "loss" in swaps:
            def loss_of(x, y, model=model):
                return F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        out[name] = (model, loss_of, opt)
    return out


def check_same_loss(runs: dict, data, block_size: int) -> None:
    """Every variant computes our model's loss on one batch (float32 round-off apart): the swaps are like for like."""
    x, y = get_batch(data, block_size=block_size, batch_size=12, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = runs[OURS][1](x, y)
        for name, (_, loss_of, _) in runs.items():
            got = loss_of(x, y)
            if not torch.allclose(got, want, rtol=0, atol=1e-5):
                raise AssertionError(f"{name}: loss {got.item():.7f}, ours {want.item():.7f}")


def measure(args, threads: int, corpus, clock) -> dict:
    torch.set_num_threads(threads)
    runs = variants(corpus.tokenizer.vocab_size, args.block_size)
    check_same_loss(runs, corpus.train, args.block_size)
    steps = dict(batch_size=args.batch_size, block_size=args.block_size)
    for model, loss_of, opt in runs.values():  # warm-up
        time_steps(model, loss_of, opt, corpus.train, steps=3, generator=torch.Generator().manual_seed(0), **steps)
    times: dict[str, list[float]] = {k: [] for k in runs}
    for r in range(args.rounds):
        for name in list(runs) if r % 2 == 0 else list(reversed(runs)):
            model, loss_of, opt = runs[name]
            times[name].append(time_steps(model, loss_of, opt, corpus.train, steps=args.steps, clock=clock,
                                          generator=torch.Generator().manual_seed(r), **steps))
    return {"threads": threads, "variants": {name: {
        "ms_per_step": 1e3 * statistics.median(t) / args.steps,
        "ratio": statistics.median(b / o for o, b in zip(t, times[BASE], strict=True)),
        "vs_ours": statistics.median(b / o for o, b in zip(t, times[OURS], strict=True))} for name, t in times.items()}}


def report(out: dict, args) -> None:
    print(f"eager training steps, recipe config (L=4, h=4, C=128, T={args.block_size}, B={args.batch_size}), "
          f"{out['threads']} thread(s), {'process CPU' if args.cpu_time else 'wall'} time, median of {args.rounds} "
          f"alternating rounds of {args.steps} steps")
    for name, v in out["variants"].items():
        print(f"  {name:28s} {v['ms_per_step']:6.1f} ms/step  {v['ratio']:5.3f}x the eager reference  "
              f"{v['vs_ours']:5.3f}x ours")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10, help="training steps per timed round")
    ap.add_argument("--rounds", type=int, default=9, help="alternating rounds per variant")
    ap.add_argument("--batch-size", type=int, default=12)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch thread counts (default 1 2)")
    ap.add_argument("--cpu-time", action="store_true", help="time with process CPU time instead of wall time")
    args = ap.parse_args(argv)
    clock = time.process_time if args.cpu_time else time.perf_counter
    corpus = default_corpus()
    results = []
    for threads in args.threads:
        out = measure(args, threads, corpus, clock)
        report(out, args)
        results.append(out)
    return {"runs": results}


if __name__ == "__main__":
    main()
