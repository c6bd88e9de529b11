"""zoo.run.attempts: which attempt a rank is in, and what a restart lost (#54)."""
from __future__ import annotations

import json

from zoo.run import attempts
from zoo.run.attempts import Attempt


def test_the_attempt_comes_from_zoos_launcher_before_torchruns():
    assert attempts.current({}) == Attempt(0, 0, "run.max_restarts")
    torchrun = {"TORCHELASTIC_RUN_ID": "x", "TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_MAX_RESTARTS": "3"}
    assert attempts.current(torchrun) == Attempt(2, 3, "torchrun --max-restarts")
    assert attempts.current(torchrun).restarts_left == 1
    # zoo's launcher runs its ranks under torch's elastic agent (restart count 0): its own number counts
    assert attempts.current({**torchrun, "ZOO_ATTEMPT": "1", "ZOO_MAX_RESTARTS": "2"}) == Attempt(1, 2, "run.max_restarts")


def _metrics(run_dir, steps):
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in steps))


def test_a_restart_records_the_steps_past_its_checkpoint_and_the_time_since_its_save(tmp_path):
    first = attempts.begin(tmp_path, Attempt(0, 2, "run.max_restarts"), world_size=4, layout="tp1-pp1-dp4",
                           resumed_step=None, saved_at=None, now=100.0)
    assert first["attempt"] == 0 and "lost_steps" not in first
    _metrics(tmp_path, range(1, 14))  # attempt 0 logged 13 steps; its checkpoint is step 10's, saved at 130 s
    second = attempts.begin(tmp_path, Attempt(1, 2, "run.max_restarts"), world_size=2, layout="tp1-pp1-dp2",
                            resumed_step=10, saved_at=130.0, now=151.5)
    assert (second["lost_steps"], second["lost_s"], second["restarts_left"]) == (3, 21.5, 1)
    line = attempts.restart_line(second, "run.max_restarts")
    assert line == ("zoo: attempt 2 (restart 1 of 2, run.max_restarts; 1 left): 3 step(s) and 21.5 s lost since step "
                    "10's checkpoint was saved; now 2 rank(s), tp1-pp1-dp2; was 4 rank(s), tp1-pp1-dp4")
    assert attempts.totals(tmp_path) == {"attempts": 2, "restarts": 1, "restarts_left": 1, "lost_steps": 3,
                                         "lost_s": 21.5}


def test_a_restart_before_any_checkpoint_lost_all_of_the_attempt_before(tmp_path):
    attempts.begin(tmp_path, Attempt(0, 1, "x"), world_size=2, layout="L", resumed_step=None, saved_at=None, now=10.0)
    _metrics(tmp_path, range(1, 4))
    again = attempts.begin(tmp_path, Attempt(1, 1, "x"), world_size=2, layout="L", resumed_step=None, saved_at=None,
                           now=25.0)
    assert (again["lost_steps"], again["lost_s"]) == (3, 15.0)
    assert "since the attempt before started (it saved no checkpoint)" in attempts.restart_line(again, "x")
    assert "; was" not in attempts.restart_line(again, "x")  # nothing changed: not said


def test_the_totals_are_this_jobs_a_later_job_resuming_the_run_starts_again_at_attempt_0(tmp_path):
    for number, now in ((0, 1.0), (1, 5.0), (0, 50.0)):
        attempts.begin(tmp_path, Attempt(number, 1, "x"), world_size=2, layout="L", resumed_step=None,
                       saved_at=None, now=now)
    assert attempts.totals(tmp_path) == {"attempts": 1, "restarts": 0, "restarts_left": 1, "lost_steps": 0,
                                         "lost_s": 0.0}
    assert attempts.totals(tmp_path / "none") == {}


def test_a_lost_peers_line_says_whether_the_job_restarts_or_ends(monkeypatch, capsys):
    from zoo.run.roll_call import Verdict
    from zoo.worker import report_failure

    lost = RuntimeError("Connection closed by peer [10.0.0.2]:4242")
    verdict = Verdict(namer=True, missing=[(1, "node2")], answered=3)
    for key in ("ZOO_ATTEMPT", "ZOO_MAX_RESTARTS", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    report_failure(lost, True, verdict)
    assert capsys.readouterr().err.rstrip().endswith("the 3 surviving rank(s) stop (exit code 1)")  # no restarts
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "r")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "2")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    report_failure(lost, True, verdict)
    assert capsys.readouterr().err.rstrip().endswith("; torchrun --max-restarts restarts the job (1 of 2 left)")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    report_failure(lost, True, verdict)
    assert capsys.readouterr().err.rstrip().endswith(
        "; that was attempt 3 of 3: torchrun --max-restarts=2 spent, the job ends (resume=auto goes on from its "
        "newest checkpoint)")
