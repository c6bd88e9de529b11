"""The run directory must be writable, with room for what the run will write, before any
training starts: a clear error now rather than a failed save after an hour."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from zoo.run.errors import RunDirError


def check_writable(path: str | os.PathLike) -> None:
    """Create `path` if needed and write, sync and remove a probe file in it."""
    path = Path(path)
    probe = path / f".zoo-write-probe-{os.getpid()}"  # ranks of one run may probe at once
    try:
        path.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as fh:
            fh.write(b"\0" * 4096)
            fh.flush()
            os.fsync(fh.fileno())
        probe.unlink()
    except OSError as err:
        raise RunDirError(f"cannot write the run directory {path}: {err.strerror or err}; choose another "
                          f"hydra.run.dir or fix its permissions") from None


def expected_bytes(num_params: int, *, save_final: bool, checkpoints_kept: int, native: bool = False) -> int:
    """What the run writes: fp32 final weights, and per kept checkpoint fp32 weights plus
    AdamW's two moments (one more while a new one is written); with native files, those
    again plus the model's own weights (at most fp32)."""
    final = 4 * num_params if save_final else 0
    per_checkpoint = (12 + (16 if native else 0)) * num_params
    return final + (checkpoints_kept + 1) * per_checkpoint if checkpoints_kept else final


def check_space(path: str | os.PathLike, needed: int) -> None:
    free = shutil.disk_usage(path).free
    if free < needed:
        raise RunDirError(f"the run directory {path} has {free / 2**20:.1f} MiB free but this run writes about "
                          f"{needed / 2**20:.1f} MiB (weights and checkpoints); free space, lower checkpoint.keep "
                          f"or choose another hydra.run.dir")
