"""One run per run directory: a second run (or a resume) of a directory whose run is going is
refused at once naming the holder; a killed run's lock is taken over; a finished run leaves
no lock behind."""
from __future__ import annotations

import signal
import socket

import psutil
import pytest

from tests.e2e.test_failures import FAST, start, wait_for_training

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("layout", [[], ["parallel=zero1"]])
def test_a_running_directory_is_refused_and_a_killed_runs_lock_taken_over(run_zoo, tmp_path, zoo_cache, layout):
    run_dir = tmp_path / "run"
    first = start(run_dir, zoo_cache, *layout, "trainer.max_steps=100000", "checkpoint.every=2", "logger=none")
    try:
        wait_for_training(run_dir, first, steps=3)
        for extra in ([], ["resume=auto"]):
            second = run_zoo(*FAST, *layout, "trainer.max_steps=2", "logger=none", *extra, run_dir=run_dir,
                             check=False)
            lines = [line for line in second.stderr.splitlines() if line.startswith("zoo: error:")]
            assert second.returncode == 2, second.stderr[-2000:]
            assert len(lines) == 1 and f"pid {first.pid} on host {socket.gethostname()}" in lines[0], lines
            assert "Traceback" not in second.stderr
        assert first.poll() is None, "the running run was disturbed"
    finally:  # kill -9 the whole run: its lock becomes stale (the kernel drops it)
        ranks = psutil.Process(first.pid).children(recursive=True)
        first.send_signal(signal.SIGKILL)
        for p in ranks:
            p.kill()
        first.communicate(timeout=60)
        psutil.wait_procs(ranks, timeout=30)
    at = int((run_dir / "checkpoints" / "latest").read_text().strip().split("_")[1])  # where the kill left it
    third = run_zoo(*FAST, *layout, f"trainer.max_steps={at + 2}", "checkpoint.every=2", "logger=none", "resume=auto",
                    run_dir=run_dir)
    assert "resumed from" in third.stdout and third.summary["steps_run"] == 2
    assert not (run_dir / ".zoo.lock").exists()
