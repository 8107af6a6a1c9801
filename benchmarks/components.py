"""Each part of an eager training step, ours against its built-in, at the recipe's shapes, in one run: where the
eager gap of ``train_speed.py`` is.

For each part it times one forward and backward pass (the optimizer: one step) of ours and of the built-in in
alternating rounds (the order reversed every other round), takes the median wall time per call, and multiplies the
difference by the number of calls in one training step of the recipe GPT (9 LayerNorms, 4 attentions, 4 GELUs, one
loss, one update). The sum of those differences is the part of the step gap that the components explain; matrix
products, the same in both models, are left out. Then, the same way, one whole block (ours against the reference's,
the same weights; 4 per step) and the whole model's forward and backward with its loss (no optimizer step), whose
difference is printed beside the sum of the parts' without the update: what the parts add up to once they run
together.

    python benchmarks/components.py [--threads 1 2] [--rounds 9] [--number 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_out, positive, recipe_models, stack, write_result

from transformer_lab.fast import fast_attention, fast_gelu, fast_layer_norm
from transformer_lab.information import cross_entropy

B, T, C, H, V = 12, 64, 128, 4, 65  # the recipe's batch and model; V: the corpus's alphabet


def parts() -> dict[str, tuple]:
    """{name: (calls per training step, ours, built-in)}: each a function running forward and backward once."""
    g = torch.Generator().manual_seed(0)

    def leaf(*shape):
        return torch.randn(*shape, generator=g).requires_grad_()

    x, w, b, gy = leaf(B, T, C), leaf(C), leaf(C), torch.randn(B, T, C, generator=g)
    q, k, v, go = leaf(B, H, T, C // H), leaf(B, H, T, C // H), leaf(B, H, T, C // H), torch.randn(B, H, T, C // H)
    h, gh = leaf(B, T, 4 * C), torch.randn(B, T, 4 * C, generator=g)
    z, y = leaf(B, T, V), torch.randint(0, V, (B, T), generator=g)
    ours_model, ref_model = recipe_models(V, block_size=T)
    for model in (ours_model, ref_model):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=g) * 1e-3
    _, ours_opt = stack(ours_model, "ours")  # flattened, as the trainer's
    _, ref_opt = stack(ref_model, "reference")
    pos = torch.arange(T)
    block_ours, block_ref = ours_model.blocks[0], ref_model.blocks[0]
    idx = torch.randint(0, V, (B, T), generator=g)

    def attention_ours():
        out, _ = fast_attention(q, k, v, is_causal=True)
        out.backward(go)

    def attention_ref():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(go)

    def model_ours():
        cross_entropy(ours_model(idx), y).backward()

    def model_ref():
        F.cross_entropy(ref_model(idx).flatten(0, 1), y.flatten()).backward()

    return {
        "LayerNorm (12, 64, 128)": (9, lambda: fast_layer_norm(x, w, b, 1e-5).backward(gy),
                                    lambda: F.layer_norm(x, (C,), w, b, 1e-5).backward(gy)),
        "causal attention (12, 4, 64, 32)": (4, attention_ours, attention_ref),
        "tanh-GELU (12, 64, 512)": (4, lambda: fast_gelu(h).backward(gh),
                                    lambda: F.gelu(h, approximate="tanh").backward(gh)),
        "cross-entropy (12, 64, 65)": (1, lambda: cross_entropy(z, y).backward(),
                                       lambda: F.cross_entropy(z.flatten(0, 1), y.flatten()).backward()),
        "AdamW step (52 tensors)": (1, ours_opt.step, ref_opt.step),
        "one block (12, 64, 128)": (4, lambda: block_ours(x, positions=pos).backward(gy),
                                    lambda: block_ref(x, None).backward(gy)),
        "the model and its loss, no update": (1, model_ours, model_ref),
    }


WHOLES = ("one block (12, 64, 128)", "the model and its loss, no update")  # not parts: left out of the sum


def mean_us(fn, number: int) -> float:
    """The mean wall time of ``number`` calls of ``fn``, in microseconds."""
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number * 1e6


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=positive, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=positive, default=9)
    ap.add_argument("--number", type=positive, default=50, help="calls per round")
    add_out(ap, "components")
    args = ap.parse_args(argv)
    out = {}
    for threads in args.threads:
        torch.set_num_threads(threads)
        print(f"one forward + backward (the optimizer: one step), {threads} thread(s), median of {args.rounds} "
              f"alternating rounds, wall time per call")
        total = update = model = 0.0
        for name, (calls, ours, ref) in parts().items():
            for fn in (ours, ref):  # warm-up
                for _ in range(10):
                    fn()
            times = {"ours": [], "ref": []}
            number = max(1, args.number // 10) if name == WHOLES[1] else args.number  # the model: ~75 ms a call
            for r in range(args.rounds):
                for kind, fn in (("ours", ours), ("ref", ref))[:: 1 if r % 2 == 0 else -1]:
                    times[kind].append(mean_us(fn, number))
            t_ours, t_ref = statistics.median(times["ours"]), statistics.median(times["ref"])
            per_step = calls * (t_ours - t_ref) / 1000  # ms per training step
            out[(threads, name)] = (t_ours, t_ref)
            if name == WHOLES[0]:
                print(f"  {'the parts above, per training step':34s} {total:+6.2f} ms (ours minus built-in)")
            total += 0.0 if name in WHOLES else per_step
            update = per_step if "AdamW" in name else update
            model = per_step if name == WHOLES[1] else model
            print(f"  {name:34s} ours {t_ours:7.1f} us  built-in {t_ref:7.1f} us  ({t_ours / t_ref:4.2f}x)  "
                  f"x{calls} per step: {per_step:+6.2f} ms")
        print(f"  the model and its loss {model:+.2f} ms per step, its parts without the update "
              f"{total - update:+.2f} ms: {model - (total - update):+.2f} ms not explained by the parts")
    rows = [{"compares": f"{name}: time of ours / the built-in's, {threads} thread(s)", "ratio": t_ours / t_ref}
            for (threads, name), (t_ours, t_ref) in sorted(out.items(), key=lambda kv: kv[0][1] != WHOLES[1])]
    write_result(args.out, "components", rows, rounds=args.rounds, number=args.number)
    return out


if __name__ == "__main__":
    main()
