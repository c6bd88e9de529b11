"""trainer.profile: torch.profiler over a window of steps on every rank.

Steps `start` .. `start + steps - 1` run under `torch.profiler.profile` (CPU activity; CUDA's
too where there is a GPU; shapes and memory recorded; Python stacks with `with_stack`). At
the window's end each rank writes its Chrome trace, RUN_DIR/profile/rank{r}.json (Perfetto
and TensorBoard's profiler read it; its metadata carries the rank's tp/pp/dp coordinates),
and its step breakdown (zoo/observe/breakdown.py); rank 0 gathers them, prints the table, the
spread across ranks and the load-balance diagnosis, and writes RUN_DIR/profile/summary.json
(`python -m zoo.profile RUN_DIR` prints it again, or two runs side by side). On CUDA,
`memory=true` records the allocator's history over the window and dumps
RUN_DIR/profile/memory_rank{r}.pickle (pytorch.org/memory_viz), also when the window runs
out of memory.
"""
from __future__ import annotations

import contextlib
import json
import socket
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch
import torch.distributed as dist

from zoo.observe.breakdown import COMPUTE, KINDS, step_breakdown
from zoo.observe.device_time import trace_device_breakdown

TRACE_VIEWERS = "https://ui.perfetto.dev (Open trace file) or TensorBoard's profiler plugin"
STAGE_IMBALANCE = 1.25  # a stage computing this much more than another is named
# What the profiler's C++ side prints on every start and stop (unless verbose=true).
PROFILER_NOISE = ("SyncActivityProfilerHandler", "allocated before the profiling started")


def profile_dir(profile, run_dir: Path) -> Path:
    """Where the traces go: trainer.profile.dir (`profile`: that section), else the run's profile/."""
    return Path(profile.dir).expanduser() if profile.dir else run_dir / "profile"


def _marked(fn, name: str):
    def run(self, **kwargs):
        with torch.profiler.record_function(f"zoo.{name}"):
            return fn(self, **kwargs)

    return run


class ProfileWindow:
    """One rank's profiler window; `ranges(kind)` marks a part of a step while it is open."""

    def __init__(self, cfg, run_dir: Path, *, rank: int, coords: Dict[str, int], device: torch.device, comm,
                 engine, pipelined: bool):
        p = cfg.trainer.profile
        self.first, self.last, self.with_stack = p.start, p.start + p.steps - 1, p.with_stack
        self.memory = p.memory and device.type == "cuda"
        self.dir, self.rank, self.coords, self.device = profile_dir(cfg.trainer.profile, run_dir), rank, coords, device
        self.comm, self.engine, self.pipelined = comm, engine, pipelined
        self.partition_method, self.verbose = cfg.parallel.partition_method, cfg.verbose
        self.prof, self._quiet = None, contextlib.ExitStack()
        self.plain_step_s: List[float] = []  # the steps before the window, for its overhead

    @property
    def open(self) -> bool:
        return self.prof is not None

    def mark(self, kind: str):
        return torch.profiler.record_function(f"zoo.{kind}") if self.prof is not None else contextlib.nullcontext()

    def step(self, step: int):
        """The context of step `step` (1-based): opens the window at its first step."""
        if step == self.first:
            self._start()
        return self.mark("step")

    def _start(self) -> None:
        from torch.profiler import ProfilerActivity

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.memory:
            # Python stacks only: "all" resolves C++ frames with addr2line at the dump (461 s
            # against 4 s in torchtitan's measurement), which a time-limited job cannot spend.
            torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")
        from zoo.run.quiet import filtered_stderr

        self._quiet.enter_context(filtered_stderr(PROFILER_NOISE, self.verbose))
        self.prof = torch.profiler.profile(activities=activities, record_shapes=True, profile_memory=True,
                                           with_stack=self.with_stack)
        self.prof.start()
        self._sync()  # the window opens on every rank at once (zoo.observe.breakdown)
        self.comm.annotate = True
        if self.pipelined:  # DeepSpeed's schedule instructions, each marked by its kind
            from zoo.engine.pipe_hooks import wrap_instructions

            wrap_instructions(self.engine, _marked)
        self.t0 = time.perf_counter()

    @staticmethod
    def _sync() -> None:
        """A barrier of every rank, marked `zoo.sync`: the window's bounds (one rank: none)."""
        if dist.is_initialized() and dist.get_world_size() > 1:
            with torch.profiler.record_function("zoo.sync"):
                dist.barrier()

    def abort(self) -> None:
        """A step of the window failed: stop profiling, give stderr back (what was held is written)."""
        if self.prof is not None:
            self.comm.annotate = False
            if self.pipelined:
                from zoo.engine.pipe_hooks import unwrap_instructions

                unwrap_instructions(self.engine)
            with contextlib.suppress(Exception):
                self.prof.stop()
            self.prof = None
        self._quiet.close()

    def dump_memory(self) -> Optional[Path]:
        if not self.memory:
            return None
        path = self.dir / f"memory_rank{self.rank}.pickle"
        torch.cuda.memory._dump_snapshot(str(path))
        return path

    def finish(self, step: int) -> Optional[Dict[str, object]]:
        """After step `step`: at the window's last step, close it, write this rank's trace and
        return its breakdown row (None otherwise)."""
        if self.prof is None or step != self.last:
            return None
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.comm.annotate = False
        self._sync()  # and closes at once: a rank done early waits here (idle)
        window_s = time.perf_counter() - self.t0
        if self.pipelined:
            from zoo.engine.pipe_hooks import unwrap_instructions

            unwrap_instructions(self.engine)
        self.prof.add_metadata_json("zoo", json.dumps({"rank": self.rank, **self.coords,
                                                       "host": socket.gethostname()}))
        self.prof.stop()
        self._quiet.close()
        t0 = time.perf_counter()
        memory = self.dump_memory()
        if self.memory:
            torch.cuda.memory._record_memory_history(enabled=None)
        trace = self.dir / f"rank{self.rank}.json"
        self.prof.export_chrome_trace(str(trace))
        # On a GPU the ranges above time the CPU's launches and waits: the kernels' own time, by
        # the range that launched them, is read back from the trace (zoo.observe.device_time).
        device = trace_device_breakdown(trace) if self.device.type == "cuda" else None
        events = self.prof.events()
        main = {e.thread for e in events if e.name == "zoo.step"}
        row = step_breakdown((e.name, e.time_range.start, e.time_range.end) for e in events if e.thread in main)
        self.prof = None
        plain = self.plain_step_s[-5:]
        return {"rank": self.rank, **self.coords, "host": socket.gethostname(), **row, "window_s": window_s,
                "plain_step_ms": 1e3 * sum(plain) / len(plain) if plain else None,
                "write_s": time.perf_counter() - t0, "trace": str(trace),
                **({"memory_snapshot": str(memory)} if memory else {}), **({"device": device} if device else {})}


def gather_rows(row: Dict[str, object]) -> List[Dict[str, object]]:
    rows: List = [None] * dist.get_world_size()
    dist.all_gather_object(rows, row)
    return rows


def compute_ms(row) -> float:
    """A rank's compute a step: its kernels' device time where the trace has them (a GPU run),
    else the training thread's compute ranges."""
    if row.get("device"):
        return sum(row["device"]["device_ms"].get(k, 0.0) for k in COMPUTE)
    return sum(row["ms"][k] for k in COMPUTE)


def summarize(rows: List[Dict[str, object]], *, first: int, last: int, partition_method: str) -> Dict[str, object]:
    """The ranks' rows, the spread across them and the load-balance reading."""
    slowest = max(rows, key=lambda r: r["step_ms"])
    busiest = max(rows, key=compute_ms)
    out: Dict[str, object] = {
        "steps": [first, last], "ranks": rows,
        "step_ms_max_over_min": _ratio([r["step_ms"] for r in rows]),
        "compute_ms_max_over_min": _ratio([compute_ms(r) for r in rows]),
        "slowest_rank": slowest["rank"], "slowest_stage": slowest["pp"], "busiest_rank": busiest["rank"],
        "busiest_stage": busiest["pp"], "diagnoses": []}
    stages = sorted({r["pp"] for r in rows})
    if len(stages) > 1:
        per_stage = {s: sum(compute_ms(r) for r in rows if r["pp"] == s) / sum(1 for r in rows if r["pp"] == s)
                     for s in stages}
        out["stage_compute_ms"] = {str(s): v for s, v in per_stage.items()}
        hi, lo = max(per_stage, key=per_stage.get), min(per_stage, key=per_stage.get)
        ratio = per_stage[hi] / per_stage[lo] if per_stage[lo] > 0 else float("inf")
        out["stage_compute_max_over_min"] = ratio
        if ratio >= STAGE_IMBALANCE:
            other = ("uniform (equal layer counts)" if partition_method != "uniform"
                     else "parameters (equal parameter counts)")
            out["diagnoses"].append(f"stage {hi} computes {ratio:.1f}x stage {lo} ({per_stage[hi]:.0f} vs "
                                    f"{per_stage[lo]:.0f} ms a step): balance the partition (now "
                                    f"parallel.partition_method={partition_method}; try {other}, or "
                                    f"type:REGEX to balance the layers whose classes match)")
    replicas = sorted({r["dp"] for r in rows})
    if len(replicas) > 1:
        per_replica = {d: max(compute_ms(r) for r in rows if r["dp"] == d) for d in replicas}
        hi, lo = max(per_replica, key=per_replica.get), min(per_replica, key=per_replica.get)
        ratio = per_replica[hi] / per_replica[lo] if per_replica[lo] > 0 else float("inf")
        if ratio >= STAGE_IMBALANCE:
            out["diagnoses"].append(f"data-parallel replica {hi} computes {ratio:.1f}x replica {lo}: its ranks "
                                    f"get more work (longer samples, a slower device); the others wait for it "
                                    f"at every gradient all-reduce")
    plain = [r["plain_step_ms"] for r in rows if r.get("plain_step_ms")]
    if plain:
        out["plain_step_ms"] = sum(plain) / len(plain)
    out["write_s"] = max(r["write_s"] for r in rows)
    return out


def _ratio(values) -> float:
    lo = min(values)
    return max(values) / lo if lo > 0 else float("inf")


def table_lines(summary: Dict[str, object], where: str = "") -> List[str]:
    """The breakdown as console lines: ms a step (share) per rank and kind, then the spread."""
    rows = summary["ranks"]
    kinds = [k for k in KINDS if any(r["ms"].get(k, 0.0) >= 0.05 for r in rows)]  # .get: profiles before a kind
    first, last = summary["steps"]
    lines = [f"zoo: profile of steps {first}-{last} on {len(rows)} rank(s), ms a step (share of the step)"
             + (f"; traces in {where}" if where else "")]
    head = f"{'rank':>4} {'tp':>2} {'pp':>2} {'dp':>2} {'step':>8}" + "".join(f" {k:>14}" for k in kinds)
    lines.append(head)
    for r in rows:
        cells = "".join(f" {_cell(r['ms'][k], r['step_ms']):>14}" for k in kinds)
        lines.append(f"{r['rank']:>4} {r['tp']:>2} {r['pp']:>2} {r['dp']:>2} {r['step_ms']:>8.1f}{cells}")
    spread = (f"zoo: profile: step time max/min over ranks {summary['step_ms_max_over_min']:.2f}x (slowest: rank "
              f"{summary['slowest_rank']}, stage {summary['slowest_stage']}); compute max/min "
              f"{summary['compute_ms_max_over_min']:.2f}x (most: rank {summary['busiest_rank']}, stage "
              f"{summary['busiest_stage']})")
    lines.append(spread)
    if "stage_compute_ms" in summary:
        per = ", ".join(f"stage {s} {v:.1f} ms" for s, v in summary["stage_compute_ms"].items())
        lines.append(f"zoo: profile: compute per pipeline stage: {per}")
    lines += device_lines(rows)
    mean_step = sum(r["step_ms"] for r in rows) / len(rows)
    if summary.get("plain_step_ms"):
        lines.append(f"zoo: profile: the window's steps took {mean_step:.1f} ms, the steps before it "
                     f"{summary['plain_step_ms']:.1f} ms (profiler overhead {mean_step / summary['plain_step_ms'] - 1:+.0%}); "
                     f"writing the traces took {summary['write_s']:.1f} s")
    else:
        lines.append(f"zoo: profile: writing the traces took {summary['write_s']:.1f} s (no step before the window "
                     f"to measure the profiler's overhead against)")
    return lines


def device_lines(rows: List[Dict[str, object]]) -> List[str]:
    """The kernels' time a step per rank and kind (a GPU run's trace), the device's busy share
    of the step and the communication that ran beside compute; nothing for a CPU run."""
    rows = [r for r in rows if r.get("device")]
    if not rows:
        return []
    kinds = [k for k in (*KINDS, "memory", "other") if any(r["device"]["device_ms"].get(k, 0.0) >= 0.05 for r in rows)]
    lines = ["zoo: profile: device time from the trace's kernels, ms a step (share of the step), by the range that "
             "launched them",
             f"{'rank':>4} {'step':>8} {'busy':>14}" + "".join(f" {k:>14}" for k in kinds) + f" {'comm overlapped':>16}"]
    for r in rows:
        d = r["device"]
        cells = "".join(f" {_cell(d['device_ms'].get(k, 0.0), r['step_ms']):>14}" for k in kinds)
        lines.append(f"{r['rank']:>4} {r['step_ms']:>8.1f} {_cell(d['busy_ms'], r['step_ms']):>14}{cells} "
                     f"{d['comm_overlap_ms']:>13.1f} ms")
    return lines


def _cell(ms: float, step_ms: float) -> str:
    return f"{ms:.1f} ({ms / step_ms:.0%})" if step_ms else f"{ms:.1f}"
