"""Which rank went away: the survivors of a dead (or hung) peer name it, once.

Every rank, when it joins, writes its host to the launcher's store and starts a listener: a
daemon thread on a store client of its own, blocked in the store's `wait` for its wake key (no
polling: it costs nothing until then). The first rank whose collective failed because a peer
vanished or did not answer sets every rank's (`roll_call`, O(world) once): every listener of
a live process answers at once for its rank, also for a rank still blocked in a collective
(which waits with the GIL released) that would only notice the failure when its own peer
exits. After `wait_s` the first survivor to claim the naming scans the answers once and names
the ranks that never answered: the one that died, or one that hangs (a stopped process's
thread does not run either); the other survivors stay silent. O(1) store operations a rank,
one wake and one scan of O(world) keys for the whole job. A rank that left before (its own
error, or the end) is not answered for: named as gone.

The store is the launcher agent's under torchrun and zoo's launcher (it outlives any rank),
and rank 0's under srun and the deepspeed launcher: rank 0 stays until the verdict is made
and every rank that answered has had its call (`keeps_store`), and where rank 0 itself went away nobody can be named: every survivor says
the plain line (`roll_call` returns None).
"""
from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, List, Optional, Tuple

ROOT = "zoo/roll_call"


@dataclass(frozen=True)
class Verdict:
    namer: bool  # this rank names the missing ones (the others stay silent)
    missing: List[Tuple[int, str]]  # (rank, host) of the ranks that did not answer
    answered: int  # the ranks whose process answered


def prefix(env=None) -> str:
    """Keys of this job step and attempt: torchrun's agent store outlives an attempt (and sees
    the world change), srun's and the local launcher's stores are new with each start."""
    env = os.environ if env is None else env
    run = env.get("TORCHELASTIC_RUN_ID") or f"{env.get('SLURM_JOB_ID', 'job')}.{env.get('SLURM_STEP_ID', '0')}"
    return f"{ROOT}/{run}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/{env.get('WORLD_SIZE', '1')}"


def client(timeout_s: float = 5.0):
    """A store client of this process's own, on the launcher's store (MASTER_ADDR:MASTER_PORT);
    None where there is none (one rank without a launcher) or it cannot be reached within
    `timeout_s` (a client retries a refused connection until then: where the store went with
    rank 0, a survivor or a rank leaving would wait that long)."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        return None
    try:
        import torch.distributed as dist

        return dist.TCPStore(addr, int(port), is_master=False, timeout=timedelta(seconds=timeout_s),
                             wait_for_workers=False)
    except Exception:  # the store went with its rank
        return None


class Listener:
    """This rank's listener: a daemon thread blocked in the store's wait for its wake key. A
    survivor sets every rank's to `lost` (the thread answers for its rank); the rank itself sets
    its own to `end` when it leaves (`stop`: the thread returns without answering and is joined,
    so no thread is left inside the store's C++ wait while the interpreter shuts down: that
    aborted the process, SIGABRT)."""

    def __init__(self, store, rank: int, keys: str, make_client: Callable):
        self.store, self.rank, self.keys, self.make_client = store, rank, keys, make_client
        self.thread = threading.Thread(target=self._answer, name="zoo-roll-call", daemon=True)
        self.thread.start()

    def _answer(self) -> None:
        key = f"{self.keys}/wake/{self.rank}"
        try:
            self.store.wait([key], timedelta(days=30))
            if self.store.get(key) == b"lost":
                self.store.set(f"{self.keys}/alive/{self.rank}", "1")
                self.store.add(f"{self.keys}/answers", 1)
        except BaseException:  # the store closed (its process ended): nothing to answer
            return

    def stop(self, timeout_s: float = 2.0) -> None:
        """On another client: a TCPStore client runs one request at a time, and the thread's is
        inside its wait (the same client's compare_set waited behind it: every rank hung at its end)."""
        if self.thread.is_alive():
            try:
                other = self.make_client()
                if other is not None:  # (a survivor's `lost` stays)
                    other.compare_set(f"{self.keys}/wake/{self.rank}", "", "end")
            except Exception:
                pass
        self.thread.join(timeout_s)


def listen(rank: int, make_client: Callable = client, keys: Optional[str] = None) -> Optional[Listener]:
    """At the join: this rank's host for the survivors to name it by, and its listener (stop it
    when the rank leaves); None where the launcher's store cannot be reached."""
    keys = keys or prefix()
    store = make_client()
    if store is None:
        return None
    try:
        store.set(f"{keys}/where/{rank}", socket.gethostname())
    except Exception:
        return None
    return Listener(store, rank, keys, make_client)


def roll_call(store, rank: int, world: int, wait_s: float = 2.0, keeps_store: bool = False,
              keys: Optional[str] = None) -> Optional[Verdict]:
    """A peer was lost: say so, let every live rank's listener answer for `wait_s`, then the
    verdict. None where the store cannot be reached. `keeps_store`: this rank's process serves
    the store (rank 0 under srun): it waits (up to `wait_s` more) until the naming survivor has
    its verdict."""
    if store is None:
        return None
    keys = keys or prefix()
    try:
        if store.compare_set(f"{keys}/lost", "", str(rank)).decode() == str(rank):  # the first survivor wakes all
            for r in range(world):
                store.compare_set(f"{keys}/wake/{r}", "", "lost")  # (a rank that left already said `end`)
        deadline = time.monotonic() + wait_s
        answered = store.add(f"{keys}/answers", 0)
        while answered < world and time.monotonic() < deadline and not store.check([f"{keys}/named"]):
            time.sleep(0.05)
            answered = store.add(f"{keys}/answers", 0)
        if store.compare_set(f"{keys}/namer", "", str(rank)).decode() == str(rank):
            missing = [r for r in range(world) if not store.check([f"{keys}/alive/{r}"])]
            verdict = Verdict(namer=True, missing=[(r, _host(store, keys, r)) for r in missing], answered=answered)
            store.set(f"{keys}/named", "1")
        else:
            verdict = Verdict(namer=False, missing=[], answered=answered)
        done = store.add(f"{keys}/done", 1)
        # The store's own process leaves last: once every rank that answered has had its call (a
        # rank blocked on a peer notices when that peer leaves), or after wait_s more.
        deadline = time.monotonic() + wait_s
        while keeps_store and time.monotonic() < deadline and (
                done < store.add(f"{keys}/answers", 0) or not store.check([f"{keys}/named"])):
            time.sleep(0.05)
            done = store.add(f"{keys}/done", 0)
        return verdict
    except Exception:  # the store went with its rank (rank 0 under srun): nobody can be named
        return None


def _host(store, keys: str, rank: int) -> str:
    key = f"{keys}/where/{rank}"
    return store.get(key).decode() if store.check([key]) else "?"


def named(missing: List[Tuple[int, str]], limit: int = 4) -> str:
    """`rank 1 on node2`, `ranks 4 on node2, 5 on node2`: at most `limit`, then how many more."""
    shown = ", ".join(f"{r} on {h}" for r, h in missing[:limit])
    more = f" and {len(missing) - limit} more" if len(missing) > limit else ""
    return f"rank{'s' if len(missing) > 1 else ''} {shown}{more}"
