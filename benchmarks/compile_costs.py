"""What `train`'s compile policy starts from: each way of training, as `train` itself measures it.

For eager training (`--no-compile`), the blocks compiled (`--compile blocks`) and the whole step compiled
(`--compile`): one fresh `train` process on an empty compile cache (cold), then one reading that cache (warm), each
``--steps`` steps. `train` writes what it measured beside the compiled kernels: its median step and, when it
compiled, its start-up (the first step less the median one). Ratios are a compiled step over the eager step (below
1: the compiled step is faster); the start-ups are kept with the result. These are the measurements behind
``transformer_lab.compile_policy.PRIOR``, which a machine uses until it has recorded runs of its own.

    python benchmarks/compile_costs.py [--steps 60] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_out, positive, write_result
from compile_startup import timed_train

from transformer_lab.compile_policy import COSTS_FILE

WAYS = {"eager": ["--no-compile"], "blocks": ["--compile", "blocks"], "whole": ["--compile", "whole"]}


def recorded(cache: Path) -> dict:
    """The one configuration's measurements that `train` wrote into ``cache``."""
    data = json.loads((cache / COSTS_FILE).read_text())
    if len(data) != 1:
        raise SystemExit(f"expected one configuration in {cache / COSTS_FILE}, found {len(data)}")
    return next(iter(data.values()))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=positive, default=60, help="steps of each run (at least 3)")
    ap.add_argument("--threads", type=positive, default=1)
    add_out(ap, "compile_costs")
    args = ap.parse_args(argv)
    if args.steps < 3:
        ap.error("--steps must be at least 3: a start-up is the first step less the median of the later ones")
    seconds = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for way, flags in WAYS.items():
            cache = tmp / way
            cold, _ = timed_train(flags, args.steps, cache, tmp / "m.json", args.threads)
            warm, _ = timed_train(flags, args.steps, cache, tmp / "m.json", args.threads)
            seconds[way] = {"cold_wall": cold, "warm_wall": warm, **recorded(cache)}
    eager = seconds["eager"]["eager_step_s"]
    print(f"`train`, recipe config, {args.threads} thread(s), {args.steps} steps a run; "
          f"eager step {eager * 1e3:.1f} ms")
    rows = []
    for way in ("whole", "blocks"):  # the faster step first: the row that is quoted
        got = seconds[way][way]
        print(f"  {way}: step {got['compiled_step_s'] * 1e3:.1f} ms ({got['compiled_step_s'] / eager:.2f}x eager), "
              f"start-up {got['cold_s']:.1f} s cold, {got['warm_s']:.1f} s warm")
        rows.append({"compares": f"`train` step, {way} compiled / eager, median of a run", "ratio":
                     got["compiled_step_s"] / eager})
    write_result(args.out, "compile_costs", rows, seconds=seconds, steps=args.steps, threads=args.threads)
    return seconds


if __name__ == "__main__":
    main()
