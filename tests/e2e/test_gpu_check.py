"""benchmarks/gpu_check.py keeps its deadline and returns what ran (#51): its CPU mode runs the
same sub-runs at the tiny size, here with one sub-run replaced by a process that fails and one
by a process that ignores SIGTERM and hangs; the check ends within its deadline, and its
output folder holds progress.txt, the finished sub-runs' files and a results.md naming the
failed and the hung one. A row that cannot be read leaves the others in results.md."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time

from tests.conftest import REPO

DEADLINE_S = 80


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations there
    spec.loader.exec_module(module)
    return module


def test_the_check_keeps_its_deadline_and_returns_what_ran(tmp_path, zoo_cache):
    out = tmp_path / "out"
    env = {**os.environ, "ZOO_CACHE": str(zoo_cache),
           "ZOO_GPU_CHECK_STANDIN": "gpt2-small-bf16=fail,gpt2-small-fp16=hang"}
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--cpu", "--deadline", str(DEADLINE_S),
                           "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=DEADLINE_S + 60)
    took = time.monotonic() - t0
    assert took < DEADLINE_S + 5, (took, done.stdout[-2000:])
    assert done.returncode == 1, done.stdout[-2000:]  # sub-runs not ok
    progress = (out / "progress.txt").read_text()
    assert "preflight: python" in progress and "torch 2." in progress
    assert "gpt2-small-bf16: exit 7" in progress and "| stand-in: failing" in progress  # the failure's log tail
    assert "gpt2-small-fp16: killed at its" in progress
    rows = {line.split("|")[1].strip(): line for line in (out / "results.md").read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| sub-run")}
    assert " ok " in rows["tiny-gpt-bf16"] and json.loads((out / "tiny-gpt-bf16" / "summary.json").read_text())["steps"] == 3
    assert all((out / "tiny-gpt-bf16" / name).is_file() for name in ("log.txt", "metrics.jsonl", "config.yaml"))
    assert "exit 7" in rows["gpt2-small-bf16"] and "killed at its" in rows["gpt2-small-fp16"]
    assert "stand-in: hanging" in (out / "gpt2-small-fp16" / "log.txt").read_text()
    skipped = [name for name, row in rows.items() if "skipped" in row]
    assert skipped and "batch-finder" in rows  # the rest: skipped at the deadline, each with its line
    leftover = subprocess.run(["pgrep", "-f", "stand-in: hanging"], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", "the hung stand-in outlived its kill"


def test_a_row_that_cannot_be_read_leaves_the_others(tmp_path):
    check_module = _script()
    check = check_module.Check(tmp_path, 60, cpu=True, standins={})
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "summary.json").write_text("{not json")
    check.outcomes = [check_module.Outcome("broken", "ok", 3.0), check_module.Outcome("later", "exit 2", 1.0)]
    check.write_results()
    text = (tmp_path / "results.md").read_text()
    assert "| broken | ok | 3 | row failed: JSONDecodeError" in text and "| later | exit 2 | 1 |" in text
