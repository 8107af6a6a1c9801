"""A check of the package's speed tricks, one operation at a time: ratios of timings measured in one run.

A machine-specific trick stays in the teaching components only if it is faster under both of PyTorch's CPU kernel
sets; run this under each (``ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2`` and
``ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2``), several times, alternating. A ratio above 1 means
the second operation (the trick) is faster.

* ``exp`` against ``exp2`` on attention-sized scores: base-2 exponentials (e^x = 2^(x log₂e)) were slower under
  both sets, so attention exponentiates with ``exp`` (chapter 1); the row stays as the evidence;
* ``tanh`` against ``sigmoid``, the kernels behind the tanh-GELU and its x σ(2u) form: sigmoid is the faster under
  PyTorch's AVX2 and portable kernels, tanh with AVX-512; the form is kept for its fewer operations (``fast.py``);
* gathering the gradients of Q, K and V split by ``split`` + ``view`` (a reshape copy of each, then a ``cat``)
  against ``view`` + ``unbind`` (one ``cat`` along the new axis): why ``MultiHeadAttention`` uses the latter;
* ``torch.broadcast_shapes`` against the package's small ``_broadcast``.

    python benchmarks/kernels.py [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_out, positive, write_result

from transformer_lab.attention import _broadcast

B, T, C, H = 12, 64, 128, 4  # the recipe's batch: (B·h, T, T) scores, (B, T, 3C) projections


def best_us(fn, *, number: int = 200, repeat: int = 9) -> float:
    """Median over ``repeat`` rounds of the mean CPU time of ``fn()`` in microseconds."""
    for _ in range(20):
        fn()
    rounds = []
    for _ in range(repeat):
        t0 = time.process_time()
        for _ in range(number):
            fn()
        rounds.append((time.process_time() - t0) / number * 1e6)
    return statistics.median(rounds)


def pairs() -> dict[str, tuple]:
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(B * H, T, T, generator=g) - 3  # shifted scores are <= 0 in the softmax
    out = torch.empty_like(scores)
    grads = [torch.randn(B, H, T, C // H, generator=g) for _ in range(3)]  # ∂L/∂Q, ∂L/∂K, ∂L/∂V per head
    shapes = ((B, H, T, T), (T, T))

    def split_view():  # what autograd does for split(C) + view + transpose
        return torch.cat([t.transpose(1, 2).reshape(B, T, C) for t in grads], dim=-1)

    def view_unbind():  # ... and for view(B, T, 3, h, d) + unbind(2) + transpose
        return torch.stack([t.transpose(1, 2) for t in grads], dim=2).view(B, T, 3 * C)

    assert torch.equal(split_view(), view_unbind())
    return {
        "exp / exp2 (48, 64, 64)": (lambda: torch.exp(scores, out=out), lambda: torch.exp2(scores, out=out)),
        "tanh / sigmoid (48, 64, 64)": (lambda: torch.tanh(scores, out=out), lambda: torch.sigmoid(scores, out=out)),
        "gather dQ,dK,dV: split+view / view+unbind": (split_view, view_unbind),
        "torch.broadcast_shapes / _broadcast": (lambda: torch.broadcast_shapes(*shapes), lambda: _broadcast(*shapes)),
    }


def main(argv=None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=positive, default=1)
    add_out(ap, "kernels")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    ratios = {}
    print(f"single operations, {torch.get_num_threads()} thread(s), median CPU time per call")
    for name, (slow, fast) in pairs().items():
        t_slow, t_fast = best_us(slow), best_us(fast)
        ratios[name] = t_slow / t_fast
        print(f"  {name:45s} {t_slow:8.1f} us / {t_fast:7.1f} us = {ratios[name]:5.1f}x")
    first = "tanh / sigmoid (48, 64, 64)"  # the one the capstone's GELU rests on
    write_result(args.out, "kernels", [{"compares": f"{name}: CPU time of the first / the second", "ratio": r}
                                       for name, r in sorted(ratios.items(), key=lambda kv: kv[0] != first)],
                 threads=args.threads)
    return ratios


if __name__ == "__main__":
    main()
