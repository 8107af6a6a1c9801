"""Data parallelism's price on this machine: a gradient all-reduce against a training step, two gloo processes.

Two processes (``torch.multiprocessing.spawn``, gloo, one thread each) hold the recipe model. In alternating
rounds each times (a) training steps of its own batch with no communication (forward, backward, clip, AdamW) and
(b) all-reduces of one flat float32 buffer the size of the gradient (what DistributedDataParallel sends each step,
in buckets), so a busy machine slows both alike. Prints and writes (``--out``, JSON) the medians and the ratio
all-reduce / step, and the bytes each rank sends in a ring all-reduce, 2 (N - 1) / N times the gradient's bytes.

    python benchmarks/allreduce.py [--rounds 5] [--steps 5] [--out benchmarks/results/allreduce.json]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_out, default_corpus, positive, recipe_models, stack, time_steps, write_result


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, args, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    corpus = default_corpus()
    model, _ = recipe_models(corpus.tokenizer.vocab_size, seed=0)
    loss_of, opt = stack(model, "ours")
    n_params = sum(p.numel() for p in model.parameters())
    buffer = torch.zeros(n_params)  # (P,) float32: the flattened gradient
    g = torch.Generator().manual_seed(rank)
    step_s, reduce_s = [], []
    time_steps(model, loss_of, opt, corpus.train, steps=1, batch_size=args.batch_size, block_size=64, generator=g)
    for _ in range(args.rounds):
        dist.barrier()
        step_s.append(time_steps(model, loss_of, opt, corpus.train, steps=args.steps, batch_size=args.batch_size,
                                 block_size=64, generator=g) / args.steps)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            dist.all_reduce(buffer)
        reduce_s.append((time.perf_counter() - t0) / args.steps)
    times = torch.tensor([statistics.median(step_s), statistics.median(reduce_s)], dtype=torch.float64)
    dist.all_reduce(times)  # the mean over the ranks
    if rank == 0:
        queue.put({"params": n_params, "grad_bytes": 4 * n_params, "world": world, "batch_size": args.batch_size,
                   "block_size": 64, "step_s": float(times[0]) / world, "allreduce_s": float(times[1]) / world,
                   "rounds": args.rounds, "steps": args.steps, "torch": torch.__version__})
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=positive, default=5)
    parser.add_argument("--steps", type=positive, default=5)
    parser.add_argument("--batch-size", type=positive, default=12)
    add_out(parser, "allreduce")
    args = parser.parse_args()
    if args.rounds < 1 or args.steps < 1 or args.batch_size < 1:
        parser.error("--rounds, --steps and --batch-size must be >= 1")
    world = 2
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(world, _free_port(), args, queue), nprocs=world, start_method="spawn")
    r = queue.get()
    ring = 2 * (world - 1) / world * r["grad_bytes"]
    r["ring_bytes_per_rank"] = ring
    r["ratio_allreduce_to_step"] = r["allreduce_s"] / r["step_s"]
    r["bus_bytes_per_s"] = ring / r["allreduce_s"]
    print(f"{r['params']:,} parameters, gradient {r['grad_bytes'] / 2**20:.2f} MiB; {world} gloo processes, "
          f"1 thread each")
    print(f"training step (batch {r['batch_size']} x {r['block_size']}): {1e3 * r['step_s']:.1f} ms; all-reduce "
          f"of the gradient: {1e3 * r['allreduce_s']:.2f} ms; ratio all-reduce / step "
          f"{r['ratio_allreduce_to_step']:.3f}")
    print(f"ring all-reduce sends 2(N-1)/N x {r['grad_bytes'] / 2**20:.2f} MiB = {ring / 2**20:.2f} MiB per rank: "
          f"{r['bus_bytes_per_s'] / 2**30:.2f} GiB/s")
    what = "an all-reduce of the gradient / a training step, 2 gloo processes, 1 thread each"
    write_result(args.out, "allreduce", [{"compares": what, "ratio": r["ratio_allreduce_to_step"]}], **r)


if __name__ == "__main__":
    main()
