"""The start-up clock (zoo.observe.startup): this process's start time from /proc, the
command's times handed to its ranks by environment, the phases in order and their sum."""
from __future__ import annotations

import subprocess
import sys
import time

from zoo.observe import startup


def test_process_start_time_is_when_this_interpreter_started():
    code = "import time; from zoo.observe.startup import process_start_time; print(time.time() - process_start_time())"
    t0 = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    age = float(out.stdout)  # the child's age when it asked: its interpreter start and imports
    assert 0 < age < time.time() - t0 + 0.03  # /proc/uptime and the start ticks: 10 ms steps


def test_phases_follow_the_marks_from_the_commands_start(monkeypatch):
    monkeypatch.setenv(startup.START_ENV, "100.0")
    monkeypatch.setenv(startup.VALIDATED_ENV, "102.5")
    clock = startup.StartupClock()
    clock.marks += [("ranks", 103.0), ("process_group", 103.25), ("data", 105.0)]
    clock.mark("data")  # a phase is marked once
    assert clock.phases() == {"validation": 2.5, "ranks": 0.5, "process_group": 0.25, "data": 1.75, "total": 5.0}
    assert clock.line() == ("zoo: start: 5.0 s to the end of the first step (imports and validation 2.5, "
                            "ranks started 0.5, process group 0.2, data 1.8)")


def test_a_rank_of_an_external_launcher_measures_from_its_own_start(monkeypatch):
    monkeypatch.delenv(startup.START_ENV, raising=False)
    monkeypatch.delenv(startup.VALIDATED_ENV, raising=False)
    monkeypatch.setattr(startup, "_jobs_started", 0)
    startup.mark_validated(job_start=123.0)  # what zoo.train does in the rank's own process
    clock = startup.StartupClock()
    assert abs(clock.start - startup.process_start_time()) < 0.02 and [k for k, _ in clock.marks] == ["validation"]
    startup.mark_validated(job_start=123.0)  # a local sweep's next job, in the same process: from its own start
    assert startup.StartupClock().start == 123.0
