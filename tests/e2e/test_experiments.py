"""Every experiment file runs one step through the real entry point (it starts up to 8 local
processes: a few minutes for all of them on a small CPU machine)."""
from __future__ import annotations

import pytest
import yaml

from tests.conftest import REPO

CONF = REPO / "conf"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))


def expected_layout(name: str) -> dict:
    """tp, pp and dp as the experiment's parallel option sets them (a local run: dp null is 1)."""
    body = yaml.safe_load((CONF / "experiment" / f"{name}.yaml").read_text())
    picks = {k[len("override /"):]: v for entry in body["defaults"] for k, v in entry.items()}
    parallel = yaml.safe_load((CONF / "parallel" / f"{picks['parallel']}.yaml").read_text())
    parallel = parallel.get("parallel", parallel)  # a _global_ option nests its keys under parallel:
    parallel.update(body.get("parallel") or {})
    return {"tp": parallel.get("tp", 1), "pp": parallel.get("pp", 1), "dp": parallel.get("dp") or 1}


@pytest.mark.e2e
@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_runs_one_step(run_zoo, name):
    run = run_zoo(f"experiment={name}", "trainer.max_steps=1", "trainer.eval_batches=1", "trainer.sample_tokens=0",
                  "logger=none")
    assert run.returncode == 0
    summary = run.summary
    assert {key: summary[key] for key in ("tp", "pp", "dp")} == expected_layout(name), summary
    assert summary["steps"] == 1
