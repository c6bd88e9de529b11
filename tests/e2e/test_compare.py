"""`python -m zoo.compare` on two real runs: the table names exactly the config keys that
differ and the runs' results; the PNG of loss curves and throughput is written."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO
from zoo.compare import Run, differing_keys, labels, table

FAST = ["debug=fast", "logger=none", "trainer.sample_tokens=0", "trainer.eval_batches=1", "optim.warmup_steps=2",
        "trainer.global_batch_size=8", "trainer.max_steps=4", "trainer.log_every=1"]


def compare(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zoo.compare", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_differing_keys_only():
    a = Run("a", {"optim.lr": 0.001, "model.family": "gpt", "logger.tags": []}, {"final_loss": 1.0}, [])
    b = Run("b", {"optim.lr": 0.002, "model.family": "gpt", "logger.tags": [], "extra": 1}, {}, [])
    assert differing_keys([a, b]) == ["extra", "optim.lr"]
    text = table([a, b])
    assert "<unset>" in text and "model.family" not in text and "1.0000" in text


def test_runs_are_labelled_by_what_differs():
    cfg = {"parallel.tp": 1, "parallel.pp": 1, "parallel.dp": 2, "parallel.zero_stage": 1, "optim.lr": 0.001}
    a = Run("2026-12-01_10-00-00", cfg, {"tp": 1, "pp": 1, "dp": 2, "zero_stage": 1}, [])
    b = Run("2026-12-01_10-05-00", {**cfg, "parallel.tp": 2, "parallel.dp": 1}, {"tp": 2, "pp": 1, "dp": 1,
                                                                                  "zero_stage": 1}, [])
    assert labels([a, b]) == ["tp1-pp1-dp2_zero1", "tp2-pp1-dp1_zero1"]
    c = Run("2026-12-01_10-10-00", {**cfg, "optim.lr": 0.002}, a.summary, [])
    assert labels([a, c]) == ["lr=0.001", "lr=0.002"]
    assert labels([a, Run("other", cfg, {}, [])]) == ["2026-12-01_10-00-00", "other"]  # nothing differs
    assert table([a, b]).splitlines()[0].split() == ["tp1-pp1-dp2_zero1", "tp2-pp1-dp1_zero1"]  # the heads
    assert table([a, b], ["base", "tp"]).splitlines()[0].split() == ["base", "tp"]


def test_same_named_runs_are_told_apart_by_their_shortest_differing_path_ends():
    from zoo.compare import short_names

    assert short_names(["/x/exp/a/run", "/x/exp/b/run"]) == ["a/run", "b/run"]
    assert short_names(["/x/a/2026/run", "/x/b/2026/run"]) == ["a/2026/run", "b/2026/run"]


LONG = [f"model=llama model.size=tinyllama-1.1b parallel.tp={i} parallel.pp=2 optim.lr=3e-4 trainer.micro_batch_size={i}"
        for i in range(1, 5)]  # 96 characters each: four side by side would be wider than the figure


@pytest.mark.parametrize("heads", [None, LONG], ids=["labels", "long-labels"])
def test_the_legend_covers_no_curve_and_no_axis_label(heads):
    """#33 item 9: four labelled runs with evaluations; the legend lies outside both panels
    (their axes and their tick and axis labels), and inside the picture, also with labels too
    long for one row (#49: it was clipped at both edges)."""
    from zoo.compare import figure

    history = [{"step": s, "loss": 5.0 - s / 10, "tokens_per_s": 1000.0 + s, **({"eval_loss": 5.1 - s / 10}
                                                                              if s % 5 == 0 else {})} for s in range(1, 21)]
    runs = [Run(f"run{i}", {"optim.lr": i, "parallel.tp": i}, {"tp": i, "pp": 1, "dp": 1, "zero_stage": 1}, history)
            for i in range(1, 5)]
    fig = figure(runs, heads)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend = fig.legends[0].get_window_extent(renderer)
    assert len(fig.legends[0].get_texts()) == 8  # 4 runs and their evaluations, once
    for ax in fig.axes:
        assert not legend.overlaps(ax.get_tightbbox(renderer)), (legend, ax.get_tightbbox(renderer))
    assert legend.y0 >= 0 and legend.x0 >= 0 and legend.x1 <= fig.bbox.width  # inside the picture


def test_compare_two_real_runs(run_zoo, tmp_path):
    a = run_zoo(*FAST, "trainer.micro_batch_size=2")
    b = run_zoo(*FAST, "trainer.micro_batch_size=4", "optim.lr=0.002")
    png = tmp_path / "runs.png"
    out = compare(str(a.run_dir), str(b.run_dir), "--plot", str(png))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    config_rows = lines[lines.index("-- config (differing keys) --") + 1:lines.index("-- results --")]
    assert [row.split()[0] for row in config_rows] == ["optim.lr", "trainer.micro_batch_size"]
    assert config_rows[1].split()[1:] == ["2", "4"]
    results = {label: cells for label, *cells in (re.split(r"\s{2,}", row.strip())
                                                  for row in lines[lines.index("-- results --") + 1:])}
    assert results["final loss"] == [f"{a.summary['final_loss']:.4f}", f"{b.summary['final_loss']:.4f}"]
    assert {"tokens/s", "MFU", "peak memory GiB", "data wait share"} <= results.keys()
    assert "communication share" not in results  # one rank: nothing to communicate with
    assert lines[0].split() == ["lr=0.001", "micro_batch_size=2", "lr=0.002", "micro_batch_size=4"]
    assert lines[1].split() == ["run", a.run_dir.name, b.run_dir.name]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(png).shape
    assert (width, height) == (1200, 450)


def test_not_a_run_dir_is_one_line_and_exit_2(tmp_path):
    out = compare(str(tmp_path))
    assert out.returncode == 2 and "is not a run directory" in out.stderr and "Traceback" not in out.stderr
    out = compare(str(tmp_path), str(tmp_path), "--labels", "only-one")
    assert out.returncode == 2 and "--labels=only-one names 1 run(s) but 2 are compared" in out.stderr
