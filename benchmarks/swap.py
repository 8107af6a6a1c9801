"""Where the eager gap is, measured inside the model: our eager GPT with PyTorch's built-in kernels swapped in for
our components, one at a time and all at once, against our GPT and the eager built-in reference, in one run.

``components.py`` times each part alone; this script times whole training steps (batch, forward, loss, backward,
clipping, update) of our GPT in which one component's computation is replaced by the built-in's: LayerNorm by
``F.layer_norm``, our GELU (tanh in the recipe) by ``F.gelu``, our causal attention by
``F.scaled_dot_product_attention``, our
cross-entropy by ``F.cross_entropy`` and the token lookup by ``F.embedding``, then all five at once. The last two
also drop the checks ours make on every call (the token ids' range; the targets' range and ``ignore_index``).
Everything else, the glue between the components, our flattened AdamW and the clipping, stays ours.

All variants start from the same weights and train on the same batches. Before timing, each is checked like for
like on perturbed weights: its loss and every parameter's gradient must equal our model's (float32 round-off
apart). Timing alternates between them in short rounds (the order reversed every other round). For each thread
count it prints each variant's median, over rounds, of its speed relative to the eager reference (the number we
quote) and to our unchanged model. A swap's effect of a few per cent either way is within this machine's
round-to-round noise; "all five" against the reference is what the rest of our model costs or saves.

    python benchmarks/swap.py [--threads 1 2] [--steps 10] [--rounds 9] [--cpu-time]
"""

from __future__ import annotations

import copy
import statistics
import sys
import types
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    alternate,
    builtin_loss,
    median_ratio,
    per_thread_count,
    recipe_models,
    speed_rows,
    stack,
    step_parser,
    time_steps,
    write_result,
)

from transformer_lab.data import get_batch

BASE, OURS, ALL = "reference", "ours", "ours with PyTorch's five kernels"


def fused_layer_norm(ln, x):
    """``FastLayerNorm._forward`` by ``F.layer_norm``: x (..., C) -> (x - mean) / sqrt(var + eps) * weight + bias."""
    return F.layer_norm(x, (ln.d_model,), ln.weight, ln.bias, ln.eps)


def fused_gelu(mlp, x, generator=None):
    """``FastMLP._forward`` with ``F.gelu``: x (..., C) -> proj(GELU(fc(x))), the MLP's own GELU approximation."""
    if mlp.training and mlp.p > 0:
        raise RuntimeError("swap: the GELU stand-in has no dropout; the recipe has none")
    return mlp.proj(F.gelu(mlp.fc(x), approximate=mlp.approximate))


def fused_attention(attn, q, k, v, *, need_weights=False):
    """``FastMultiHeadAttention._attend_causal`` in training (T_q = T_k) by ``F.scaled_dot_product_attention``:
    q, k, v (B, h, T, d_k) -> concat(heads) W_Oᵀ + b_O (B, T, C), with no weights returned."""
    if need_weights or (attn.training and attn.dropout > 0) or q.shape[-2] != k.shape[-2]:
        raise RuntimeError("swap: the attention stand-in returns no weights, has no dropout and no cache "
                           "(its causal mask is aligned for T_q = T_k)")
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, h, T, d_k)
    B, _, T, _ = out.shape
    return attn.out_proj(out.transpose(1, 2).reshape(B, T, attn.d_model)), None


def fused_embedding(emb, idx):
    """``Embedding.forward`` by ``F.embedding``: idx (B, T) -> E[idx] (B, T, C), without the range check."""
    return F.embedding(idx, emb.weight)


SWAPS = {  # name: (the modules whose name starts so, the method replaced, its fused stand-in, how many per model)
    "LayerNorm": ("ln", "_forward", fused_layer_norm, 9),
    "GELU": ("mlp", "_forward", fused_gelu, 4),
    "attention": ("attn", "_attend_causal", fused_attention, 4),
    "token lookup": ("tok_emb", "forward", fused_embedding, 1),
}
LOSS = "loss"  # swapped in the loss function, not in the model


def swapped(model, names) -> torch.nn.Module:
    """``model`` (the recipe GPT) with the fused stand-ins of ``names`` bound in place of its components' methods."""
    for name in names:
        if name == LOSS:
            continue
        if name not in SWAPS:
            raise ValueError(f"swap: unknown component {name!r}; known: {', '.join([*SWAPS, LOSS])}")
        part, method, fused, count = SWAPS[name]
        modules = [m for n, m in model.named_modules() if n.rsplit(".", 1)[-1].startswith(part)]
        if len(modules) != count:
            raise ValueError(f"swap: {name}: expected {count} modules named {part}*, found {len(modules)}")
        for module in modules:
            setattr(module, method, types.MethodType(fused, module))
    return model


def variants(vocab_size: int, block_size: int) -> dict:
    """{name: (model, loss_of(x, y), optimizer)}, all from the same initial weights."""
    names = [*SWAPS, LOSS]
    plan = {OURS: [], **{f"ours with PyTorch's {n}": [n] for n in names}, ALL: names}
    ours, ref = recipe_models(vocab_size, block_size=block_size)
    out = {}
    for name, swaps in plan.items():
        model = swapped(copy.deepcopy(ours), swaps)
        loss_of, opt = stack(model, "ours")
        out[name] = (model, builtin_loss(model) if LOSS in swaps else loss_of, opt)
    out[BASE] = (ref, *stack(ref, "reference"))
    return out


def check_like_for_like(runs: dict, data, block_size: int, seed: int = 0) -> None:
    """Every variant's loss and gradients equal our model's on one batch, at weights perturbed away from their
    initial values (LayerNorm's weight 1 and bias 0 would hide a missing affine map), else RuntimeError."""
    g = torch.Generator().manual_seed(seed)
    initial = copy.deepcopy(runs[OURS][0].state_dict())
    perturbed = {k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in initial.items()}
    x, y = get_batch(data, block_size=block_size, batch_size=12, generator=g)
    results = {}
    for name, (model, loss_of, opt) in runs.items():
        model.load_state_dict(perturbed)  # copies into the parameters: our optimizer's flat views stay
        opt.zero_grad(set_to_none=True)  # ours: zeros in its flat gradient buffer
        loss = loss_of(x, y)
        loss.backward()
        results[name] = (loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
        model.load_state_dict(initial)
        opt.zero_grad(set_to_none=True)
    want_loss, want_grads = results[OURS]
    for name, (loss, grads) in results.items():
        if not torch.allclose(loss, want_loss, rtol=1e-5, atol=1e-5):
            raise RuntimeError(f"swap: {name}: loss {loss.item():.7f}, ours {want_loss.item():.7f}")
        for n, grad in grads.items():
            err = ((grad - want_grads[n]).abs().max() / want_grads[n].abs().max()).item()  # relative to its scale
            if not err <= 3e-4:
                raise RuntimeError(f"swap: {name}: the gradient of {n} differs from ours by {err:.1e} of its "
                                   f"largest entry (allowed: 3e-4)")


def measure(args, threads: int, corpus, clock) -> dict:
    torch.set_num_threads(threads)
    runs = variants(corpus.tokenizer.vocab_size, args.block_size)
    check_like_for_like(runs, corpus.train, args.block_size)
    steps = dict(batch_size=args.batch_size, block_size=args.block_size)
    for run in runs.values():  # warm-up
        time_steps(*run, corpus.train, steps=3, generator=torch.Generator().manual_seed(0), **steps)
    times = alternate(runs, corpus.train, rounds=args.rounds, steps=args.steps, clock=clock, **steps)
    return {"threads": threads, "variants": {name: {
        "ms_per_step": 1e3 * statistics.median(t) / args.steps,
        "ratio": median_ratio(t, times[BASE]),
        "vs_ours": median_ratio(t, times[OURS])} for name, t in times.items()}}


def report(out: dict, args) -> None:
    print(f"eager training steps, recipe config (L=4, h=4, C=128, T={args.block_size}, B={args.batch_size}), "
          f"{out['threads']} thread(s), {'process CPU' if args.cpu_time else 'wall'} time, median of {args.rounds} "
          f"alternating rounds of {args.steps} steps")
    for name, v in out["variants"].items():
        print(f"  {name:28s} {v['ms_per_step']:6.1f} ms/step  {v['ratio']:4.2f}x the eager reference  "
              f"{v['vs_ours']:4.2f}x ours")


def main(argv=None) -> dict:
    args = step_parser(__doc__, "swap", steps=10, rounds=9).parse_args(argv)
    result = per_thread_count(args, measure, report)
    write_result(args.out, "swap", speed_rows(result, ALL, BASE), steps=args.steps, rounds=args.rounds)
    return result


if __name__ == "__main__":
    main()
