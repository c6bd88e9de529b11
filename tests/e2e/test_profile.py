"""trainer.profile on real runs: a pipeline whose partition is unbalanced is named with its
slower stage and a balanced one is not; tensor parallelism's all-reduce time agrees with the
monitor's comm_share; a data-parallel run's gradient all-reduce shows; the traces are Chrome
traces with the step ranges and the rank's coordinates."""
from __future__ import annotations

import json

import pytest

from zoo.observe.profiler import STAGE_IMBALANCE

WINDOW = ["debug=fast", "logger=none", "trainer.sample_tokens=0", "trainer.max_steps=4", "trainer.log_every=1",
          "trainer.profile.start=2", "trainer.profile.steps=3"]
PIPE = [*WINDOW, "parallel=pp", "trainer.global_batch_size=12", "model.n_layer=4"]


def test_an_unbalanced_pipeline_stage_is_named_and_the_traces_are_chrome_traces(run_zoo):
    """partition_method=parameters puts the 524k-parameter embedding alone with one block on
    stage 0 and three blocks with the output head on stage 1: stage 1 is the busier one (2.4x
    measured here; a CI machine measured 1.17x, so the size of the gap is not asserted, only
    that it is read the right way round and that the diagnosis follows the threshold; the
    diagnosis's wording is tested on synthetic rows in tests/unit/observe/test_profile.py)."""
    run = run_zoo(*PIPE, "parallel.partition_method=parameters")
    summary = json.loads((run.run_dir / "profile" / "summary.json").read_text())
    ratio = summary["stage_compute_max_over_min"]
    assert summary["busiest_stage"] == 1 and ratio > 1.0, summary
    assert summary["step_ms_max_over_min"] < 1.05, summary  # the stages run in lockstep: one window, one step time
    per_stage = summary["stage_compute_ms"]
    assert ratio == pytest.approx(per_stage["1"] / per_stage["0"], rel=1e-6)
    named = [d for d in summary["diagnoses"] if d.startswith("stage 1 computes") and "balance the partition" in d]
    assert len(named) == (1 if ratio >= STAGE_IMBALANCE else 0), summary
    assert ("zoo: diagnosis: stage 1 computes" in run.stdout) == bool(named)
    assert "zoo: profile of steps 2-4 on 2 rank(s)" in run.stdout
    for rank in (0, 1):
        trace = json.loads((run.run_dir / "profile" / f"rank{rank}.json").read_text())
        assert trace["zoo"] == {"rank": rank, "tp": 0, "pp": rank, "dp": 0, "host": trace["zoo"]["host"]}
        steps = [e for e in trace["traceEvents"] if e.get("name") == "zoo.step"]
        assert len(steps) == 3
        kinds = {e["name"] for e in trace["traceEvents"] if str(e.get("name", "")).startswith("zoo.")}
        assert {"zoo.forward", "zoo.backward", "zoo.send/recv", "zoo.optimizer"} <= kinds, kinds
    row = summary["ranks"][0]
    assert sum(row["ms"].values()) == pytest.approx(row["step_ms"], rel=1e-6)


def test_a_balanced_pipeline_is_not_named(run_zoo):
    """uniform: embedding and two blocks, then two blocks, the LayerNorm and the head (1.1x)."""
    run = run_zoo(*PIPE, "parallel.partition_method=uniform")
    summary = json.loads((run.run_dir / "profile" / "summary.json").read_text())
    assert summary["stage_compute_max_over_min"] < STAGE_IMBALANCE and summary["diagnoses"] == [], summary
    assert "zoo: diagnosis: stage" not in run.stdout


def test_tensor_parallel_all_reduce_agrees_with_the_monitor(run_zoo):
    run = run_zoo(*WINDOW, "parallel=tp", "trainer.global_batch_size=8")
    summary = json.loads((run.run_dir / "profile" / "summary.json").read_text())
    comm = [m["comm_share"] for m in run.metrics if m.get("step") in (2, 3, 4) and "comm_share" in m]
    for row in summary["ranks"]:
        share = sum(row["ms"][k] for k in ("all-reduce", "all-gather", "reduce-scatter", "broadcast",
                                           "other comm")) / row["step_ms"]
        assert share == pytest.approx(sum(comm) / len(comm), abs=0.06), (share, comm)
        assert row["ms"]["all-reduce"] > 0.2 * row["step_ms"]  # tp's activations, forward and backward
    # the rank grid with each rank's device, and its picture (a multi-rank run writes one)
    grid = (run.run_dir / "topology.txt").read_text()
    assert "rank  dp  pp  tp  host  device" in grid and grid.splitlines()[3].endswith("  cpu")
    assert (run.run_dir / "topology.png").stat().st_size > 1000 and "topology.png (its picture)" in run.stdout


def test_a_data_parallel_runs_gradient_all_reduce_shows(run_zoo):
    run = run_zoo(*WINDOW, "parallel=zero1", "trainer.global_batch_size=8")
    summary = json.loads((run.run_dir / "profile" / "summary.json").read_text())
    assert [r["dp"] for r in summary["ranks"]] == [0, 1]
    assert all(r["ms"]["all-reduce"] > 0 and r["ms"]["backward"] > 0 for r in summary["ranks"])
    from zoo.profile import main

    main([str(run.run_dir)])  # the breakdown again, from the run directory
