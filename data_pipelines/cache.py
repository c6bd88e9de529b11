"""The on-disk cache: content-keyed directories written once, atomically, under a lock.

Several ranks (also on several nodes sharing a filesystem) may ask for the same entry at
once: the first to take the lock builds it into a temporary directory and renames it into
place; the others wait on the lock and then find it ready. A crash mid-build leaves only a
temporary directory, never a half-written entry.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator


def cache_root(configured: str | None = None) -> Path:
    root = configured or os.environ.get("ZOO_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "zoo")
    return Path(root)


def cache_key(**parts) -> str:
    """A short stable hash of the settings that determine an entry."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def cached_dir(entry: Path, build: Callable[[Path], None]) -> Path:
    """Return `entry`, building it with `build(tmp_dir)` first if it does not exist yet."""
    if (entry / ".complete").exists():
        return entry
    with _locked(entry.with_name(entry.name + ".lock")):
        if (entry / ".complete").exists():
            return entry
        tmp = Path(tempfile.mkdtemp(prefix=entry.name + ".tmp", dir=entry.parent))
        try:
            build(tmp)
            (tmp / ".complete").write_text("ok\n")
            if entry.exists():  # a stale incomplete entry
                shutil.rmtree(entry)
            os.replace(tmp, entry)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return entry
