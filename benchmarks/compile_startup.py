"""Start-up of the default (compiled) `train`: a first run with an empty compile cache against a second run that
reads it, and an eager run (``--no-compile``) for scale, each a fresh process.

Each run is ``python -m transformer_lab train`` on the recipe config for a few steps (``--max-iters``), so its wall
time is start-up (imports, corpus, compiling or reading the cache) plus those steps. The cache directory is a fresh
temporary one (``TORCHINDUCTOR_CACHE_DIR``), so the user's own cache is neither read nor filled.

    python benchmarks/compile_startup.py [--max-iters 4] [--threads 1]
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


def timed_train(flags: list[str], cache: str, out: str, args) -> float:
    """Wall seconds of one `train` process; raises if it fails."""
    argv = [sys.executable, "-m", "transformer_lab", "train", "--out", out, "--force", "--quiet",
            "--max-iters", str(args.max_iters), "--eval-interval", str(args.max_iters), "--eval-iters", "1",
            "--threads", str(args.threads), *flags]
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache},
                          capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"train failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return seconds


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-iters", type=positive, default=4, help="training steps in each run")
    ap.add_argument("--threads", type=positive, default=1)
    add_out(ap, "compile_startup")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        cache, out = str(Path(tmp) / "inductor"), str(Path(tmp) / "m.json")
        first = timed_train([], cache, out, args)
        second = timed_train([], cache, out, args)
        eager = timed_train(["--no-compile"], cache, out, args)
    result = {"first_s": first, "second_s": second, "eager_s": eager, "first_over_second": first / second}
    print(f"`train`, recipe config, {args.max_iters} steps, {args.threads} thread(s), wall time of a fresh process:")
    print(f"  first run (empty compile cache)  {first:6.1f} s")
    print(f"  second run (cache filled)        {second:6.1f} s   first / second = {first / second:.1f}x")
    print(f"  --no-compile                     {eager:6.1f} s   second / eager = {second / eager:.1f}x")
    write_result(args.out, "compile_startup", [
        {"compares": f"`train` for {args.max_iters} steps: first run (empty compile cache) / second run (cache "
                     "filled), wall time", "ratio": first / second},
        {"compares": f"`train` for {args.max_iters} steps: second run (compiled, cache filled) / --no-compile, "
                     "wall time", "ratio": second / eager}], seconds={"first": first, "second": second, "eager": eager})
    return result


if __name__ == "__main__":
    main()
