"""The pipeline bubble measured against the formula (p-1)/(m+p-1).

Two ranks (p = 2 stages of DeepSpeed's pipeline engine, gloo) run stages of fixed cost:
each stage sleeps F ms in forward and 2F ms in backward, so compute is known exactly.
For m in {2, 4, 8} micro-batches the step time T is measured; the ideal (no bubble) time
is m * 3F, so the measured bubble is 1 - m * 3F / T.

    python benchmarks/pipeline_bubble.py [--forward-ms 40]
"""
from __future__ import annotations

import argparse
import os
import socket
import time

import torch
import torch.multiprocessing as mp
import torch.nn as nn


class Sleep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        time.sleep(seconds)
        return x * 1.0

    @staticmethod
    def backward(ctx, grad):
        time.sleep(2 * ctx.seconds)
        return grad, None


class FixedCostStage(nn.Module):
    def __init__(self, width: int, seconds: float):
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.seconds = seconds

    def forward(self, x):
        return Sleep.apply(self.proj(x), self.seconds)


def _rank(rank: int, world: int, port: int, forward_s: float, micro_counts, out):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    import deepspeed
    from deepspeed.pipe import LayerSpec, PipelineModule

    from zoo.engine import lean_start

    lean_start.skip_shm_comm_op()  # as zoo's ranks start
    lean_start.skip_muon_import({})
    deepspeed.init_distributed("gloo")
    width = 16
    for m in micro_counts:
        net = PipelineModule([LayerSpec(FixedCostStage, width, forward_s) for _ in range(world)], num_stages=world,
                             loss_fn=lambda out, y: ((out - y) ** 2).mean(), partition_method="uniform")
        ds = {"train_batch_size": m, "train_micro_batch_size_per_gpu": 1, "steps_per_print": 10**9,
              "optimizer": {"type": "SGD", "params": {"lr": 1e-3}}}
        engine, *_ = deepspeed.initialize(model=net, config=ds, model_parameters=net.parameters())
        data = [(torch.randn(1, width), torch.randn(1, width)) for _ in range(m)]
        engine.train_batch(iter(data))  # warm-up
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            engine.train_batch(iter(data))
            times.append(time.perf_counter() - t0)
        if rank == 0:
            out[m] = sorted(times)[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--forward-ms", type=float, default=40.0)
    a = ap.parse_args()
    p, micro_counts, f = 2, (2, 4, 8), a.forward_ms / 1000
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(_rank, args=(p, port, f, micro_counts, out), nprocs=p, join=True)
    print(f"p = {p} stages, forward {a.forward_ms:.0f} ms + backward {2 * a.forward_ms:.0f} ms per micro-batch per stage")
    print(f"{'m':>3} {'step (s)':>9} {'ideal (s)':>9} {'measured bubble':>16} {'(p-1)/(m+p-1)':>14}")
    for m in micro_counts:
        ideal = m * 3 * f
        print(f"{m:>3} {out[m]:>9.3f} {ideal:>9.3f} {1 - ideal / out[m]:>16.3f} {(p - 1) / (m + p - 1):>14.3f}")


if __name__ == "__main__":
    main()
