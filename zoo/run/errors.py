"""The one base class of every user-facing error.

A `ZooError` is a user mistake or an unusable input (a config value, a data source, a
checkpoint, a run directory): its message names what is wrong, the numbers and the fix.
Where ranks start (`zoo.train` before launch, `zoo.worker` on every rank under every
launcher) it is caught once and printed as one line, `zoo: error: ...`, with exit code 2
and no traceback (`verbose=true`, or `debug=true`, shows it). Anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

USER_ERROR_EXIT_CODE = 2


class ZooError(ValueError):
    """A user-facing error. rank_local: found in this rank's own inputs (e.g. its files of a
    checkpoint) and maybe by no other rank, so this rank reports it rather than rank 0."""

    def __init__(self, message: str, *, rank_local: bool = False):
        super().__init__(message)
        self.rank_local = rank_local


class ConfigError(ZooError):
    """A config value or combination that cannot run."""


def require(ok: bool, message: str) -> None:
    """Raise ConfigError(message) unless `ok`: validation's one-line refusals."""
    if not ok:
        raise ConfigError(message)


class DataError(ZooError):
    """A data source that cannot be read: a missing path, no usable records, a missing column."""


class CheckpointError(ZooError):
    """A checkpoint that cannot be used for this run; the message names the mismatch."""


class RunDirError(ZooError):
    """A run directory that cannot hold the run (not writable, no room)."""


class BatchFinderError(ZooError):
    """trainer.micro_batch_size=auto found no micro-batch that fits."""
