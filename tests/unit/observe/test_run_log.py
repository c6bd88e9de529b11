"""zoo.observe.metrics.RunLog.event: a restart's record in metrics.jsonl and the tracker (#54)."""
from __future__ import annotations

import json

from zoo.observe.metrics import RunLog


class Tracker:
    def __init__(self):
        self.calls = []

    def log(self, values, step):
        self.calls.append(("log", dict(values), step))

    def summary(self, values):
        self.calls.append(("summary", dict(values)))

    def finish(self, exit_code=0):
        pass


def test_a_restart_goes_to_metrics_jsonl_and_to_the_trackers_summary_not_its_step_history(tmp_path):
    tracker = Tracker()
    log = RunLog(tmp_path, active=True, total_steps=0, progress=False, tracker=tracker)
    record = {"step": 10, "attempt": 1, "restarts_left": 0, "lost_steps": 2, "lost_s": 3.5}
    log.event(record)
    assert [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [record]
    # wandb's step only grows: a restart goes back to its checkpoint's step, so it is no step of the history
    assert tracker.calls == [("summary", {"attempt": 1, "restarts_left": 0, "lost_steps": 2, "lost_s": 3.5})]


def test_ranks_but_rank_0_write_nothing(tmp_path):
    tracker = Tracker()
    RunLog(tmp_path, active=False, total_steps=0, progress=False, tracker=tracker).event({"step": 1, "attempt": 1})
    assert not (tmp_path / "metrics.jsonl").exists() and tracker.calls == []
