"""How long an in-job restart takes, and what it loses (#54).

    python benchmarks/restart_time.py [--rounds 2] [--ranks 4]

The tiny GPT trains with a checkpoint every 5 steps; once step 12 is logged one rank is
SIGKILLed (or a whole node: its torchrun agent and ranks). Measured: the seconds from the kill
to the first step the next attempt logs (metrics.jsonl, polled every 20 ms), and the steps
lost (attempts.jsonl's, against the steps logged past the checkpoint before the kill: they
must be equal). Three ways:
  zoo         `python -m zoo.train run.max_restarts=1` with --ranks local ranks, one killed
  torchrun    `torchrun --standalone --max-restarts=1` with --ranks ranks, one killed
  node lost   two torchrun agents of --ranks/2 ranks each (`--nnodes=1:2`), parallel=auto; the
              second agent and its ranks killed: the first goes on alone, re-planned
  slurm rank / slurm node lost (`--ways` naming them; SLURM_CONF set to the 2-node test cluster
              of `ZOO_SLURM_NODES=2 bash .ci/slurm_setup.sh up`): slurm/train_multinode.sbatch,
              2 nodes x --ranks/2, run.max_restarts=1; one rank on node 2 killed, or node 2
              lost (every process of its namespace: slurmd, step daemon, ranks; brought back after)
Target: under 60 s from the kill to the next attempt's first step, on this box. Rounds run
one after another (the machine otherwise idle); the table prints each round and the median.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
COMMON = ["debug=fast", "trainer.progress=false", "trainer.max_steps=30", "checkpoint.every=5", "logger=none",
          "trainer.sample_tokens=0", "optim.warmup_steps=2", "trainer.eval_batches=1"]
KILL_AFTER = 12


def _env(cache: str) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "WANDB_MODE": "disabled",
            "ZOO_CACHE": cache}


def _lines(run_dir: Path) -> list:
    try:
        return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def _wait(predicate, procs, timeout: float = 300, poll: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if all(p.poll() is not None for p in procs):
            raise RuntimeError(f"the job ended first (exit codes {[p.poll() for p in procs]})")
        time.sleep(poll)
    raise RuntimeError("timed out")


def _torchrun() -> str:
    return str(Path(sys.executable).with_name("torchrun"))


def _ranks_of(agent: subprocess.Popen) -> list:
    """The rank processes under a launcher process (each has RANK in its environment)."""
    found = []
    for child in psutil.Process(agent.pid).children(recursive=True):
        try:
            if child.environ().get("RANK") is not None and "zoo" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:
            continue
    return found


def _local_ranks(parent: subprocess.Popen) -> list:
    """zoo's launcher's ranks: forked by its forkserver (or spawned)."""
    found = []
    for child in psutil.Process(parent.pid).children(recursive=True):
        try:
            up = child.parent()
            if "spawn_main" in " ".join(child.cmdline()) or (up and "forkserver" in " ".join(up.cmdline())):
                found.append(child)
        except psutil.Error:
            continue
    return found


def _first_step_after_restart(run_dir: Path):
    """The first step the restarted attempt logged (after its restart record), or None."""
    lines = _lines(run_dir)
    at = next((i for i, m in enumerate(lines) if "attempt" in m), None)
    return None if at is None else next((m for m in lines[at + 1:] if "loss" in m), None)


def one(way: str, ranks: int, root: Path, cache: str) -> dict:
    run_dir = root / f"{way.replace(' ', '_')}-{time.time_ns()}"
    env = _env(cache)
    out = open(root / f"{run_dir.name}.log", "w")
    procs = []
    if way.startswith("slurm"):
        return _slurm(way, ranks, root)
    if way == "zoo":
        procs.append(subprocess.Popen([sys.executable, "-m", "zoo.train", f"hydra.run.dir={run_dir}", "parallel=zero1",
                                       f"parallel.dp={ranks}", "run.max_restarts=1", *COMMON], cwd=REPO, env=env,
                                      stdout=out, stderr=subprocess.STDOUT))
    elif way == "torchrun":
        procs.append(subprocess.Popen([_torchrun(), "--standalone", f"--nproc-per-node={ranks}", "--max-restarts=1",
                                       "-m", "zoo.train", f"hydra.run.dir={run_dir}", "parallel=zero1", *COMMON],
                                      cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT))
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        for _ in range(2):
            procs.append(subprocess.Popen([_torchrun(), "--nnodes=1:2", f"--nproc-per-node={ranks // 2}",
                                           "--max-restarts=1", "--rdzv-backend=c10d",
                                           f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=bench",
                                           "--rdzv-conf=last_call_timeout=3", "-m", "zoo.train",
                                           f"hydra.run.dir={run_dir}", "parallel=auto", *COMMON],
                                          cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT))
            if len(procs) == 1:  # the first agent hosts the rendezvous store
                _wait(lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0, procs, timeout=60, poll=0.1)
    try:
        _wait(lambda: len([m for m in _lines(run_dir) if "loss" in m]) >= KILL_AFTER, procs)
        if way == "zoo":
            victims = _local_ranks(procs[0])[1:2]
        elif way == "torchrun":
            victims = sorted(_ranks_of(procs[0]), key=lambda p: int(p.environ()["RANK"]))[1:2]
        else:
            victims = [psutil.Process(procs[1].pid), *psutil.Process(procs[1].pid).children(recursive=True)]
        killed = time.monotonic()
        for victim in victims:
            victim.send_signal(signal.SIGKILL)
        first_new = _wait(lambda: _first_step_after_restart(run_dir), procs[:1])
        took = time.monotonic() - killed
        procs[0].wait(timeout=300)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        out.close()
    lines = _lines(run_dir)
    logged = max(m["step"] for m in lines[:next(i for i, m in enumerate(lines) if "attempt" in m)] if "loss" in m)
    record = [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()][-1]
    return {"way": way, "s": took, "first_step": first_new["step"], "lost_steps": record["lost_steps"],
            "resumed_step": record["resumed_step"], "past_checkpoint": logged - record["resumed_step"],
            "ranks": f"{record['previous_world_size']} -> {record['world_size']}", "layout": record["layout"],
            "lost_s": record["lost_s"], "exit": procs[0].returncode}


def _slurm(way: str, ranks: int, root: Path) -> dict:
    sys.path.insert(0, str(REPO))
    from tests.slurm.test_multinode import TINY_GPT, submit
    from tests.slurm.test_slurm import LAUNCHER_VARS, Cluster, _job_processes, _setup

    env = {k: v for k, v in os.environ.items() if not LAUNCHER_VARS.fullmatch(k)}
    nodes = Cluster({**env, "SLURM_CONF": os.environ["SLURM_CONF"], "ZOO_PYTHON": sys.executable})
    work = root / f"slurm-{time.time_ns()}"
    work.mkdir()
    job = submit(nodes, work, [*TINY_GPT, "trainer.max_steps=30", "checkpoint.every=5", "run.max_restarts=1"],
                 per_node=ranks // 2)
    procs = []

    class Running:  # _wait's "the job ended first"
        def poll(self):
            return None if nodes.show(job)["JobState"] in ("PENDING", "RUNNING") else 1

    procs = [Running()]
    _wait(lambda: job.run_dir.is_dir() and len([m for m in _lines(job.run_dir) if "loss" in m]) >= KILL_AFTER, procs,
          poll=0.2)
    killed = time.monotonic()
    if way == "slurm rank":
        [p for p in _job_processes(job) if p.environ().get("SLURM_PROCID") == str(ranks // 2)][0].kill()
    else:
        subprocess.run(["bash", "-c", "ip netns pids zoo-node2 | xargs -r kill -9"], check=True, timeout=30)
    try:
        first_new = _wait(lambda: _first_step_after_restart(job.run_dir), procs)
        took = time.monotonic() - killed
        info = nodes.wait(job, timeout_s=300)
    finally:
        if way != "slurm rank":
            _setup("up", 2)
    lines = _lines(job.run_dir)
    logged = max(m["step"] for m in lines[:next(i for i, m in enumerate(lines) if "attempt" in m)] if "loss" in m)
    record = [json.loads(line) for line in (job.run_dir / "attempts.jsonl").read_text().splitlines()][-1]
    return {"way": way, "s": took, "first_step": first_new["step"], "lost_steps": record["lost_steps"],
            "resumed_step": record["resumed_step"], "past_checkpoint": logged - record["resumed_step"],
            "ranks": f"{record['previous_world_size']} -> {record['world_size']}", "layout": record["layout"],
            "lost_s": record["lost_s"], "exit": 0 if info["JobState"] == "COMPLETED" and info["Restarts"] == "0" else 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--ways", default="zoo,torchrun,node lost")
    args = parser.parse_args()
    cache = os.environ.get("ZOO_CACHE") or str(REPO / ".zoo_cache")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for way in args.ways.split(","):
                row = one(way, args.ranks, Path(tmp), cache)
                rows.append(row)
                print(f"round {r + 1} {way:9s}: {row['s']:5.1f} s from the kill to step {row['first_step']} of the next "
                      f"attempt; ranks {row['ranks']} ({row['layout']}); lost {row['lost_steps']} step(s) "
                      f"(logged past step {row['resumed_step']}'s checkpoint before the kill: {row['past_checkpoint']}), "
                      f"{row['lost_s']:.1f} s since that checkpoint's save; exit {row['exit']}", flush=True)
    for way in args.ways.split(","):
        mine = [row for row in rows if row["way"] == way]
        worst = max(row["s"] for row in mine)
        equal = all(row["lost_steps"] == row["past_checkpoint"] and row["exit"] == 0 for row in mine)
        print(f"{way:9s}: median {statistics.median(row['s'] for row in mine):.1f} s, worst {worst:.1f} s from the kill "
              f"to the next attempt's first step (target 60 s: {'met' if worst < 60 else 'NOT met'}); lost steps = "
              f"steps past the checkpoint in every round: {'yes' if equal else 'NO'}")


if __name__ == "__main__":
    main()
