"""When compiling the training step pays, for the default ``train``.

``torch.compile`` costs time once, before the first step: a cold start (an empty compile cache) writes and builds
the kernels; a warm start (this configuration's kernels cached) still traces the model and loads them. After that a
step takes t_e / s instead of the eager t_e, for a speed-up s. Over n steps compiling pays when

    n · t_e · (1 − 1/s) > C    ⇔    n > n* = C / (t_e · (1 − 1/s)),

n* the break-even number of steps and C the cold or warm start-up. t_e is measured on this configuration's shapes
(:func:`eager_step_seconds`); C and s are this machine's own measurements for this configuration once a run
recorded them (:func:`remember`, kept beside the compiled kernels), else :data:`PRIOR`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

COSTS_FILE = "transformer_lab-compile-costs.json"


@dataclass(frozen=True)
class Costs:
    """Seconds of a cold and of a warm start-up, and the compiled step's speed-up over the eager one."""
    cold_s: float
    warm_s: float
    speedup: float


# as `train` recorded them for the recipe configuration on the development machine (2 cores, 1 thread, other work
# running): a cold start 31 s, a warm one 8 s (the first step less a later one), a step 62 ms eager and 46 ms
# compiled; rounded towards eager, as a wrong choice to compile costs more than a wrong choice not to
PRIOR = Costs(cold_s=35.0, warm_s=10.0, speedup=1.35)


@dataclass(frozen=True)
class Decision:
    """Whether to compile, and one line saying why."""
    compile: bool
    reason: str


def break_even(start_s: float, eager_step_s: float, speedup: float) -> float:
    """n* = C / (t_e · (1 − 1/s)): the steps after which compiling has paid for its start-up (inf if s ≤ 1)."""
    saved = eager_step_s * (1 - 1 / speedup)
    return math.inf if saved <= 0 else start_s / saved


def decide(steps: int, eager_step_s: float, costs: Costs, *, cached: bool) -> Decision:
    """Compile when the ``steps`` left exceed the break-even for this start-up (warm when ``cached``)."""
    start = costs.warm_s if cached else costs.cold_s
    n = break_even(start, eager_step_s, costs.speedup)
    cache = "its kernels cached" if cached else "an empty compile cache"
    saved = eager_step_s * (1 - 1 / costs.speedup)
    why = (f"{steps:,} steps against a break-even of {_steps(n)} (start-up about {start:.0f} s with {cache}, "
           f"{1e3 * max(saved, 0):.1f} ms saved a step)")
    if steps > n:
        return Decision(True, f"compiling the training step: {why}; --no-compile trains eagerly")
    return Decision(False, f"training eagerly: {why}; --compile compiles anyway")


def _steps(n: float) -> str:
    return "never" if math.isinf(n) else f"{math.ceil(n):,}"


def config_key(**shapes) -> str:
    """A name for what the compiled kernels depend on (model config, batch shape, precision, device, world size,
    torch version): equal keys reuse the same cached kernels."""
    text = json.dumps({**shapes, "torch": torch.__version__}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _read(cache_dir: Path) -> dict:
    try:
        data = json.loads((cache_dir / COSTS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) and value > 0 else None


def costs_for(cache_dir: Path, key: str, eager_step_s: float) -> Costs:
    """This machine's recorded costs for ``key``, each missing one from :data:`PRIOR` (a warm start scaled by the
    recorded cold start, when only that is known); the speed-up is a recorded eager step (else ``eager_step_s``)
    over a recorded compiled one."""
    entry = _read(cache_dir).get(key, {})
    entry = entry if isinstance(entry, dict) else {}
    cold = _number(entry.get("cold_s"))
    warm = _number(entry.get("warm_s")) or (cold and PRIOR.warm_s * cold / PRIOR.cold_s)
    eager = _number(entry.get("eager_step_s")) or eager_step_s
    compiled = _number(entry.get("compiled_step_s"))
    speedup = eager / compiled if compiled else PRIOR.speedup
    return Costs(cold or PRIOR.cold_s, warm or PRIOR.warm_s, speedup)


def is_cached(cache_dir: Path, key: str) -> bool:
    """Whether a compiled run of ``key`` finished here and the compile cache still holds kernels."""
    entry = _read(cache_dir).get(key)
    return isinstance(entry, dict) and bool(entry.get("compiled")) and any((cache_dir / "fxgraph").glob("*"))


def remember(cache_dir: Path, key: str, **measured) -> None:
    """Record ``measured`` (``compiled=True``, ``cold_s``, ``warm_s``, ``eager_step_s``, ``compiled_step_s``) for
    ``key``; written atomically, and a file that cannot be written is skipped (the next run uses the priors)."""
    data = _read(cache_dir)
    entry = data.get(key) if isinstance(data.get(key), dict) else {}
    data[key] = {**entry, **{k: v for k, v in measured.items() if v is not None}}
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=COSTS_FILE, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, cache_dir / COSTS_FILE)
    except OSError:
        if "tmp" in locals():
            Path(tmp).unlink(missing_ok=True)


def eager_step_seconds(loss_of, x: torch.Tensor, y: torch.Tensor) -> float:
    """Seconds of one eager forward and backward of ``loss_of(x, y)`` at the training shapes: the faster of two
    calls after a first one (which allocates). The random generators are left as they were, so the training that
    follows draws the same dropout masks; the gradients left behind are cleared by the next step's ``zero_grad``."""
    cuda = x.device.type == "cuda"
    times = []
    with torch.random.fork_rng(devices=[x.device] if cuda else []):
        for _ in range(3):
            t0 = time.perf_counter()
            loss_of(x, y).backward()
            if cuda:
                torch.cuda.synchronize(x.device)
            times.append(time.perf_counter() - t0)
    return min(times[1:])


def start_up_seconds(step_seconds: list[float]) -> tuple[float, float] | None:
    """From a compiled run's step times: (its start-up, a later step), the start-up being the first step less the
    median of the later ones; None with fewer than three steps."""
    if len(step_seconds) < 3:
        return None
    later = sorted(step_seconds[1:])
    median = later[len(later) // 2]
    return max(step_seconds[0] - median, 0.0), median
