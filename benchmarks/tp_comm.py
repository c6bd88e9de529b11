"""Tensor parallelism: step time at tp=1 and tp=2 on the same machine and batch, and the
measured share of the step spent in tensor-parallel collectives.

Each rank runs forward + backward of the GPT with one thread; the collectives the TP
layers issue (through torch.distributed) are timed by wrapping them.

    python benchmarks/tp_comm.py [--layers 4 --embd 512 --heads 8 --block 256 --batch 8]
"""
from __future__ import annotations

import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from zoo.families.registry import family_of_shape as spec_of
from zoo.worker import leave_process_group

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_single", "reduce_scatter_single", "broadcast")


def _time_collectives(log):
    for name in COLLECTIVES:
        real = getattr(dist, name)

        def timed(*args, _real=real, **kwargs):
            t0 = time.perf_counter()
            try:
                return _real(*args, **kwargs)
            finally:
                log.append(time.perf_counter() - t0)

        setattr(dist, name, timed)


def _rank(rank, world, port, a, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from zoo.models.gpt import gpt_shape
    from zoo.parallel.build import build_model

    shape = gpt_shape("tiny", 4096, n_layer=a.layers, n_head=a.heads, n_embd=a.embd, block_size=a.block)
    group = dist.group.WORLD if world > 1 else None
    model = build_model(spec_of(shape), shape, seed=0, device=torch.device("cpu"), tp_group=group)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 4096, (a.batch, a.block), generator=g)
    log: list = []
    _time_collectives(log)

    def step():
        model(x, x).backward()

    step()
    log.clear()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    total = time.perf_counter() - t0
    if rank == 0:
        out[world] = (total / a.steps, sum(log) / total, len(log) / a.steps)
    leave_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--embd", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--block", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    out = mp.Manager().dict()
    for world in (1, 2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(_rank, args=(world, port, a, out), nprocs=world, join=True)
    print(f"GPT L={a.layers} C={a.embd} H={a.heads} T={a.block}, batch {a.batch}, fwd+bwd, 1 thread per rank, gloo")
    print(f"{'tp':>3} {'step (s)':>9} {'collectives/step':>17} {'share in TP collectives':>24}")
    for tp in (1, 2):
        step, share, count = out[tp]
        print(f"{tp:>3} {step:>9.3f} {count:>17.0f} {share:>24.1%}")
    print(f"speed-up tp=2 over tp=1: {out[1][0] / out[2][0]:.2f}x")


if __name__ == "__main__":
    main()
