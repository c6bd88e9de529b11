"""plan.measure's refusals (one line, before anything runs) and its report's arithmetic;
the runs themselves are tests/e2e/test_plan_measure.py."""
from __future__ import annotations

import pytest

from tests.unit.plan.test_cli import plan_cfg, run
from zoo.plan.measure import Measured, check_measure, report
from zoo.plan.search import make_plan

CPU = ("model.size=tiny", "cluster=cpu", "precision=fp32", "trainer.global_batch_size=8")


@pytest.mark.parametrize("overrides, message", [
    (("plan.measure=0",), "plan.measure=0 must be positive"),
    (("plan.measure=2", "cluster.nodes=2"), "plan.measure=2 runs the layouts on this machine: the cluster must be "
                                            "it (cluster.nodes=2"),
    (("plan.measure=999",), "plan.measure=999 but "),
    (("plan.measure=1", "plan.measure_steps=1"), "plan.measure_steps=1 must be at least 2"),
    (("plan.measure=1", "plan.format=json"), "plan.measure prints a table: use it with plan.format=text"),
])
def test_what_plan_measure_cannot_do_here_is_one_line(overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run(plan_cfg(*CPU, *overrides))


def test_no_measure_runs_nothing():
    assert check_measure(make_plan(plan_cfg(*CPU)), 0) == 0


def test_the_report_ranks_by_measurement_and_gives_the_ratios():
    plan = make_plan(plan_cfg(*CPU))
    a, b = [c for c in plan.candidates if c.fits][:2]
    runs = [Measured(a, step_s=2 * a.time.total, peak_bytes=a.mem.total),
            Measured(b, step_s=a.time.total, peak_bytes=3 * b.mem.total)]
    text = report(plan, runs, 6)
    rows = [line.split() for line in text.splitlines() if line.strip()[:2] in ("1 ", "2 ")]
    assert [r[-4] for r in rows] == ["2.00", f"{a.time.total / b.time.total:.2f}"]
    assert [r[-1] for r in rows] == ["1.00", "3.00"]
    assert "by measurement: #2, #1; the planner's pick (#1) measured +100% against the fastest (#2" in text
