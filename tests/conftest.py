"""Shared fixtures: running the real entry point in a subprocess, with one data cache per
test session (the tokenizer is trained once) and one CPU thread per rank."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TIERS = {"e2e": "e2e", "slurm": "slurm"}  # folder under tests/ -> marker


def pytest_collection_modifyitems(items):
    """Mark each test by its tier folder, so `-m "not e2e"` and `-m slurm` select by tier too."""
    for item in items:
        parts = Path(str(item.fspath)).relative_to(REPO / "tests").parts
        if parts and parts[0] in TIERS:
            item.add_marker(getattr(pytest.mark, TIERS[parts[0]]))


@pytest.fixture(scope="session")
def zoo_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("zoo_cache")


class Run:
    def __init__(self, proc: subprocess.CompletedProcess, run_dir: Path):
        self.proc, self.run_dir = proc, run_dir
        self.returncode, self.stdout, self.stderr = proc.returncode, proc.stdout, proc.stderr

    @property
    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    @property
    def metrics(self) -> list:
        return [json.loads(l) for l in (self.run_dir / "metrics.jsonl").read_text().splitlines()]

    def losses(self) -> list:
        return [m["loss"] for m in self.metrics]


@pytest.fixture(scope="session")
def run_zoo(tmp_path_factory, zoo_cache):
    """run_zoo(*overrides, module="zoo.train", check=True, run_dir=None, env=None) -> Run"""
    runs = tmp_path_factory.mktemp("runs")
    counter = iter(range(10**6))

    def run(*overrides: str, module: str = "zoo.train", check: bool = True, run_dir: Path | None = None,
            env: dict | None = None, timeout: int = 600, cmd: list | None = None, cwd: Path = REPO) -> Run:
        run_dir = run_dir or runs / f"run{next(counter)}"
        # wandb is the default logger; tests that are not about tracking turn it off.
        full_env = {**os.environ, "ZOO_CACHE": str(zoo_cache), "OMP_NUM_THREADS": "1",
                    "PYTHONUNBUFFERED": "1", "WANDB_MODE": "disabled", **(env or {})}
        argv = cmd or [sys.executable, "-m", module, f"hydra.run.dir={run_dir}", "trainer.progress=false",
                       *overrides]
        proc = subprocess.run(argv, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)
        result = Run(proc, run_dir)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}"
                                 f"\n--- stderr\n{proc.stderr[-6000:]}")
        return result

    return run
