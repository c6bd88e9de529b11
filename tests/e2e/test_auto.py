"""parallel=auto on real runs: 4 planned ranks checkpoint, 2 planned ranks resume from the
layout-free checkpoint with the same global batch, say what was re-planned and continue the
uninterrupted reference run's losses (#37 items 1-2)."""
from __future__ import annotations

import json
import re

import torch
import yaml

from tests.e2e.checkpoint_runs import FAST, after, losses_by_step

pytestmark = __import__("pytest").mark.e2e


def test_a_planned_run_resumed_on_fewer_ranks_is_re_planned_and_continues(run_zoo, tmp_path, checkpoint_reference):
    run_dir = tmp_path / "auto"
    first = run_zoo(*FAST, "parallel=auto", "parallel.world_size=4", "trainer.max_steps=4", "checkpoint.every=2",
                    run_dir=run_dir)
    planned = [line for line in first.stdout.splitlines() if line.startswith("zoo: parallel=auto: tp=")]
    assert len(planned) == 1 and "planned for 4 rank(s)" in planned[0], first.stdout
    ran = json.loads((run_dir / "summary.json").read_text())
    assert ran["world_size"] == 4
    resumed = run_zoo(*FAST, "parallel=auto", "parallel.world_size=2", "trainer.max_steps=8", "resume=auto",
                      run_dir=run_dir)
    recorded = yaml.safe_load((run_dir / "config.yaml").read_text())["parallel"]
    assert recorded["auto"] is True and recorded["tp"] * recorded["pp"] * recorded["dp"] == 2, recorded
    before, now = (re.search(r"^zoo: layout (\S+):", r.stdout, re.M).group(1) for r in (first, resumed))
    assert f"zoo: re-planned {before} -> {now}: the job now has 2 rank(s) on 1 node(s) (the run had 4)" \
        in resumed.stdout, resumed.stdout
    assert "at step 4" in resumed.stdout and resumed.summary["world_size"] == 2
    got, want = after(losses_by_step(resumed), 4), after(checkpoint_reference, 4)
    steps = sorted(got)
    assert steps == [5, 6, 7, 8]
    torch.testing.assert_close(torch.tensor([got[s] for s in steps]), torch.tensor([want[s] for s in steps]),
                               rtol=1e-5, atol=0)
