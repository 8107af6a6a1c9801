"""The default `train`, cold and warm, against `--no-compile`: wall time of fresh processes, start-up included.

For each run length (``--steps``, default 200 and the recipe's 2,000): `train --no-compile`; the default `train` on
an empty compile cache (cold: its own fresh cache folder); then, after one `train --compile` has filled a cache
(``--fill-steps``), the default `train` reading it (warm). The default decides for itself whether to compile; the
line where it says which is kept with the result. Ratios are default / `--no-compile` (below 1: the default is
faster). Every cache is a temporary folder (``TORCHINDUCTOR_CACHE_DIR``): the user's own cache is neither read nor
filled.

    python benchmarks/compile_startup.py [--steps 200 2000] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_out, positive, write_result

ROOT = Path(__file__).resolve().parent.parent


def timed_train(flags: list[str], steps: int, cache: Path, out: Path, threads: int) -> tuple[float, str]:
    """Wall seconds of one `train` process and the line where it says whether it compiles; raises if it fails."""
    argv = [sys.executable, "-m", "transformer_lab", "train", "--out", str(out), "--force", "--quiet",
            "--max-iters", str(steps), "--threads", str(threads), *flags]
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)},
                          capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"train failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    said = [line for line in done.stderr.splitlines() if line.startswith("note:")]
    return seconds, (said[0][len("note: "):] if said else "forced by the flag")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=positive, nargs="+", default=[200, 2000], help="run lengths to compare")
    ap.add_argument("--fill-steps", type=positive, default=30, help="steps of the `--compile` run that fills the cache")
    ap.add_argument("--threads", type=positive, default=1)
    add_out(ap, "compile_startup")
    args = ap.parse_args(argv)
    rows, seconds, choices = [], {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        warm, out = tmp / "warm", tmp / "m.json"
        seconds["fill"], _ = timed_train(["--compile"], args.fill_steps, warm, out, args.threads)
        print(f"`train`, recipe config, {args.threads} thread(s), wall time of a fresh process "
              f"(filling the cache: {seconds['fill']:.1f} s for {args.fill_steps} compiled steps):")
        for n in args.steps:
            eager, _ = timed_train(["--no-compile"], n, tmp / "unused", out, args.threads)
            cold, cold_says = timed_train([], n, tmp / f"cold-{n}", out, args.threads)
            hot, hot_says = timed_train([], n, warm, out, args.threads)
            seconds[n] = {"no_compile": eager, "cold": cold, "warm": hot}
            choices[n] = {"cold": cold_says, "warm": hot_says}
            print(f"  {n} steps: --no-compile {eager:6.1f} s | default, empty cache {cold:6.1f} s "
                  f"({cold / eager:.2f}x) | default, cache filled {hot:6.1f} s ({hot / eager:.2f}x)")
            print(f"    empty cache: {cold_says}\n    cache filled: {hot_says}")
            rows += [{"compares": f"`train` {n} steps: default on an empty compile cache / --no-compile, wall time",
                      "ratio": cold / eager},
                     {"compares": f"`train` {n} steps: default with the cache filled / --no-compile, wall time",
                      "ratio": hot / eager}]
    rows = [rows[-1], *rows[:-1]]  # the longest run with its kernels cached first: the row that is quoted
    write_result(args.out, "compile_startup", rows, seconds={str(k): v for k, v in seconds.items()},
                 choices={str(k): v for k, v in choices.items()}, threads=args.threads)
    return {"seconds": seconds, "choices": choices}


if __name__ == "__main__":
    main()
