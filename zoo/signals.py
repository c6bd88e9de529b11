"""Stopping on a signal: SIGTERM / SIGINT (stop cleanly) and SIGUSR1 (Slurm's warning
before a time limit or preemption: checkpoint, then ask to be requeued).

A handler only records the signal; the trainer checks after each step, all ranks agree
(a MAX all-reduce, so a signal that reached one rank stops all of them at the same step),
a checkpoint is written and the process exits with `exit_code`.
"""
from __future__ import annotations

import signal

import torch
import torch.distributed as dist

# Exit code of a run that checkpointed on SIGUSR1 and wants its Slurm job requeued
# (EX_TEMPFAIL): the sbatch scripts requeue on it.
REQUEUE_EXIT_CODE = 75
_CODES = {signal.SIGTERM: 1, signal.SIGINT: 2, signal.SIGUSR1: 3}


class StopRequest:
    def __init__(self):
        self.received = 0

    def install(self) -> "StopRequest":
        for sig in _CODES:
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, _frame) -> None:
        self.received = max(self.received, _CODES[signum])

    def agreed(self, device: torch.device) -> int:
        """The strongest signal any rank received (0: none). Collective over all ranks."""
        flag = torch.tensor([self.received], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())

    @staticmethod
    def name(code: int) -> str:
        return {1: "SIGTERM", 2: "SIGINT", 3: "SIGUSR1"}[code]

    @staticmethod
    def exit_code(code: int) -> int:
        """SIGUSR1: requeue me; SIGTERM/SIGINT: a clean stop."""
        return REQUEUE_EXIT_CODE if code == 3 else 0
