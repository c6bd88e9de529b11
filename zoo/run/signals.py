"""Stopping on a signal: SIGTERM / SIGINT (stop cleanly) and SIGUSR1 (Slurm's warning
before a time limit or preemption: checkpoint, then ask to be requeued).

Signal dispositions are per process, so the record of what arrived is too (this module's
state): `install()` runs first thing in every process of a run, before the slow imports,
so a warning during start-up is kept rather than killing the rank. The trainer checks
after each step, all ranks agree (a MAX all-reduce, so a signal that reached one rank
stops all of them at the same step), a checkpoint is written and the process exits with
`exit_code`.
"""
from __future__ import annotations

import signal

# Exit code of a run that checkpointed on SIGUSR1 and wants its Slurm job requeued
# (EX_TEMPFAIL): the sbatch scripts requeue on it and on nothing else.
REQUEUE_EXIT_CODE = 75
_CODES = {signal.SIGTERM: 1, signal.SIGINT: 2, signal.SIGUSR1: 3}
_SIGNALS = {code: sig for sig, code in _CODES.items()}
_received = 0


def _handle(signum, _frame) -> None:
    global _received
    _received = max(_received, _CODES[signum])


def install() -> None:
    for sig in _CODES:
        signal.signal(sig, _handle)


def received() -> int:
    """The strongest signal this process received (0: none; 1 TERM, 2 INT, 3 USR1)."""
    return _received


def name(code: int) -> str:
    return _SIGNALS[code].name


def exit_code(code: int) -> int:
    """SIGUSR1: requeue me (75); SIGTERM/SIGINT: 128 + the signal number, as a shell reports it."""
    return REQUEUE_EXIT_CODE if code == 3 else 128 + int(_SIGNALS[code])
