"""`python -m zoo.compare` on two real runs: the table names exactly the config keys that
differ and the runs' results; the PNG of loss curves and throughput is written."""
from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import REPO
from zoo.observe.compare import Run, differing_keys, labels, table

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
    assert "tp2-pp1-dp1_zero1" in table([a, b]).splitlines()[1]


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
    assert lines[1].split()[1:] == ["lr=0.001", "micro_batch_size=2", "lr=0.002", "micro_batch_size=4"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(png).shape
    assert (width, height) == (1200, 450)


def test_not_a_run_dir_is_one_line_and_exit_2(tmp_path):
    out = compare(str(tmp_path))
    assert out.returncode == 2 and "is not a run directory" in out.stderr and "Traceback" not in out.stderr
