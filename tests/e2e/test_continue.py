"""The "continue" line a run ends with continues it: the resume takes the run's own config.yaml
with the command line on top, so the line's three keys are all it needs; a finished run with no
checkpoint is never started afresh over, and is not offered the line."""
from __future__ import annotations

import re
import shlex

import yaml

from tests.e2e.checkpoint_runs import FAST, losses_by_step


def _continue_line(stdout: str):
    found = re.findall(r"(python -m zoo\.train hydra\.run\.dir=\S+ resume=auto trainer\.max_steps=N)", stdout)
    return shlex.split(found[0]) if found else None


def test_the_printed_continue_line_continues_a_llama_run_with_its_own_config(run_zoo, tmp_path):
    first = run_zoo(*FAST, "model=llama", "parallel=zero1", "parallel.dp=2", "trainer.max_steps=2",
                    "checkpoint.every=2", "optim.lr=3e-3", run_dir=tmp_path / "run")
    line = _continue_line(first.stdout)
    assert line is not None, first.stdout[-2000:]
    argv = [a.replace("trainer.max_steps=N", "trainer.max_steps=4") for a in line[3:] if not a.startswith("hydra.")]
    resumed = run_zoo(*argv, run_dir=first.run_dir)  # hydra.run.dir=RUN resume=auto trainer.max_steps=4
    assert "resumed from" in resumed.stdout and "at step 2" in resumed.stdout
    config = yaml.safe_load((first.run_dir / "config.yaml").read_text())
    assert (config["model"]["family"], config["optim"]["lr"], config["parallel"]["zero_stage"]) == ("llama", 3e-3, 1)
    assert (config["trainer"]["max_steps"], config["resume"]) == (4, "auto")
    assert resumed.summary["steps"] == 4 and resumed.summary["dp"] == 2
    assert sorted(losses_by_step(resumed)) == [1, 2, 3, 4]  # the step numbers go on in the same metrics
    # the end line counts the steps this start ran, not the run's total
    assert resumed.summary["steps_run"] == 2 and "zoo: run: 2 steps (steps 3-4), " in resumed.stdout
    # the config the resume changed is kept beside the new one
    previous = yaml.safe_load((first.run_dir / "config.previous.yaml").read_text())
    assert (previous["trainer"]["max_steps"], previous["resume"]) == (2, None)
    _a_resume_at_the_end_is_refused_and_changes_nothing(run_zoo, first.run_dir)
    _a_start_that_fails_in_its_first_step_leaves_the_runs_config(run_zoo, first.run_dir)


def _a_start_that_fails_in_its_first_step_leaves_the_runs_config(run_zoo, run_dir):
    """#50 item 8: a resume onto another layout whose first step fails (an allocation no host
    has) leaves config.yaml, its previous copy and the topology as they were, so the next
    resume=auto takes the run's own config, not the failed attempt's layout and interval."""
    kept = {name: (run_dir / name).read_bytes() for name in ("config.yaml", "config.previous.yaml", "topology.txt")}
    failed = run_zoo("resume=auto", "trainer.max_steps=6", "parallel=tp", "parallel.dp=1", "checkpoint.every=1",
                     run_dir=run_dir, check=False, env={"ZOO_TEST_BALLAST_MB": "0:100000000"})  # 100 TB
    assert failed.returncode == 1 and "resumed from" in failed.stdout, failed.stderr[-2000:]
    assert {name: (run_dir / name).read_bytes() for name in kept} == kept


def _a_resume_at_the_end_is_refused_and_changes_nothing(run_zoo, run_dir):
    """resume=auto without a new trainer.max_steps on a run that reached it: one line naming the
    step and the key, exit 2, and every file of the run as it was, byte for byte."""
    files = sorted(p for p in run_dir.rglob("*") if p.is_file())
    before = {p: p.read_bytes() for p in files}
    again = run_zoo("resume=auto", run_dir=run_dir, check=False)
    assert again.returncode == 2 and "Traceback" not in again.stderr, again.stderr[-2000:]
    errors = [line for line in again.stderr.splitlines() if line.startswith("zoo: error:")]
    assert len(errors) == 1, again.stderr
    assert "the run is at step 4" in errors[0] and "trainer.max_steps=4 leaves no step to train" in errors[0]
    assert "trainer.max_steps=N, N > 4" in errors[0]
    assert sorted(p for p in run_dir.rglob("*") if p.is_file()) == files
    assert {p: p.read_bytes() for p in files} == before
    fewer = run_zoo("resume=auto", "trainer.max_steps=3", run_dir=run_dir, check=False)  # below the step: the same
    assert fewer.returncode == 2 and "the run is at step 4" in fewer.stderr


def test_a_finished_run_without_a_checkpoint_is_not_started_over_and_not_offered_the_line(run_zoo, tmp_path):
    done = run_zoo(*FAST, "trainer.max_steps=1", run_dir=tmp_path / "run")
    assert _continue_line(done.stdout) is None and "zoo.export" in done.stdout
    before = {name: (done.run_dir / name).read_bytes() for name in ("summary.json", "model.safetensors", "config.yaml")}
    again = run_zoo("resume=auto", "trainer.max_steps=3", run_dir=done.run_dir, check=False)
    assert again.returncode == 2 and "Traceback" not in again.stderr
    errors = [line for line in again.stderr.splitlines() if line.startswith("zoo: error:")]
    assert len(errors) == 1 and "no checkpoint to continue from" in errors[0] and "checkpoint.every=0" in errors[0]
    assert {name: (done.run_dir / name).read_bytes() for name in before} == before
