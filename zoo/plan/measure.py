"""`plan.measure=K`: the planner's top K layouts run for a few steps each on this machine,
through the real training entry point (`python -m zoo.train` with the plan's own command,
in a temporary run directory), their predicted step time and peak memory beside the
measured ones, and the layouts ranked again by measurement.

The runs train the planned model itself: its vocabulary as planned (model.vocab_size, the
tokenizer trained here being smaller), on the built-in corpus, without evaluation, samples,
checkpoints or a tracker. A step's measured time is the run's steps after the first (the
summary's samples/s); its memory the busiest rank's peak. The cluster must be this machine:
one node, of at most the GPUs here (on CPU each "GPU" is a rank of this host).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import List

from zoo.plan.report import train_overrides
from zoo.plan.search import Candidate, Plan

GB = 1e9
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Measured:
    """One planned layout, run."""

    candidate: Candidate
    step_s: float
    """Seconds per optimizer step, measured (steps after the first)."""
    peak_bytes: float
    """The busiest rank's peak memory, measured."""


def check_measure(plan: Plan, devices_here: int) -> int:
    """How many layouts to run; ValueError (one line) where plan.measure cannot be done here."""
    k, c = plan.plan.measure, plan.cluster
    if k is None:
        return 0
    if k < 1:
        raise ValueError(f"plan.measure={k} must be positive (the number of the planner's top layouts to run "
                         f"here), or null to run none")
    if plan.plan.measure_steps < 2:
        raise ValueError(f"plan.measure_steps={plan.plan.measure_steps} must be at least 2 (the first step, its "
                         f"warm-up, is not timed)")
    if c.nodes != 1 or (devices_here and c.gpus_per_node > devices_here):
        raise ValueError(f"plan.measure={k} runs the layouts on this machine: the cluster must be it (cluster.nodes="
                         f"{c.nodes}, cluster.gpus_per_node={c.gpus_per_node}; here: 1 node"
                         + (f" of {devices_here} GPU(s)" if devices_here else ", ranks on its CPU") + "), e.g. "
                         "cluster=cpu")
    fitting = sum(x.fits for x in plan.candidates)
    if k > fitting:
        raise ValueError(f"plan.measure={k} but {fitting} layout(s) fit: measure at most {fitting}")
    return k


def train_command(plan: Plan, cand: Candidate, run_dir: Path, steps: int) -> List[str]:
    return [sys.executable, "-m", "zoo.train", *train_overrides(plan, cand), f"trainer.max_steps={steps}",
            "logger=none", "trainer.sample_tokens=0", "trainer.eval_every=0", "trainer.progress=false",
            "checkpoint.save_final=false", "optim.warmup_steps=1", f"hydra.run.dir={run_dir}"]


def measure(plan: Plan, k: int, steps: int) -> List[Measured]:
    """Run the top `k` fitting layouts for `steps` steps each; ValueError names a run that failed."""
    out = []
    with tempfile.TemporaryDirectory(prefix="zoo-plan-measure-") as tmp:
        for i, cand in enumerate([x for x in plan.candidates if x.fits][:k]):
            run_dir = Path(tmp) / f"layout{i}"
            cmd = train_command(plan, cand, run_dir, steps)
            proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "WANDB_MODE": "disabled"}, capture_output=True,
                                  text=True)
            summary = run_dir / "summary.json"
            if proc.returncode != 0 or not summary.is_file():
                last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
                raise ValueError(f"plan.measure: the run of layout {i + 1} failed (exit {proc.returncode}): {last}; "
                                 f"its command: {' '.join(cmd[1:])}")
            s = json.loads(summary.read_text())
            out.append(Measured(cand, step_s=s["global_batch_size"] / s["samples_per_s"],
                                peak_bytes=float(s["peak_mem_bytes"])))
    return out


def name(c: Candidate) -> str:
    lay = c.layout
    return (f"tp={lay.tp} {f'cp={lay.cp} ' if lay.cp > 1 else ''}pp={lay.pp} dp={lay.dp} z{lay.zero_stage} "
            f"mb={lay.micro_batch_size} "
            f"acc={lay.grad_accum}{' ac' if lay.activation_checkpointing else ''}")


def report(plan: Plan, runs: List[Measured], steps: int) -> str:
    """Predicted against measured per layout, in the planner's order, then ranked by measurement."""
    lines = ["", f"Measured here ({len(runs)} layout(s), {steps} steps each through python -m zoo.train):",
             f"  {'#':>2} {'layout':<34} {'s/step pred':>11} {'meas':>8} {'ratio':>6} {'GB pred':>8} {'meas':>7} "
             f"{'ratio':>6}"]
    for i, r in enumerate(runs):
        c = r.candidate
        lines.append(f"  {i + 1:>2} {name(c):<34} {c.time.total:>11.3f} {r.step_s:>8.3f} "
                     f"{r.step_s / c.time.total:>6.2f} {c.mem.total / GB:>8.2f} {r.peak_bytes / GB:>7.2f} "
                     f"{r.peak_bytes / c.mem.total:>6.2f}")
    best = min(runs, key=lambda r: r.step_s)
    pick = runs[0]
    order = sorted(range(len(runs)), key=lambda i: runs[i].step_s)
    lines += [f"  by measurement: {', '.join(f'#{i + 1}' for i in order)}; the planner's pick (#1) measured "
              f"{pick.step_s / best.step_s - 1:+.0%} against the fastest (#{order[0] + 1}, {name(best.candidate)})",
              f"  train with: python -m zoo.train {' '.join(train_overrides(plan, best.candidate))}"]
    return "\n".join(lines) + "\n"


def measured_section(plan: Plan) -> str:
    """The text plan.measure adds to the plan ('' when it is null)."""
    import torch

    k = check_measure(plan, torch.cuda.device_count())
    if not k:
        return ""
    runs = measure(plan, k, plan.plan.measure_steps)
    return report(plan, runs, plan.plan.measure_steps)
