"""One run per run directory: an exclusive lock held for the run's life.

`RUN_DIR/.zoo.lock` is locked with flock(2) by the process that owns the run (the local
launcher's parent, or rank 0 under torchrun, the deepspeed launcher and srun) and holds
that process's pid and host. A second run, or a `resume=` of a directory whose run is still
going, finds it locked and is refused at once, naming the holder. The kernel drops the lock
when its holder dies, so the lock of a killed run is stale by construction and the next run
takes it over. The file is removed when the run ends, however it ends.
"""
from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path
from typing import Optional

from zoo.run.errors import RunDirError

LOCK_NAME = ".zoo.lock"
HELD_ENV = "ZOO_RUN_DIR_LOCK_HELD"  # set by the local launcher for its workers: the parent holds it


class RunDirLock:
    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self.fd: Optional[int] = None

    def acquire(self) -> "RunDirLock":
        """Take the lock or raise RunDirError naming the run that holds it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 256).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunDirError(f"hydra.run.dir={self.run_dir} is in use by a running zoo run ({holder}); give this run "
                              f"another hydra.run.dir, or let that run end first (resume=auto then continues it)") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on host {socket.gethostname()}".encode())
        self.fd = fd
        return self

    def in_use(self) -> bool:
        """Whether a running run holds the lock now (takes nothing)."""
        if not self.path.exists():
            return False
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing drops the shared lock if it was taken
        return False

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None
