"""A job's attempts: which one this is, how many restarts are left, and what each restart lost.

A job restarted inside itself (`torchrun --max-restarts=K`, or zoo's own launcher with
`run.max_restarts=K`) runs as attempts 0, 1, ...; each restarted attempt resumes the newest
intact checkpoint. What a restart lost: the steps logged past that checkpoint (trained again)
and the wall time from the checkpoint's save to the new attempt's resume (the steps trained
again, the failure's detection, the restart and the read). Rank 0 appends one line an attempt
to the run directory's attempts.jsonl; summary.json and the tracker get the totals.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

ATTEMPT_ENV, MAX_RESTARTS_ENV = "ZOO_ATTEMPT", "ZOO_MAX_RESTARTS"  # set by zoo's local launcher for its ranks
RECORDS = "attempts.jsonl"
METRICS = ("attempt", "restarts_left", "lost_steps", "lost_s")  # a restart's line in metrics.jsonl (and the tracker)


@dataclass(frozen=True)
class Attempt:
    number: int  # 0: the job's first
    max_restarts: int
    launcher: str  # what grants the restarts, as the user set it

    @property
    def restarts_left(self) -> int:
        return max(self.max_restarts - self.number, 0)


def current(env: Optional[Mapping[str, str]] = None) -> Attempt:
    """This process's attempt: zoo's local launcher's (ZOO_ATTEMPT), else torchrun's restart count."""
    env = os.environ if env is None else env
    if env.get(ATTEMPT_ENV) is None and env.get("TORCHELASTIC_RUN_ID"):
        return Attempt(int(env.get("TORCHELASTIC_RESTART_COUNT") or 0), int(env.get("TORCHELASTIC_MAX_RESTARTS") or 0),
                       "torchrun --max-restarts")
    return Attempt(int(env.get(ATTEMPT_ENV) or 0), int(env.get(MAX_RESTARTS_ENV) or 0), "run.max_restarts")


def _lines(path: Path) -> list:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def last_logged_step(run_dir: Path) -> int:
    """The highest step metrics.jsonl holds (0 where none)."""
    try:
        tail = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()[-50:]
    except OSError:
        return 0
    steps = []
    for line in tail:
        try:
            steps.append(int(json.loads(line).get("step", 0)))
        except (ValueError, AttributeError):
            continue
    return max(steps, default=0)


def begin(run_dir: Path, attempt: Attempt, *, world_size: int, layout: str, resumed_step: Optional[int],
          saved_at: Optional[float], now: Optional[float] = None) -> dict:
    """Rank 0, once an attempt has built its model and read its checkpoint: append this attempt's
    record to attempts.jsonl and return it. A restarted attempt's record says what was lost since
    the checkpoint it resumed (`resumed_step`, saved at `saved_at`; None: no checkpoint, so all of
    the previous attempt's time) and what changed (ranks, layout) from the attempt before."""
    now = time.time() if now is None else now
    path = Path(run_dir) / RECORDS
    before = _lines(path)
    record = {"attempt": attempt.number, "restarts_left": attempt.restarts_left, "max_restarts": attempt.max_restarts,
              "started_at": now, "world_size": world_size, "layout": layout, "resumed_step": resumed_step}
    if attempt.number > 0:
        previous = before[-1] if before else {}
        since = saved_at if saved_at is not None else previous.get("started_at")
        record.update(lost_steps=max(last_logged_step(run_dir) - (resumed_step or 0), 0),
                      lost_s=round(now - since, 3) if since is not None else None,
                      previous_world_size=previous.get("world_size"), previous_layout=previous.get("layout"))
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
    return record


def restart_line(record: dict, launcher: str) -> str:
    """The line a restarted attempt says once it has resumed: what was lost and what changed."""
    lost = record["lost_steps"]
    since = (f"since step {record['resumed_step']}'s checkpoint was saved" if record["resumed_step"] is not None
             else "since the attempt before started (it saved no checkpoint)")
    took = f"{record['lost_s']:.1f} s" if record.get("lost_s") is not None else "an unknown time"
    was = record.get("previous_world_size")
    changed = ("" if was is None or (was, record.get("previous_layout")) == (record["world_size"], record["layout"])
               else f"; was {was} rank(s), {record.get('previous_layout')}")
    return (f"zoo: attempt {record['attempt'] + 1} (restart {record['attempt']} of {record['max_restarts']}, "
            f"{launcher}; {record['restarts_left']} left): {lost} step(s) and {took} lost {since}; now "
            f"{record['world_size']} rank(s), {record['layout']}{changed}")


def totals(run_dir: Path) -> dict:
    """summary.json's fields over this job's attempts ({} where attempts.jsonl is missing)."""
    records = _lines(Path(run_dir) / RECORDS)
    if not records:
        return {}
    firsts = [i for i, r in enumerate(records) if r.get("attempt") == 0]
    records = records[firsts[-1] if firsts else 0:]  # this job's (a later job resuming the run starts at 0)
    restarted = records[1:]
    return {"attempts": len(records), "restarts": records[-1]["attempt"], "restarts_left": records[-1]["restarts_left"],
            "lost_steps": sum(r.get("lost_steps") or 0 for r in restarted),
            "lost_s": round(sum(r.get("lost_s") or 0.0 for r in restarted), 3)}
