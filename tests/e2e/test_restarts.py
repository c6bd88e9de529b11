"""In-job restarts under zoo's own launcher (run.max_restarts, #54): a killed rank restarts the
ranks from the newest checkpoint, what was lost is said and recorded, and the budget, once
spent, ends the job in one line."""
from __future__ import annotations

import json
import signal

from tests.e2e.test_failures import start, wait_for_training, workers


def _logged(run_dir) -> list:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_killed_rank_restarts_from_the_checkpoint_and_a_spent_budget_ends_the_job_in_one_line(tmp_path, zoo_cache):
    """Rank 1 killed after step 12 (checkpoint at 10): attempt 2 resumes step 10, trains 11-12
    again with the losses attempt 1 logged for them (within 1e-5: the same run, resumed), says
    what it lost; killed again, run.max_restarts=1 is spent: one error line naming the rank,
    the budget and the checkpoint to go on from, exit code 1."""
    run_dir = tmp_path / "run"
    proc = start(run_dir, zoo_cache, "parallel=zero1", "trainer.max_steps=100000", "checkpoint.every=5",
                 "run.max_restarts=1", "logger=none")
    wait_for_training(run_dir, proc, steps=12)
    workers(proc)[1].send_signal(signal.SIGKILL)
    lines = 12 + 1 + 4  # attempt 1's (12 or a few more), the restart's record, attempt 2's (11, 12, ...)
    wait_for_training(run_dir, proc, steps=lines)
    first = _logged(run_dir)
    workers(proc)[1].send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("zoo: error:")]
    assert len(errors) == 1 and errors[0].startswith("zoo: error: rank 1 failed first (exit code -9)"), err[-3000:]
    assert "that was attempt 2 of 2: run.max_restarts=1 spent, the job ends (resume=auto in hydra.run.dir=" in errors[0]
    assert "restart 1 of 1 (run.max_restarts)" in err and "Traceback" not in err, err[-3000:]
    restart = [m for m in first if "attempt" in m]
    at = first.index(restart[0])
    before = {m["step"]: m["loss"] for m in first[:at] if "loss" in m}
    again = {m["step"]: m["loss"] for m in first[at + 1:] if "loss" in m}
    lost = max(before) - 10  # 2, or more where steps went through before the kill landed
    assert restart == [{"step": 10, "attempt": 1, "restarts_left": 0, "lost_steps": lost, "lost_s": restart[0]["lost_s"]}]
    assert 0 < restart[0]["lost_s"] < 120
    said = [line for line in out.splitlines() if line.startswith("zoo: attempt 2 ")]
    assert len(said) == 1 and f"{lost} step(s) and" in said[0] and "lost since step 10's checkpoint" in said[0], out
    assert set(before) == set(range(1, max(before) + 1)) and {11, 12} <= set(again)
    for step in (11, 12):
        assert abs(again[step] - before[step]) <= 1e-5 * abs(before[step]), (step, again[step], before[step])
    records = [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]
    assert [(r["attempt"], r["resumed_step"]) for r in records] == [(0, None), (1, 10)]
    assert not (run_dir / "summary.json").exists()  # the job did not finish


def test_a_rank_killed_while_a_checkpoint_is_written_leaves_the_one_before_to_resume(tmp_path, zoo_cache):
    """Rank 1 is killed in step 10's save, after writing its shard (ZOO_TEST_DIE_IN_SAVE): that
    checkpoint never completes, `latest` still names step 5's, and the restart resumes step 5
    (not the half-written one), writes step 10's again over the leftover and finishes."""
    import os

    run_dir = tmp_path / "run"
    os.environ["ZOO_TEST_DIE_IN_SAVE"] = "10:1"
    try:
        proc = start(run_dir, zoo_cache, "parallel=zero1", "trainer.max_steps=12", "checkpoint.every=5",
                     "run.max_restarts=1", "logger=none")
    finally:
        del os.environ["ZOO_TEST_DIE_IN_SAVE"]
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    assert "zoo: rank 1 failed first (exit code -9)" in err and "restart 1 of 1 (run.max_restarts)" in err, err[-3000:]
    resumed = [line for line in out.splitlines() if line.startswith("zoo: resumed from")]
    assert len(resumed) == 1 and "step_0000005 at step 5" in resumed[0], out[-3000:]
    assert "lost since step 5's checkpoint was saved" in out
    steps = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert steps == ["latest", "step_0000010", "step_0000012"], steps  # no .step_0000010.tmp left
    assert json.loads((run_dir / "summary.json").read_text())["attempts"] == 2
