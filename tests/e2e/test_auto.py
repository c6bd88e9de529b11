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


def test_plan_measure_runs_the_top_layouts_here_and_trains_with_the_fastest(run_zoo, tmp_path):
    run_dir = tmp_path / "measured"
    run = run_zoo(*FAST, "parallel=auto", "parallel.world_size=2", "plan.measure=2", "plan.measure_steps=3",
                  "trainer.max_steps=2", run_dir=run_dir)
    out = run.stdout
    assert "zoo: parallel=auto: running the planner's top 2 layouts here for 3 steps each (plan.measure)" in out, out
    picked = re.search(r"^zoo: parallel=auto: tp=(\d+) pp=(\d+) dp=(\d+) zero_stage=(\d+), micro-batch (\d+)", out, re.M)
    said = re.search(r"^zoo: parallel=auto: the fastest of the planner's top 2 measured here \(3 steps each\): "
                     r"([\d.]+) s a step(?: against ([\d.]+) s for the planner's pick \(tp=\d+ pp=\d+ dp=\d+ z\d "
                     r"mb=\d+ acc=\d+\)|, the planner's own pick \(the next ([\d.]+) s\))$", out, re.M)
    assert picked and said, out
    fastest, other = float(said.group(1)), float(said.group(2) or said.group(3))
    assert 0 < fastest <= other  # the one trained is the faster of the two measured
    recorded = yaml.safe_load((run_dir / "config.yaml").read_text())
    tp, pp, dp, zero, micro = map(int, picked.groups())
    assert (recorded["parallel"]["tp"], recorded["parallel"]["pp"], recorded["parallel"]["dp"],
            recorded["parallel"]["zero_stage"]) == (tp, pp, dp, zero)
    assert recorded["trainer"]["global_batch_size"] == 8 and run.summary["world_size"] == 2
    if pp == 1:
        assert recorded["trainer"]["micro_batch_size"] == micro
