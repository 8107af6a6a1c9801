"""When compiling the training step pays, and how much of it to compile, for the default ``train``.

``torch.compile`` costs time once, before the first step: a cold start (an empty compile cache) writes and builds
the kernels; a warm start (this configuration's kernels cached) still traces the model and loads them. After that a
step takes t_e / s instead of the eager t_e, for a speed-up s. Over n steps a compile pays when

    n · t_e · (1 − 1/s) > C    ⇔    n > n* = C / (t_e · (1 − 1/s)),

n* the break-even number of steps and C the cold or warm start-up. Two ways to compile (:data:`MODES`) trade C
against s: ``blocks`` compiles one transformer block's code, shared by all blocks (small C, smaller s); ``whole``
compiles the whole forward with its loss (larger C, larger s). The choice is the one with the least predicted
time over the steps left: n · t_e eagerly, C + n · t_e / s compiled. t_e is measured on this configuration's
shapes (:func:`eager_step_seconds`); C and s are this machine's own measurements for this configuration once a
run recorded them (:func:`remember`, kept beside the compiled kernels), else :data:`PRIOR`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

COSTS_FILE = "transformer_lab-compile-costs.json"
MODES = {"blocks": "compiling the blocks", "whole": "compiling the whole training step"}


@dataclass(frozen=True)
class Costs:
    """Seconds of a cold and of a warm start-up, and the compiled step's speed-up over the eager one."""
    cold_s: float
    warm_s: float
    speedup: float


# `bench compile_costs` (benchmarks/results/compile_costs.json): the recipe configuration on the development
# machine (2 cores, 1 thread), as `train` recorded them: eager 44.8 ms a step; the blocks 20.4 s cold, 3.5 s warm,
# 0.87 times the eager step; the whole step 31.2 s cold, 7.2 s warm, 0.71 times; rounded towards eager, as a wrong
# choice to compile costs more than a wrong choice not to
PRIOR = {"blocks": Costs(cold_s=21.0, warm_s=4.0, speedup=1.14),
         "whole": Costs(cold_s=32.0, warm_s=8.0, speedup=1.38)}


@dataclass(frozen=True)
class Decision:
    """How to compile (a key of :data:`MODES`, or None: eagerly), and one line saying why."""
    mode: str | None
    reason: str


def break_even(start_s: float, eager_step_s: float, speedup: float) -> float:
    """n* = C / (t_e · (1 − 1/s)): the steps after which compiling has paid for its start-up (inf if s ≤ 1)."""
    saved = eager_step_s * (1 - 1 / speedup)
    return math.inf if saved <= 0 else start_s / saved


def decide(steps: int, eager_step_s: float, costs: dict[str, Costs], *, cached: dict[str, bool]) -> Decision:
    """The way of training with the least predicted time over ``steps``: eagerly, or a mode of :data:`MODES` at
    its warm start-up where ``cached`` says its kernels are cached, else its cold one."""
    starts = {m: (c.warm_s if cached.get(m) else c.cold_s) for m, c in costs.items()}
    saved = {m: steps * eager_step_s * (1 - 1 / c.speedup) - starts[m] for m, c in costs.items()}
    evens = {m: break_even(starts[m], eager_step_s, c.speedup) for m, c in costs.items()}

    def why(m: str) -> str:
        cache = "its kernels cached" if cached.get(m) else "an empty compile cache"
        even = "never breaks even" if math.isinf(evens[m]) else f"break-even {math.ceil(evens[m]):,} steps"
        return f"{even}, start-up about {starts[m]:.0f} s with {cache}"

    best = max(saved, key=saved.get)
    if saved[best] <= 0:
        return Decision(None, f"training eagerly: {steps:,} steps would not repay a compile ("
                              + "; ".join(f"{MODES[m].removeprefix('compiling ')}: {why(m)}" for m in costs)
                              + "); --compile compiles anyway")
    return Decision(best, f"{MODES[best]}: {steps:,} steps, {why(best)}, about {saved[best]:.0f} s saved "
                          "in all; --no-compile trains eagerly")


def config_key(**shapes) -> str:
    """A name for what the compiled kernels depend on (model config, batch shape, precision, device, world size,
    threads, torch version): equal keys reuse the same cached kernels."""
    text = json.dumps({**shapes, "torch": torch.__version__}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _read(cache_dir: Path) -> dict:
    try:
        data = json.loads((cache_dir / COSTS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _entry(data: dict, *path: str) -> dict:
    for name in path:
        data = data.get(name) if isinstance(data, dict) else None
    return data if isinstance(data, dict) else {}


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) and value > 0 else None


def writes_vector_code(device: torch.device | str = "cpu") -> bool:
    """Whether the compiler writes vector instructions for ``device``. On a CPU, inductor follows PyTorch's kernel
    set: scalar loops on the portable set (``ATEN_CPU_CAPABILITY=default``, or an x86 CPU without AVX2), where a
    compiled step can be slower than an eager one; vector code otherwise. Always on other devices. Read from the
    kernel set, not from inductor's own check, which builds and loads test libraries (seconds, at every run)."""
    if torch.device(device).type != "cpu":
        return True
    if os.environ.get("ATEN_CPU_CAPABILITY", "").lower() == "default":
        return False
    return platform.machine() not in ("x86_64", "AMD64") or torch.backends.cpu.get_cpu_capability() != "DEFAULT"


def costs_for(cache_dir: Path, key: str, eager_step_s: float, *, vector_code: bool = True) -> dict[str, Costs]:
    """Each mode's costs for ``key`` as recorded here, each missing one from :data:`PRIOR` (a warm start scaled by
    the recorded cold start, when only that is known); the speed-up is a recorded eager step (else
    ``eager_step_s``) over a recorded compiled one. Without ``vector_code`` (:func:`writes_vector_code`) the
    priors assume no speed-up, so that only a recorded run can make a compile pay."""
    record = _entry(_read(cache_dir), key)
    eager = _number(record.get("eager_step_s")) or eager_step_s
    out = {}
    for mode, prior in PRIOR.items():
        prior = prior if vector_code else Costs(prior.cold_s, prior.warm_s, 1.0)
        entry = _entry(record, mode)
        cold = _number(entry.get("cold_s"))
        warm = _number(entry.get("warm_s")) or (cold and prior.warm_s * cold / prior.cold_s)
        compiled = _number(entry.get("compiled_step_s"))
        out[mode] = Costs(cold or prior.cold_s, warm or prior.warm_s, eager / compiled if compiled else prior.speedup)
    return out


def is_cached(cache_dir: Path, key: str) -> dict[str, bool]:
    """For each mode, whether a compiled run of ``key`` finished here and the compile cache still holds kernels."""
    kernels = any((cache_dir / "fxgraph").glob("*"))
    record = _entry(_read(cache_dir), key)
    return {mode: kernels and _entry(record, mode).get("compiled") is True for mode in MODES}


def remember(cache_dir: Path, key: str, mode: str | None = None, **measured) -> None:
    """Record ``measured`` for ``key``: ``eager_step_s`` (``mode`` None), or for a compile ``mode``
    ``compiled=True``, ``cold_s``, ``warm_s``, ``compiled_step_s``; None values are left out. Written atomically;
    a file that cannot be written is skipped (the next run uses the priors)."""
    data = _read(cache_dir)
    record = _entry(data, key)
    new = {k: v for k, v in measured.items() if v is not None}
    data[key] = {**record, **new} if mode is None else {**record, mode: {**_entry(record, mode), **new}}
    tmp = None
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=COSTS_FILE, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, cache_dir / COSTS_FILE)
    except OSError:
        if tmp is not None:
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
    """From a run's step times: (its start-up, a later step), the start-up being the first step less the median
    of the later ones; None with fewer than three steps."""
    if len(step_seconds) < 3:
        return None
    later = sorted(step_seconds[1:])
    median = later[len(later) // 2]
    return max(step_seconds[0] - median, 0.0), median
