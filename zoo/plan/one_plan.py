"""parallel=auto under an external launcher (torchrun, srun, the deepspeed launcher): one plan
for the whole job. Each rank plans from its own machine before any process group exists (and
validates that plan); once the world's process group is up, every rank reports the memory it
planned with, rank 0 plans again for the smallest device and host memory any rank reported
(where a rank's differs from its own: nodes need not be alike), and broadcasts the plan, which
every rank validates and takes. Rank 0 appends the plan, with the attempt number (torchrun's
restart count), to the run directory's `plans.jsonl` once the first step went through
(zoo.worker.write_run_records)."""
from __future__ import annotations

import os
import socket
from typing import Callable, Tuple

import torch.distributed as dist

from zoo.config.schema import Config
from zoo.run.attempts import current as current_attempt
from zoo.run.errors import ConfigError, ZooError

GB = 2**30


def planning_memory(per_node: int) -> Tuple[float, float]:
    """(one device's bytes, the host's bytes) this rank plans with. Tests: ZOO_TEST_RANK_HOST_GB=R:GB
    makes rank R report a host of GB (and on CPU its devices its share of it)."""
    from zoo.plan.fit import device_memory_bytes

    host = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    device = device_memory_bytes(per_node)
    fake = os.environ.get("ZOO_TEST_RANK_HOST_GB")
    if fake and fake.split(":")[0] == os.environ.get("RANK"):
        host = float(fake.split(":")[1]) * GB
        device = host / max(1, per_node)
    return device, host


def _layout(cfg: Config) -> dict:
    p = cfg.parallel
    return {"tp": p.tp, "cp": p.cp, "pp": p.pp, "dp": p.dp, "zero_stage": p.zero_stage,
            "micro_batch_size": cfg.trainer.micro_batch_size, "activation_checkpointing": cfg.model.activation_checkpointing}


def agree(mine: Config, planned_here: bool, memory: Tuple[float, float],
          replan: Callable[[float, float], Config]) -> Tuple[Config, dict]:
    """(the plan every rank runs: rank 0's, for the smallest memory reported; its record for the
    run's plans.jsonl). `planned_here`: `mine` is this rank's own plan (false: nothing fitted
    its memory, and rank 0's plan for the smallest fails with the line). Collective."""
    rank, world = dist.get_rank(), dist.get_world_size()
    reports = [None] * world
    dist.all_gather_object(reports, {"rank": rank, "host": socket.gethostname(), "device_bytes": memory[0],
                                     "host_bytes": memory[1]})
    box = [None, None, None]
    if rank == 0:
        device = min(reports, key=lambda r: r["device_bytes"])
        host = min(reports, key=lambda r: r["host_bytes"])
        alike = (device["device_bytes"], host["host_bytes"]) == tuple(memory) and planned_here
        try:
            planned = mine if alike else replan(device["device_bytes"], host["host_bytes"])
        except ZooError as err:  # no layout fits the smallest: every rank stops with the line
            box = [None, None, str(err)]
        else:
            record = {"attempt": current_attempt().number, "planned_by_rank": 0,
                      "world_size": world, "device_gb": round(device["device_bytes"] / GB, 3),
                      "device_of": f"rank {device['rank']} on {device['host']}",
                      "host_gb": round(host["host_bytes"] / GB, 3), "host_of": f"rank {host['rank']} on {host['host']}",
                      "ranks_alike": alike, **_layout(planned)}
            box = [planned, record, None]
    dist.broadcast_object_list(box, src=0)
    planned, record, failed = box
    if failed:
        raise ConfigError(failed)
    if rank == 0 and not record["ranks_alike"]:
        print(f"zoo: parallel=auto: the ranks report different memory; one plan for all {world}, made on rank 0 "
              f"for the smallest (a device of {record['device_gb']:.2f} GB: {record['device_of']}; a host of "
              f"{record['host_gb']:.2f} GB: {record['host_of']}): tp={record['tp']} cp={record['cp']} "
              f"pp={record['pp']} dp={record['dp']} zero_stage={record['zero_stage']}, micro-batch "
              f"{record['micro_batch_size']}", flush=True)
    if not record["ranks_alike"]:  # a plan no rank checked before: every rank checks it (alike: the same result)
        import torch

        from zoo.config.validate import resolve_layout, validate

        layout, _ = resolve_layout(planned, world)
        validate(planned, layout, cuda_available=torch.cuda.is_available())
    return planned, record
