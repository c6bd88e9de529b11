"""A quiet console: only rank 0 speaks, and only zoo's lines, unless `verbose=true`.

Without this, every rank of a run printed DeepSpeed's start-up chatter: `Setting accelerator
to CPU`, `Using topology: {...}`, `Attempting to get learning rate from scheduler before it
has started`, a 3d run's `SEED_LAYERS=...` and its stage listing (33 lines before the first
step). DeepSpeed's logger keeps its errors; its plain prints during the grid and engine set-up
are held and dropped (`held_stdout`). Ranks other than 0 drop Python warnings (rank 0 shows
them once for all). datasets' progress bars write carriage returns: off when stderr is not a
terminal (a log file, Slurm's output)."""
from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import warnings

DEEPSPEED_LOGGER = "DeepSpeed"


class _ErrorsOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


def quiet_third_party(verbose: bool, rank: int = 0) -> None:
    """Set before DeepSpeed and datasets are imported (a filter on DeepSpeed's logger outlives
    the level DeepSpeed sets on it at import); idempotent, and undone by verbose=True."""
    ds = logging.getLogger(DEEPSPEED_LOGGER)
    for f in [f for f in ds.filters if isinstance(f, _ErrorsOnly)]:
        ds.removeFilter(f)
    if verbose:
        return
    ds.addFilter(_ErrorsOnly())
    if not sys.stderr.isatty():
        os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    # datasets logs a file it cannot parse (an error) before raising; zoo's one line says it (DataError)
    os.environ.setdefault("DATASETS_VERBOSITY", "critical")
    if rank != 0:
        warnings.simplefilter("ignore")


@contextlib.contextmanager
def held_stdout(verbose: bool):
    """What third-party set-up code prints (DeepSpeed's grid and pipeline module) is dropped
    unless verbose."""
    if verbose:
        yield
        return
    with contextlib.redirect_stdout(io.StringIO()):
        yield


@contextlib.contextmanager
def filtered_stderr(drop: tuple, verbose: bool):
    """File descriptor 2 (C++ code's stderr too) goes to a temporary file while inside; on the
    way out its lines go back to stderr, but those containing any of `drop` (unless verbose).
    Nothing else is lost: an error inside is written back before it propagates."""
    if verbose:
        yield
        return
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            for line in held.read().decode(errors="replace").splitlines(keepends=True):
                if not any(d in line for d in drop):
                    sys.stderr.write(line)
            sys.stderr.flush()


VERBOSE_ENV = "ZOO_VERBOSE"  # set by the local launcher for its forkserver, which imports DeepSpeed first
if __name__ != "__main__" and os.environ.get(VERBOSE_ENV) == "0":
    quiet_third_party(False, rank=0)
