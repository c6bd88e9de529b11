"""Run a test body on several gloo ranks of one machine.

`run_ranks(world_size, fn, *args)` spawns `world_size` processes, each with a gloo process
group on 127.0.0.1 and a free port, one CPU thread, and calls `fn(rank, world_size, *args)`.
`fn` must be importable (a module-level function). An exception on any rank stops all of
them and fails the calling test with that rank's traceback.
"""
from __future__ import annotations

import os
import socket
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from zoo.worker import leave_process_group

TIMEOUT = timedelta(seconds=60)  # a rank stuck in a collective fails instead of hanging


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, fn, args) -> None:
    os.environ.update(OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=TIMEOUT)
    try:
        fn(rank, world_size, *args)
    finally:
        leave_process_group()


def run_ranks(world_size: int, fn, *args) -> None:
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the children before they import torch
    try:
        mp.spawn(_worker, args=(world_size, _free_port(), fn, args), nprocs=world_size, join=True)
    except mp.ProcessRaisedException as e:  # its message carries the rank's traceback
        pytest.fail(f"a rank of {world_size} failed:\n{e}", pytrace=False)
    except mp.ProcessExitedException as e:
        pytest.fail(f"a rank of {world_size} died: {e}", pytrace=False)
    finally:
        if saved is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = saved
