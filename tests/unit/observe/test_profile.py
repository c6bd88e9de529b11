"""The profiler's step breakdown, the load-balance reading, the zoo.profile command and
trainer.profile's refusals, on ranges and rows made here (the real windows: tests/e2e/test_profile.py)."""
from __future__ import annotations

import json

import pytest

from zoo.observe.breakdown import merged, minus, step_breakdown
from zoo.observe.profiler import summarize, table_lines


def test_interval_arithmetic():
    assert merged([(5, 6), (0, 2), (1, 3)]) == [(0, 3), (5, 6)]
    assert minus([(0, 10)], [(2, 3), (5, 7)]) == [(0, 2), (3, 5), (7, 10)]
    assert minus([(0, 2), (4, 6)], [(1, 5)]) == [(0, 1), (5, 6)]
    assert minus([(0, 2)], []) == [(0, 2)]


def test_each_moment_of_a_step_counts_once_for_the_innermost_kind():
    """Two steps of 1 ms: an all-reduce inside the backward is communication, the part of a
    collective after the step's end is not counted, what nothing covers is idle."""
    ranges = [("zoo.step", 0, 1000), ("zoo.data", 0, 50), ("zoo.forward", 50, 300), ("zoo.backward", 300, 800),
              ("zoo.comm:all_reduce", 600, 700), ("zoo.optimizer", 800, 900), ("zoo.comm:_all_gather_base", 850, 880),
              ("zoo.step", 1000, 2000), ("zoo.forward", 1000, 1300), ("zoo.comm:all_reduce", 1950, 2100),
              ("aten::mm", 0, 2000)]  # the profiler's own ops are not a kind
    b = step_breakdown(ranges)
    assert b["steps"] == 2 and b["step_ms"] == pytest.approx(1.0)
    ms = b["ms"]
    assert ms["data"] == pytest.approx(0.025) and ms["forward"] == pytest.approx(0.275)
    assert ms["backward"] == pytest.approx(0.2) and ms["optimizer"] == pytest.approx(0.035)
    assert ms["all-reduce"] == pytest.approx(0.075) and ms["all-gather"] == pytest.approx(0.015)
    assert sum(ms.values()) == pytest.approx(b["step_ms"])
    assert ms["idle"] == pytest.approx(1.0 - 0.025 - 0.275 - 0.2 - 0.035 - 0.075 - 0.015)


def test_context_parallel_gathers_count_as_cp_communication():
    """zoo.parallel.context marks its gathers `zoo.cp`: the all-gather inside is cp's, not dp's."""
    b = step_breakdown([("zoo.step", 0, 100), ("zoo.forward", 0, 40), ("zoo.cp", 10, 20),
                        ("zoo.comm:all_gather_single", 11, 19), ("zoo.backward", 40, 100),
                        ("zoo.cp", 50, 60), ("zoo.comm:reduce_scatter_single", 51, 59),
                        ("zoo.comm:all_gather_single", 80, 90)])
    ms = b["ms"]
    assert ms["cp comm"] == pytest.approx(0.02) and ms["all-gather"] == pytest.approx(0.01)
    assert ms["reduce-scatter"] == 0 and ms["forward"] == pytest.approx(0.03)


def test_pipeline_send_and_receive_count_before_the_collective_they_use():
    b = step_breakdown([("zoo.step", 0, 100), ("zoo.send/recv", 10, 60), ("zoo.comm:broadcast", 20, 50),
                        ("zoo.comm:barrier", 70, 80)])
    assert b["ms"]["send/recv"] == pytest.approx(0.05) and b["ms"]["broadcast"] == 0
    assert b["ms"]["other comm"] == pytest.approx(0.01)
    assert step_breakdown([("zoo.forward", 0, 1)])["steps"] == 0  # no step range: nothing to say


def test_a_window_between_barriers_is_the_step_time_of_every_rank_in_lockstep():
    """Two pipeline stages over the same barrier-bounded window (2 steps, 0-4000 us): the first
    stage's steps end early (it waits at the closing barrier), the last's start late (its
    trainer's work between steps); both read 2 ms a step, the gaps counted idle (#33 item 10:
    they read 1.37x apart when each summed its own step ranges)."""
    first = [("zoo.sync", -50, 0), ("zoo.step", 0, 1500), ("zoo.forward", 0, 500), ("zoo.step", 2000, 3400),
             ("zoo.backward", 2000, 3000), ("zoo.sync", 3400, 4000)]
    last = [("zoo.sync", -10, 0), ("zoo.step", 300, 2000), ("zoo.forward", 300, 1300), ("zoo.step", 2300, 4000),
            ("zoo.backward", 2300, 3800), ("zoo.sync", 3990, 4000)]
    a, b = step_breakdown(first), step_breakdown(last)
    assert a["step_ms"] == b["step_ms"] == pytest.approx(2.0)
    assert a["ms"]["idle"] == pytest.approx(2.0 - 0.25 - 0.5) and b["ms"]["idle"] == pytest.approx(2.0 - 0.5 - 0.75)
    assert sum(a["ms"].values()) == pytest.approx(a["step_ms"])
    alone = step_breakdown([r for r in first if r[0] != "zoo.sync"])  # one rank: its own step ranges
    assert alone["step_ms"] == pytest.approx((1500 + 1400) / 2 / 1e3)


def _row(rank, pp, dp, compute_ms, tp=0, step_ms=100.0):
    ms = {k: 0.0 for k in ("forward", "backward", "optimizer", "all-reduce", "all-gather", "reduce-scatter",
                           "send/recv", "broadcast", "other comm", "data", "idle")}
    ms.update(forward=compute_ms / 3, backward=2 * compute_ms / 3, idle=step_ms - compute_ms)
    return {"rank": rank, "tp": tp, "pp": pp, "dp": dp, "host": "h", "steps": 3, "step_ms": step_ms, "ms": ms,
            "window_s": 1.0, "plain_step_ms": 90.0, "write_s": 0.5, "trace": f"rank{rank}.json"}


def test_an_unbalanced_pipeline_names_the_stage_and_a_balanced_one_is_quiet():
    rows = [_row(0, 0, 0, 30), _row(1, 1, 0, 48), _row(2, 0, 1, 30), _row(3, 1, 1, 48)]
    s = summarize(rows, first=3, last=5, partition_method="parameters")
    assert s["busiest_stage"] == 1 and s["stage_compute_max_over_min"] == pytest.approx(1.6)
    assert s["diagnoses"] == ["stage 1 computes 1.6x stage 0 (48 vs 30 ms a step): balance the partition (now "
                              "parallel.partition_method=parameters; try uniform (equal layer counts), or type:REGEX "
                              "to balance the layers whose classes match)"]
    balanced = summarize([_row(0, 0, 0, 40), _row(1, 1, 0, 44)], first=3, last=5, partition_method="uniform")
    assert balanced["diagnoses"] == [] and balanced["stage_compute_max_over_min"] == pytest.approx(1.1)
    lines = table_lines(s, where="RUN/profile")
    assert lines[0] == "zoo: profile of steps 3-5 on 4 rank(s), ms a step (share of the step); traces in RUN/profile"
    assert lines[1].split() == ["rank", "tp", "pp", "dp", "step", "forward", "backward", "idle"]
    assert lines[3].split()[:7] == ["1", "0", "1", "0", "100.0", "16.0", "(16%)"]
    assert "compute per pipeline stage: stage 0 30.0 ms, stage 1 48.0 ms" in lines[-2]
    assert "profiler overhead +11%" in lines[-1]


def test_a_replica_with_more_work_is_named():
    s = summarize([_row(0, 0, 0, 30), _row(1, 0, 1, 45)], first=2, last=3, partition_method="parameters")
    assert s["diagnoses"][0].startswith("data-parallel replica 1 computes 1.5x replica 0")


def test_the_profile_command_prints_one_run_or_two_and_refuses_what_did_not_profile(tmp_path, capsys):
    from zoo.profile import main

    summary = summarize([_row(0, 0, 0, 30), _row(1, 1, 0, 48)], first=2, last=3, partition_method="parameters")
    (tmp_path / "a" / "profile").mkdir(parents=True)
    (tmp_path / "a" / "profile" / "summary.json").write_text(json.dumps(summary))
    main([str(tmp_path / "a")])
    out = capsys.readouterr().out
    assert "zoo: profile of steps 2-3 on 2 rank(s)" in out and "zoo: diagnosis: stage 1 computes 1.6x" in out
    main([str(tmp_path / "a"), str(tmp_path / "a" / "profile" / "summary.json")])
    assert "forward                           13.0      13.0   1.00x" in capsys.readouterr().out
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "config.yaml").write_text("{}")
    for argv, said in ([str(tmp_path / "plain")], "is a run that did not profile"), \
                      ([str(tmp_path / "nope")], "no profile summary here"), \
                      ([str(tmp_path / "a")] * 3, "3 runs given; give one"):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and said in err and len(err.strip().splitlines()) == 1, err


def _cfg(*overrides):
    from tests.unit.config.test_config import composed

    return composed(*overrides)


def test_profile_settings_that_cannot_work_are_refused_with_the_fix(tmp_path):
    from zoo.config.paths import _writable
    from zoo.config.ranges import check_ranges
    from zoo.run.errors import ConfigError

    cfg = _cfg("trainer.max_steps=10", "trainer.profile.start=9", "trainer.profile.steps=3")
    with pytest.raises(ConfigError, match=r"profiles steps 9-11, beyond trainer.max_steps=10: set "
                                          r"trainer.profile.start=8, or raise trainer.max_steps to at least 11"):
        check_ranges(cfg)
    with pytest.raises(ConfigError, match=r"trainer.profile.steps=0 must be"):
        check_ranges(_cfg("trainer.profile.start=2", "trainer.profile.steps=0"))
    check_ranges(_cfg("trainer.max_steps=10", "trainer.profile.start=8", "trainer.profile.steps=3"))
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"trainer.profile.dir=.*/file/traces is not a writable directory"):
        _writable("trainer.profile.dir", str(tmp_path / "file" / "traces"))
    _writable("trainer.profile.dir", str(tmp_path / "new" / "traces"))
    from zoo.config.paths import check_paths
    from zoo.families.registry import family

    empty = _cfg("trainer.profile.start=2", "trainer.profile.dir=")
    with pytest.raises(ConfigError, match="trainer.profile.dir is empty: give a directory for the traces"):
        check_paths(empty, family(empty.model.family))
    assert not (tmp_path / "new").exists()  # what the check made, it removed again


def test_memory_profiling_without_cuda_is_a_warning():
    from zoo.config.validate import validate
    from zoo.parallel.topology import Layout

    warnings = validate(_cfg("trainer.profile.start=2", "trainer.profile.memory=true"), Layout(1, 1, 1, 0),
                        cuda_available=False)
    assert any(w.startswith("trainer.profile.memory=true records CUDA's allocator") for w in warnings)
