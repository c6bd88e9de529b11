"""Time to the first step, phase by phase.

The clock starts when the command's process started (its start time in /proc, so the
interpreter's and the imports' time counts too). The command marks when validation ended and
hands both times to the ranks it starts (ZOO_START_TIME, ZOO_VALIDATED_TIME; a rank of an
external launcher measures from its own process start). Each rank then marks its own start,
the process group, the data, the model and engine, a resume's checkpoint read, and the end
of its first step. Rank 0
prints one line (`zoo: start: ...`) and summary.json holds the phases (`startup`, seconds).
"""
from __future__ import annotations

import os
import time
from typing import Dict, List, Tuple

START_ENV, VALIDATED_ENV = "ZOO_START_TIME", "ZOO_VALIDATED_TIME"
LABELS = {"validation": "imports and validation", "ranks": "ranks started", "process_group": "process group",
          "data": "data", "model": "model and engine", "resume": "checkpoint read", "first_step": "first step"}


def process_start_time() -> float:
    """This process's start (wall clock), from /proc; now where /proc has no answer."""
    try:
        with open("/proc/self/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime, after the comm field
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])  # 10 ms steps (btime in /proc/stat: whole seconds)
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


_jobs_started = 0  # runs this process started (a local Hydra sweep runs its jobs one after another in it)


def mark_validated(job_start: float) -> None:
    """In the command, once validation is over: the times its ranks measure from. The first
    run of a process counts from the process's start; a later one (a sweep's next job) from
    `job_start`, when its own run began."""
    global _jobs_started
    os.environ[START_ENV] = repr(process_start_time() if _jobs_started == 0 else job_start)
    os.environ[VALIDATED_ENV] = repr(time.time())
    _jobs_started += 1


class StartupClock:
    """One rank's marks, from the command's start."""

    def __init__(self):
        self.start = float(os.environ.get(START_ENV) or process_start_time())
        self.marks: List[Tuple[str, float]] = []
        if os.environ.get(VALIDATED_ENV):
            self.marks.append(("validation", float(os.environ[VALIDATED_ENV])))

    def mark(self, phase: str) -> None:
        if phase not in dict(self.marks):
            self.marks.append((phase, time.time()))

    def phases(self) -> Dict[str, float]:
        """Seconds of each phase (from the previous mark) and `total`, to the last mark."""
        out, previous = {}, self.start
        for phase, at in self.marks:
            out[phase] = round(max(0.0, at - previous), 3)
            previous = at
        out["total"] = round(max(0.0, previous - self.start), 3)
        return out

    def line(self) -> str:
        phases = self.phases()
        parts = ", ".join(f"{LABELS.get(k, k)} {v:.1f}" for k, v in phases.items() if k != "total")
        return f"zoo: start: {phases['total']:.1f} s to the end of the first step ({parts})"
