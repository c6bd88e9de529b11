"""Hydra multirun with the local launcher: every job starts its own ranks from the process's
original environment, so a sweep over layouts and seeds runs each job as asked."""
from __future__ import annotations

import json
import sys

import pytest
import yaml

pytestmark = pytest.mark.e2e


def test_a_sweep_over_layouts_and_seeds_runs_each_job_as_asked(run_zoo, tmp_path):
    sweep = tmp_path / "sweep"
    run = run_zoo(run_dir=sweep, cmd=[sys.executable, "-m", "zoo.train", "-m", "parallel=ddp,zero1",
                                      "trainer.seed=1,2", "debug=fast", "logger=none", "trainer.max_steps=1",
                                      "trainer.sample_tokens=0", "trainer.eval_batches=1", "trainer.progress=false",
                                      f"hydra.sweep.dir={sweep}"])
    assert "Traceback" not in run.stderr
    jobs = sorted(d for d in sweep.iterdir() if d.is_dir())
    seen = []
    for job in jobs:
        summary = json.loads((job / "summary.json").read_text())
        config = yaml.safe_load((job / "config.yaml").read_text())
        seen.append((summary["world_size"], summary["zero_stage"], config["trainer"]["seed"]))
    assert seen == [(1, 0, 1), (1, 0, 2), (2, 1, 1), (2, 1, 2)], seen


def test_a_sweep_over_experiments_runs_each_pinned_combination(run_zoo, tmp_path):
    sweep = tmp_path / "experiments"
    run_zoo(run_dir=sweep, cmd=[sys.executable, "-m", "zoo.train", "-m", "experiment=gpt_tiny_zero2,bert_tiny_tp",
                                "logger=none", "trainer.max_steps=1", "trainer.sample_tokens=0", "trainer.eval_batches=1",
                                "trainer.progress=false", f"hydra.sweep.dir={sweep}"])
    seen = []
    for job in sorted(d for d in sweep.iterdir() if d.is_dir()):
        summary = json.loads((job / "summary.json").read_text())
        config = yaml.safe_load((job / "config.yaml").read_text())
        seen.append((config["experiment"], config["model"]["family"], summary["tp"], summary["zero_stage"]))
    assert seen == [("gpt_tiny_zero2", "gpt", 1, 2), ("bert_tiny_tp", "bert", 2, 1)], seen  # tp's preset: ZeRO-1
