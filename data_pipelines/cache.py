"""The on-disk cache: content-keyed directories written once, atomically, under a lock.

Several ranks (also on several nodes sharing a filesystem) may ask for the same entry at
once: the first to take the lock builds it into a temporary directory and renames it into
place; the others wait on the lock and then find it ready. A crash mid-build leaves only a
temporary directory, never a half-written entry; the next builder removes such leftovers
(while it holds the lock, no other build of that entry can be running).

An entry's `.complete` marker holds the size and checksum of each of its files, and every
use verifies them: an entry whose files were truncated, replaced or deleted (or one written
before markers held checksums) is rebuilt under the same lock, with one line saying so.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

from zoo.run.checksums import manifest, mismatch

MARKER = ".complete"
VERIFIED = ".verified"


def cache_root(configured: str | None = None) -> Path:
    root = configured or os.environ.get("ZOO_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "zoo")
    return Path(root)


def cache_key(**parts) -> str:
    """A short stable hash of the settings that determine an entry."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _damage(entry: Path) -> Optional[str]:
    """Why `entry` cannot be used (None: it is complete and intact). A file whose digest was read
    and matched before (`.verified`: its size and modification time then) is not read again, so a
    corpus of many gigabytes is hashed once, not at every start of every rank."""
    marker = entry / MARKER
    if not marker.is_file():
        return None if not entry.exists() else "it was never completed"
    try:
        record = json.loads(marker.read_text())
    except ValueError:
        return "its marker holds no checksums (written by an older zoo)"
    if not isinstance(record, dict):
        return "its marker holds no checksums"
    stamps = entry / VERIFIED
    try:
        verified = json.loads(stamps.read_text()) if stamps.is_file() else {}
    except ValueError:
        verified = {}
    before = dict(verified)
    problem = mismatch(entry, record, verified)
    if problem is None and verified != before:
        try:
            tmp = stamps.with_name(f"{VERIFIED}.{os.getpid()}")
            tmp.write_text(json.dumps(verified))
            os.replace(tmp, stamps)
        except OSError:
            pass  # a read-only cache: the digests are read again next time
    return problem


def cached_dir(entry: Path, build: Callable[[Path], None]) -> Path:
    """Return `entry`, building it with `build(tmp_dir)` first if it does not exist yet or
    its files do not match the checksums written with it."""
    if (entry / MARKER).exists() and _damage(entry) is None:
        return entry
    with locked(entry.with_name(entry.name + ".lock")):
        problem = _damage(entry)
        if (entry / MARKER).exists() and problem is None:
            return entry  # another process built it while this one waited
        for leftover in entry.parent.glob(entry.name + ".tmp*"):  # of builds that were killed
            shutil.rmtree(leftover, ignore_errors=True)
        if problem is not None:
            print(f"zoo: cache entry {entry} is unusable ({problem}); rebuilding it", file=sys.stderr, flush=True)
        tmp = Path(tempfile.mkdtemp(prefix=entry.name + ".tmp", dir=entry.parent))
        try:
            build(tmp)
            (tmp / MARKER).write_text(json.dumps(manifest(tmp, exclude=(MARKER, VERIFIED)), indent=1))
            if entry.exists():  # a stale or damaged entry
                shutil.rmtree(entry)
            os.replace(tmp, entry)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return entry
