"""How this process was started, and the local launcher.

Four ways in: plain `python -m zoo.train` (we start the layout's worker processes with
torch's elastic launcher), torchrun, the deepspeed launcher (both set RANK/WORLD_SIZE/
LOCAL_RANK/MASTER_*), and srun (ranks from SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID, the
master address from the allocation's first host, the port derived from the job id).
"""
from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class LaunchEnv:
    kind: str  # local | torchrun | deepspeed | slurm
    world_size: Optional[int]  # None for a local launch (the layout decides)


def slurm_master_addr(nodelist: str) -> str:
    """The first host of a Slurm node list (`node[01-04],gpu7` -> node01)."""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             check=True, timeout=30).stdout.split()
        if out:
            return out[0]
    except (OSError, subprocess.SubprocessError):
        pass
    head = nodelist.split(",")[0]
    if "[" in head:
        prefix, rng = head.split("[", 1)
        return prefix + rng.rstrip("]").split(",")[0].split("-")[0]
    return head


def slurm_master_port(job_id: str) -> int:
    """A port in [20000, 30000) derived from the job id, so every task computes the same one."""
    return 20000 + int(job_id) % 10000


def detect() -> LaunchEnv:
    env = os.environ
    if env.get("ZOO_LOCAL_WORKER"):
        return LaunchEnv("local-worker", int(env["WORLD_SIZE"]))
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env and int(env.get("SLURM_NTASKS", "1")) > 1 \
            and "RANK" not in env:
        job = env.get("SLURM_JOB_ID", "0")
        env.setdefault("MASTER_ADDR", slurm_master_addr(env.get("SLURM_JOB_NODELIST", socket.gethostname())))
        env.setdefault("MASTER_PORT", str(slurm_master_port(job)))
        env["RANK"], env["WORLD_SIZE"] = env["SLURM_PROCID"], env["SLURM_NTASKS"]
        env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
        return LaunchEnv("slurm", int(env["SLURM_NTASKS"]))
    if "RANK" in env and "WORLD_SIZE" in env:
        kind = "torchrun" if "TORCHELASTIC_RUN_ID" in env else "deepspeed"
        return LaunchEnv(kind, int(env["WORLD_SIZE"]))
    return LaunchEnv("local", None)


def ranks_per_node(env=None) -> Optional[int]:
    """Ranks on each host as the launcher placed them: torchrun's LOCAL_WORLD_SIZE (its
    --nproc-per-node), Slurm's SLURM_TASKS_PER_NODE (`4(x2)` or `4,2`: the smallest), the
    deepspeed launcher's LOCAL_SIZE; None where the launcher does not say (a local run: one host)."""
    env = os.environ if env is None else env
    for key in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE"):
        if env.get(key, "").isdigit():
            return int(env[key])
    per_node = env.get("SLURM_TASKS_PER_NODE") or env.get("SLURM_NTASKS_PER_NODE")
    if per_node:
        import re

        counts = [int(n) for n in re.findall(r"(\d+)(?:\(x\d+\))?", per_node)]
        return min(counts) if counts else None
    return None


def tp_placement_warning(tp: int, per_node: Optional[int]) -> Optional[str]:
    """A warning when tensor-parallel groups (tp adjacent ranks) cannot all sit inside a host."""
    if per_node is None or tp == 1:
        return None
    if tp > per_node:
        return (f"parallel.tp={tp} is more than the {per_node} ranks per node the launcher placed: every "
                f"tensor-parallel group spans hosts and its all-reduces cross the network; keep tp <= {per_node} "
                f"(tensor parallel inside a node, pipeline across nodes)")
    if per_node % tp:
        return (f"parallel.tp={tp} does not divide the {per_node} ranks per node: some tensor-parallel groups "
                f"span two hosts; use a tp that divides {per_node}")
    return None


def threads_per_rank(nproc: int) -> int:
    return max(1, (os.cpu_count() or 1) // nproc)


def launch_local(nproc: int, cfg, run_dir: str, timeout_s: int, verbose: bool = False,
                 dynamo: bool = False, attempt: int = 0) -> None:
    """Start `nproc` workers of `zoo.worker.main` with torch's elastic launcher on this host
(started as `worker_start_method` says).

    Raises `ChildFailedError` (which names the failing rank first) when a worker fails;
    the agent then stops the others, so no process is left behind.
    """
    import logging

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from zoo.worker import main as worker_main

    # The agent logs every failed worker's traceback; zoo.train reports the first failure
    # itself, in one place, so the agent is kept quiet.
    # Its modules' loggers carry their own level (torch sets LOGLEVEL's, WARNING, on each), so
    # each is set: "Received 2 death signal" and "Terminating process ... via signal SIGTERM"
    # after a Ctrl-C are not a user's business either (verbose=true shows them).
    for name in ["torch.distributed.elastic", "torch.multiprocessing.spawn", *logging.root.manager.loggerDict]:
        if name.startswith(("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing")):
            logging.getLogger(name).setLevel(logging.WARNING if verbose else logging.CRITICAL)
    threads = threads_per_rank(nproc)
    os.environ["ZOO_LOCAL_WORKER"] = "1"
    os.environ["OMP_NUM_THREADS"] = str(threads)
    from zoo.run.quiet import VERBOSE_ENV

    os.environ[VERBOSE_ENV] = "1" if verbose else "0"
    start_method = worker_start_method()
    if start_method == "fork":
        start_method = _fork_or_forkserver(dynamo)
    if start_method != "fork":  # a new interpreter: it starts on the malloc LD_PRELOAD names
        _preload_allocator(cfg.run.cpu_allocator)
    if start_method == "forkserver":
        import multiprocessing

        multiprocessing.set_forkserver_preload(list(preload(dynamo)))
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"zoo-{uuid.uuid4().hex[:8]}",
                          rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", max_restarts=0,
                          monitor_interval=0.1, start_method=start_method, rdzv_configs={"timeout": timeout_s})
    elastic_launch(config, worker_main)(cfg, run_dir, threads, None, (attempt, time.time()))


def _preload_allocator(choice: str) -> None:
    """CPU ranks get run.cpu_allocator's malloc (zoo.run.allocator); a note where auto found none."""
    import sys

    import torch

    from zoo.run.allocator import PACKAGES, preload_for_ranks

    if preload_for_ranks(choice, torch.cuda.is_available()) == "glibc" and choice == "auto":
        print(f"zoo: note: the ranks run on glibc's malloc (no tcmalloc or jemalloc here), which keeps much of what a "
              f"step frees (TinyLlama-1.1B, 4 ranks: 5.5 GB a rank against 4.2 with tcmalloc); the plan counts it. "
              f"Install {PACKAGES['tcmalloc']} for less memory", file=sys.stderr, flush=True)


START_METHOD_ENV = "ZOO_START_METHOD"


PRELOAD = ("zoo.run.quiet", "deepspeed", "deepspeed.runtime.engine", "deepspeed.runtime.pipe.engine", "transformers",
           "transformers.models.auto.tokenization_auto", "zoo.trainer", "zoo.families.registry", "zoo.worker")
DYNAMO = ("torch._dynamo",)  # imported by compile and by ZeRO-3's parameter hooks; an eager optimizer does not


def preload(dynamo: bool) -> tuple:
    """What the forkserver (or this process, for fork) imports before the ranks start: with
    torch._dynamo where every rank will import it anyway (once in the server, not per rank)."""
    return PRELOAD + DYNAMO if dynamo else PRELOAD


def worker_start_method() -> str:
    """How the local launcher starts its ranks: `forkserver` where no GPU is visible (one
    clean server process imports what every rank needs once, PRELOAD, and forks each rank
    from it: on 2 cores a rank's own imports took ~8 s of CPU), `spawn` on CUDA machines.
    ZOO_START_METHOD=spawn|forkserver|fork overrides (fork: see `_fork_or_forkserver`)."""
    import torch

    chosen = os.environ.get(START_METHOD_ENV)
    if chosen:
        if chosen not in ("spawn", "forkserver", "fork"):
            from zoo.run.errors import ConfigError

            raise ConfigError(f"{START_METHOD_ENV}={chosen} is unknown; use spawn, forkserver or fork (or unset it)")
        return chosen
    return "spawn" if torch.cuda.is_available() else "forkserver"


def _os_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # not Linux: unknown, so not 1
        return 0


def _fork_or_forkserver(dynamo: bool = False) -> str:
    """ZOO_START_METHOD=fork: the ranks are forked from this process itself, after it imported
    PRELOAD, so no second interpreter imports them again (a process that has them imported
    already, as the tests' run server does, starts a 2-rank run ~7 s sooner). Only a process
    with one OS thread forks: a child forked after OpenMP started its thread pool hangs at its
    first parallel op (seen here with torch's libgomp). With more threads, the forkserver."""
    import importlib

    for name in preload(dynamo):
        importlib.import_module(name)
    return "fork" if _os_threads() == 1 else "forkserver"
