"""When a periodic checkpoint is due: every N steps (`checkpoint.every=N`), or every N steps
chosen from what a save costs and how often the job fails (`checkpoint.every=auto`).

A job that fails on average every M seconds and loses what it trained since its last
checkpoint, checkpointing every T seconds at a cost of d seconds each, wastes about d / T + T /
(2M) of its time; T = sqrt(2 d M) minimises it (Young, "A first order approximation to the
optimum checkpoint interval", CACM 1974). M is `run.mtbf_hours` (the job's, not one node's:
a node's MTBF over the number of nodes), d what a save costs the training: the time the step
stood still for it (with checkpoint.async_save only the staging copy). An asynchronous write
must also end before the next save starts, so the interval is never shorter than the last
background write. What a save costs is only known once one is done, so `auto` saves first
after two steps of each start (the second step's time is a step's without the first's
warm-up), then after each save sets the interval from the save's cost and the mean step so
far, on every rank alike (the ranks agree on the largest of each rank's figures); a new
interval within 25% of the current one (the measurements' noise) keeps the current one.
"""
from __future__ import annotations

import math
from typing import Optional

PROBE_STEPS = 2  # steps of a start before auto's first save, which measures what a save costs
CHANGE = 0.25  # a new interval within this share of the current one keeps the current one


def young_seconds(save_s: float, mtbf_s: float) -> float:
    """Young's optimum interval between checkpoints, in seconds."""
    return math.sqrt(2.0 * max(save_s, 0.0) * mtbf_s)


class EveryN:
    """checkpoint.every=N: at every N-th step (0: never)."""

    measures = False  # saved() needs no measurement

    def __init__(self, every: int):
        self.every = int(every)

    def due(self, step: int) -> bool:
        return bool(self.every) and step % self.every == 0

    def saved(self, step: int, save_s: float, step_s: float, write_s: float = 0.0) -> Optional[str]:
        return None

    def start_line(self) -> Optional[str]:
        return None

    def record(self) -> dict:
        return {}


class FromFailureRate:
    """checkpoint.every=auto: the interval from run.mtbf_hours and the measured cost of a save.
    `state`: what the checkpoint this start resumed from recorded (record()), whose interval it
    keeps until its own first save measures again."""

    measures = True  # saved() takes the save's cost and the step time, agreed over the ranks

    def __init__(self, mtbf_hours: float, start_step: int, state: Optional[dict] = None):
        self.mtbf_s = float(mtbf_hours) * 3600.0
        self.interval: Optional[int] = (state or {}).get("interval")
        self.next = start_step + (self.interval or PROBE_STEPS)
        self.mtbf_hours = mtbf_hours

    def due(self, step: int) -> bool:
        return step >= self.next

    def saved(self, step: int, save_s: float, step_s: float, write_s: float = 0.0) -> Optional[str]:
        """After the save at `step` that stalled training `save_s` seconds, steps of `step_s`
        seconds on average, the last background write `write_s`: the next save's step, and the
        line that says why when the interval changed."""
        optimum = young_seconds(save_s, self.mtbf_s)
        seconds = max(optimum, write_s)
        steps = max(1, round(seconds / step_s)) if step_s > 0 else 1
        if self.interval and abs(steps - self.interval) <= CHANGE * self.interval:
            self.next = step + self.interval  # within the measurements' noise: kept, nothing said
            return None
        self.interval, self.next = steps, step + steps
        why = (f"a save stalls training {save_s:.2f} s, a step takes {step_s:.2f} s, run.mtbf_hours={self.mtbf_hours:g}: "
               f"Young's sqrt(2 x {save_s:.2f} s x {self.mtbf_s:.0f} s) = {optimum:.3g} s")
        if write_s > optimum:
            why += f", raised to the last background write's {write_s:.1f} s"
        return f"zoo: checkpoint.every=auto: every {steps} steps from step {step} ({why})"

    def start_line(self) -> str:
        if self.interval:
            return (f"zoo: checkpoint.every=auto: every {self.interval} steps, as the checkpoint resumed from chose "
                    f"(run.mtbf_hours={self.mtbf_hours:g}); its own first save measures again")
        return (f"zoo: checkpoint.every=auto: a first checkpoint at step {self.next} measures what a save costs; "
                f"then every sqrt(2 x save x MTBF) with run.mtbf_hours={self.mtbf_hours:g} (Young's interval)")

    def record(self) -> dict:
        return {"interval": self.interval} if self.interval else {}


def interval_policy(cfg, start_step: int, state: Optional[dict] = None):
    """The policy checkpoint.every asks for (validated before: an int >= 0 or "auto" with
    run.mtbf_hours)."""
    every = cfg.checkpoint.every
    if every == "auto":
        return FromFailureRate(cfg.run.mtbf_hours, start_step, state)
    return EveryN(int(every))
