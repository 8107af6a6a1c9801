"""Devices and data parallelism (chapter 8, "Beyond one machine"): PyTorch's own machinery, set up for the trainer.

``torchrun --nproc_per_node N -m transformer_lab train ...`` starts N copies of the trainer and gives each one
``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` in its environment (and ``MASTER_ADDR``/``MASTER_PORT`` for the
rendezvous). :func:`world_from_env` reads them; :func:`init` joins the process group (gloo on CPUs, NCCL on CUDA
GPUs); the trainer wraps the model in ``DistributedDataParallel``, which averages the gradients of the N ranks
with an all-reduce during ``backward``:  g = (1/N) Σ_r g_r, the gradient of the mean loss over the global batch.

Batches: every rank draws the *global* batch (N · K · B windows, K micro-batches of B per rank) from one stream
seeded by the run's seed, and keeps its own rows (:func:`rank_rows`). So a run on N processes, a run on one
process with ``--grad-accum N``, and a run on one process with an N-times larger batch see the same windows in
the same order, and their loss curves agree to round-off. Dropout, which needs different masks on each rank,
draws from the global RNG seeded with seed + rank. Only rank 0 writes checkpoints and progress.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

DEVICES = ("auto", "cpu", "cuda", "mps")
PRECISIONS = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class World:
    """Where this process sits in a data-parallel job: rank r of ``size`` processes (``size`` = 1: no job)."""

    rank: int = 0  # this process's index, 0 … size - 1
    size: int = 1  # processes in the job (N)
    local_rank: int = 0  # index on this machine: picks the GPU

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes checkpoints and progress."""
        return self.rank == 0


def world_from_env(env=os.environ) -> World:
    """The :class:`World` torchrun describes in the environment; ``World()`` when not started by torchrun."""
    if "WORLD_SIZE" not in env:
        return World()
    try:
        world = World(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", env["RANK"])))
    except (KeyError, ValueError) as exc:
        raise ValueError(f"torchrun's RANK / WORLD_SIZE / LOCAL_RANK environment is incomplete or not integers "
                         f"({exc}); start the job with torchrun") from exc
    if not 0 <= world.rank < world.size:
        raise ValueError(f"RANK={world.rank} must lie in [0, WORLD_SIZE={world.size})")
    return world


def pick_device(name: str = "auto", world: World = World()) -> torch.device:
    """``auto``: CUDA if available, else Apple's MPS, else the CPU. ``cuda`` picks GPU ``LOCAL_RANK``.

    Raises ValueError naming what this machine has when the device asked for is missing."""
    if name not in DEVICES:
        raise ValueError(f"--device must be one of {', '.join(DEVICES)}, got {name!r}")
    has_mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if has_mps and world.size == 1 else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("--device cuda: this PyTorch sees no CUDA GPU (a CPU-only build, or no driver); "
                             "use --device cpu or auto")
        if world.local_rank >= torch.cuda.device_count():
            raise ValueError(f"LOCAL_RANK {world.local_rank} has no GPU: this machine has "
                             f"{torch.cuda.device_count()}; use --nproc_per_node <= the number of GPUs")
        return torch.device("cuda", world.local_rank)
    if name == "mps" and not has_mps:
        raise ValueError("--device mps: Apple's Metal backend is not available here; use --device cpu or auto")
    if name == "mps" and world.size > 1:
        raise ValueError("--device mps runs one process (PyTorch has no MPS backend for torch.distributed)")
    return torch.device(name)


def check_precision(name: str, device: torch.device) -> torch.dtype:
    """The autocast dtype for ``--dtype name`` on ``device``; ValueError when the device cannot compute in it."""
    if name not in PRECISIONS:
        raise ValueError(f"--dtype must be one of {', '.join(PRECISIONS)}, got {name!r}")
    dtype = PRECISIONS[name]
    if dtype != torch.float32:
        if not torch.amp.is_autocast_available(device.type):
            raise ValueError(f"--dtype {name}: torch.autocast does not support the {device.type} device here")
        if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
            raise ValueError("--dtype bfloat16: this GPU has no bfloat16 arithmetic; use --dtype float16")
    return dtype


def init(world: World, device: torch.device, *, timeout_s: float = 120.0) -> None:
    """Join torchrun's process group: NCCL for CUDA, gloo otherwise. A collective that waits longer than
    ``timeout_s`` for a lost rank raises instead of hanging."""
    if world.size == 1 or dist.is_initialized():
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=world.rank, world_size=world.size,
                            timeout=datetime.timedelta(seconds=timeout_s))


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def rank_rows(world: World, per_rank: int) -> slice:
    """This rank's rows of a global batch of ``world.size * per_rank`` rows: rank r holds r·per_rank … ."""
    return slice(world.rank * per_rank, (world.rank + 1) * per_rank)


def mean_over_ranks(value: torch.Tensor, world: World) -> float:
    """(1/N) Σ_r value_r, the same float on every rank (an all-reduce of one number; gloo has no AVG, so SUM / N)."""
    if world.size == 1:
        return float(value)
    total = value.detach().double().reshape(1).clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return float(total) / world.size


def gather_objects(obj, world: World) -> list:
    """[obj of rank 0, …, obj of rank N-1] on every rank (``all_gather_object``); [obj] for one process."""
    if world.size == 1:
        return [obj]
    out = [None] * world.size
    dist.all_gather_object(out, obj)
    return out


def agree(ok: bool, world: World) -> bool:
    """True on every rank when ``ok`` is true on every rank (so that all ranks stop together on a local failure)."""
    if world.size == 1:
        return ok
    flag = torch.tensor([int(ok)])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())
