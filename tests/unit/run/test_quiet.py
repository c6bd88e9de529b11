"""The quiet console's switches (zoo.run.quiet): DeepSpeed's logger keeps only errors unless
verbose, third-party prints during set-up are held."""
from __future__ import annotations

import logging

from zoo.run.quiet import DEEPSPEED_LOGGER, held_stdout, quiet_third_party


def _passes(level: int) -> bool:
    record = logging.LogRecord(DEEPSPEED_LOGGER, level, __file__, 1, "msg", None, None)
    return logging.getLogger(DEEPSPEED_LOGGER).filter(record)


def test_deepspeeds_warnings_are_dropped_unless_verbose_and_errors_always_pass():
    try:
        quiet_third_party(False)
        quiet_third_party(False)  # idempotent: one filter
        assert len(logging.getLogger(DEEPSPEED_LOGGER).filters) == 1
        assert not _passes(logging.WARNING) and not _passes(logging.INFO) and _passes(logging.ERROR)
        quiet_third_party(True)  # a verbose job after a quiet one (one forkserver serves a sweep)
        assert _passes(logging.WARNING)
    finally:
        quiet_third_party(True)


def test_setup_prints_are_held_unless_verbose(capsys):
    with held_stdout(False):
        print("Using topology: {...}")
    with held_stdout(True):
        print("shown")
    assert capsys.readouterr().out == "shown\n"
