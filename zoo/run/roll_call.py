"""Which rank went away: the survivors of a dead (or hung) peer name it, once.

Every rank writes its host to the process group's store when it joins (`register`). A rank
whose collective failed because a peer vanished or did not answer calls `roll_call`: it answers
(one key and one counter), waits up to `wait_s` for the other survivors to answer, and the first
survivor to claim the naming scans the answers once and names the ranks that never answered
(the one that died, or hangs); the others stay silent. One scan of O(world) keys for the whole
job, O(1) store operations a rank besides.

The store is the launcher agent's under torchrun and zoo's launcher (it outlives any rank), and
rank 0's under srun and the deepspeed launcher: where rank 0 itself went away, nobody can be
named and every survivor says the plain line (`roll_call` returns None).
"""
from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import List, Optional, Tuple

PREFIX = "zoo/roll_call"


@dataclass(frozen=True)
class Verdict:
    namer: bool  # this rank names the missing ones (the others stay silent)
    missing: List[Tuple[int, str]]  # (rank, host) of the ranks that did not answer
    answered: int  # the survivors that did


def default_store():
    """The default process group's store, or None."""
    try:
        from torch.distributed import distributed_c10d as c10d

        return c10d._get_default_store()
    except (RuntimeError, ValueError, AttributeError, ImportError):
        return None


def register(store, rank: int) -> None:
    """At the join: this rank's host, for the survivors to name it by."""
    if store is not None:
        store.set(f"{PREFIX}/where/{rank}", socket.gethostname())


def roll_call(store, rank: int, world: int, wait_s: float = 2.0) -> Optional[Verdict]:
    """This survivor answers; after everyone alive answered (or `wait_s`), the verdict. None
    where the store cannot be reached."""
    if store is None:
        return None
    try:
        store.set(f"{PREFIX}/alive/{rank}", "1")
        answered = store.add(f"{PREFIX}/answers", 1)
        deadline = time.monotonic() + wait_s
        while answered < world and time.monotonic() < deadline:
            time.sleep(0.05)
            answered = store.add(f"{PREFIX}/answers", 0)
        claimed = store.compare_set(f"{PREFIX}/namer", "", str(rank)).decode()
        if claimed != str(rank):
            return Verdict(namer=False, missing=[], answered=answered)
        missing = [r for r in range(world) if not store.check([f"{PREFIX}/alive/{r}"])]
        return Verdict(namer=True, missing=[(r, _host(store, r)) for r in missing], answered=answered)
    except Exception:  # the store went with its rank (rank 0 under srun): nobody can be named
        return None


def _host(store, rank: int) -> str:
    key = f"{PREFIX}/where/{rank}"
    return store.get(key).decode() if store.check([key]) else "?"


def named(missing: List[Tuple[int, str]], limit: int = 4) -> str:
    """`rank 1 on node2`, `ranks 4, 5 on node2 and 6 on node3`: at most `limit`, then how many more."""
    shown = ", ".join(f"{r} on {h}" for r, h in missing[:limit])
    more = f" and {len(missing) - limit} more" if len(missing) > limit else ""
    return f"rank{'s' if len(missing) > 1 else ''} {shown}{more}"
