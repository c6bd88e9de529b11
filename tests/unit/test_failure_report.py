"""The local launcher's report of the first failing rank: one line, whatever the agent holds."""
from __future__ import annotations

from zoo.train import _last_error_line


def test_an_error_file_record_gives_its_exception_line():
    record = {"message": "Traceback (most recent call last):\n  File \"x.py\", line 3, in f\n    g()\n"
                         "torch.distributed.DistBackendError: [../gloo] Timed out waiting 15000ms for recv\n",
              "extraInfo": {"py_callstack": "...", "timestamp": "1764580000"}}
    line = _last_error_line(record)
    assert line == "torch.distributed.DistBackendError: [../gloo] Timed out waiting 15000ms for recv"
    assert "\n" not in _last_error_line("Signal 9 (SIGKILL) received by PID 123")


def test_an_empty_message_says_so():
    assert _last_error_line({"message": ""}) == "(no message)" and _last_error_line(None) == "(no message)"
