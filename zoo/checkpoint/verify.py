"""Verified checkpoints: every file's size and checksum, recorded when a checkpoint is
written and checked before it is read.

`checksums.json` in a checkpoint directory maps each file (relative path) to its size and
its xxh3-64 digest. It is written last, just before the directory is renamed into place,
so a checkpoint without it was either written before zoo recorded checksums (it is read
unverified) or never finished. A resume verifies first: a damaged checkpoint (a missing,
truncated or changed file, an unreadable state.json) is reported naming the file, and
`resume=auto` falls back to the newest intact checkpoint, saying so.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Callable, List, Optional, Tuple

from zoo.run.checksums import manifest, mismatch
from zoo.run.errors import CheckpointError

CHECKSUMS = "checksums.json"


def write_checksums(directory: Path, known: Optional[dict] = None) -> None:
    """Record the size and digest of every file under `directory` (call when it is complete);
    `known`: {relative path: {bytes, xxh3_64}} of files whose digests their writers computed
    as they wrote them (each rank its shard), which are not read again."""
    known = known or {}
    record = {**manifest(directory, exclude=(CHECKSUMS, *known)), **known}
    tmp = directory / (CHECKSUMS + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(record, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, directory / CHECKSUMS)


def damage(directory: Path, share: Tuple[int, int] = (0, 1)) -> Optional[str]:
    """What is wrong with the checkpoint in `directory`, naming the file; None when intact.
    `share` (rank, world): the files whose bytes this rank reads and hashes, its own shard
    and index (their names end in its rank number) and every world-th of the others, so that
    the ranks of a resume verify a checkpoint together, each O(its share); (0, 1): all."""
    if not directory.is_dir():
        return f"{directory.name}/ is missing"
    state = directory / "state.json"
    if not state.is_file():
        return "state.json is missing"
    try:
        json.loads(state.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        return f"state.json is not readable JSON ({type(err).__name__})"
    listed = directory / CHECKSUMS
    if not listed.is_file():
        return None  # written before checksums were recorded: read unverified
    try:
        record = json.loads(listed.read_text())
    except (ValueError, UnicodeDecodeError):
        return f"{CHECKSUMS} is not readable JSON"
    rank, world = share
    return mismatch(directory, {name: want for i, (name, want) in enumerate(sorted(record.items()))
                                if owner(name, i, world) == rank})


def owner(name: str, position: int, world: int) -> int:
    """The rank that verifies file `name` (the `position`-th in name order) among `world` ranks:
    a rank's own shard, index and DeepSpeed files (their names carry a 5-digit rank, e.g.
    shard-00003.safetensors), by that number; the rest in turn."""
    found = _RANK_IN_NAME.search(name)
    return (int(found.group(1)) if found else position) % world


_RANK_IN_NAME = re.compile(r"[-_](\d{5})\.")


def shared_damage(directory: Path, rank: int, world: int, gather) -> Optional[str]:
    """damage() found by `world` ranks together, each hashing its share (collective: `gather`
    is all_gather_object over them); every rank gets the first problem any of them found."""
    try:
        mine = damage(directory, (rank, world))
    except OSError as err:  # unreadable: a problem of this checkpoint, said on every rank alike
        mine = f"a file cannot be read ({err})"
    found = [None] * world
    gather(found, mine)
    return next((problem for problem in found if problem), None)


def _candidates(root: Path) -> List[Path]:
    """`latest` first (when it names a directory), then every step directory, newest first."""
    steps = sorted((p for p in root.glob("step_*") if p.is_dir()), reverse=True)
    latest = root / "latest"
    first = [root / latest.read_text().strip()] if latest.is_file() else []
    return first + [p for p in steps if p not in first]


def step_of(checkpoint: Path) -> Optional[int]:
    """The step a checkpoint holds, from its state.json alone (nothing verified: a cheap look
    before launch); None where that is not readable."""
    try:
        return int(json.loads((checkpoint / "state.json").read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def newest_step(root: Path) -> Optional[Tuple[Path, int]]:
    """(the checkpoint under `root` a resume would take first, its step); None when there is none readable."""
    for path in _candidates(root) if root.is_dir() else []:
        step = step_of(path)
        if step is not None:
            return path, step
    return None


def newest_intact(root: Path, verify: Callable[[Path], Optional[str]] = damage) -> Tuple[Optional[Path], List[str]]:
    """(the newest intact checkpoint under `root`, one line for each damaged one passed over).
    (None, []) when there is no checkpoint at all; CheckpointError when none is intact.
    `verify`: damage, or shared_damage bound to the ranks of a resume (every rank calls this)."""
    notes, problems = [], []
    candidates = _candidates(root) if root.is_dir() else []
    for path in candidates:
        problem = verify(path)
        if problem is None:
            return path, notes
        problems.append(f"{path.name}: {problem}")
        notes.append(f"checkpoint {path} is damaged ({problem}); falling back to the one before it")
    if candidates:
        raise CheckpointError(f"no intact checkpoint in {root} ({'; '.join(problems)}); resume from another "
                              f"checkpoint (resume=PATH) or start afresh in a new hydra.run.dir")
    return None, notes
