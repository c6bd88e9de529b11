"""plan.measure on the cpu cluster preset (this machine): the planner's top layouts run
through python -m zoo.train, predicted beside measured (#37 item 3)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.e2e


def test_the_top_layouts_run_here_and_are_ranked_by_measurement(zoo_cache):
    import os

    env = {**os.environ, "ZOO_CACHE": str(zoo_cache), "WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "-m", "zoo.plan", "model=gpt", "model.size=tiny", "cluster=cpu",
                           "precision=fp32", "trainer.global_batch_size=8", "plan.measure=2", "plan.measure_steps=3"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "Measured here (2 layout(s), 3 steps each through python -m zoo.train):" in out, out[-3000:]
    measured = out.split("Measured here", 1)[1]
    rows = [line.split() for line in measured.splitlines() if line.strip()[:2] in ("1 ", "2 ") and "tp=" in line]
    assert len(rows) == 2
    for r in rows:
        step_ratio, mem_ratio = float(r[-4]), float(r[-1])
        assert 0.2 < step_ratio < 5 and 0.2 < mem_ratio < 10, r  # measured: a real run's numbers, near the model
    assert "by measurement: #" in out and "train with: python -m zoo.train model=gpt" in out
