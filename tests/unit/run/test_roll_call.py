"""zoo.run.roll_call: the survivors of a dead peer name it, once (#54)."""
from __future__ import annotations

import threading
from datetime import timedelta

import torch.distributed as dist

from zoo.run import roll_call


def _survivors(store, world: int, alive: list, wait_s: float = 0.5) -> dict:
    verdicts = {}

    def answer(rank):
        verdicts[rank] = roll_call.roll_call(store, rank, world, wait_s)

    threads = [threading.Thread(target=answer, args=(r,)) for r in alive]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return verdicts


def test_one_survivor_names_the_ranks_that_did_not_answer_with_their_hosts():
    store = dist.HashStore()
    for rank in range(4):
        store.set(f"{roll_call.PREFIX}/where/{rank}", f"node{rank // 2}")
    verdicts = _survivors(store, 4, alive=[0, 1, 3])
    namers = [v for v in verdicts.values() if v.namer]
    assert len(namers) == 1 and namers[0].missing == [(2, "node1")] and namers[0].answered == 3
    assert all(v.missing == [] for v in verdicts.values() if not v.namer)
    assert roll_call.named(namers[0].missing) == "rank 2 on node1"


def test_where_everyone_answers_nobody_is_named_and_nobody_waits():
    import time

    store = dist.HashStore()
    t0 = time.monotonic()
    verdicts = _survivors(store, 2, alive=[0, 1], wait_s=30)
    assert time.monotonic() - t0 < 10 and [v.missing for v in verdicts.values()] == [[], []]


def test_a_store_that_went_with_its_rank_names_nobody():
    class Gone:
        def set(self, *args):
            raise RuntimeError("Connection reset by peer")

    assert roll_call.roll_call(Gone(), 1, 4) is None and roll_call.roll_call(None, 1, 4) is None


def test_a_registered_rank_is_named_by_its_host_over_a_real_tcp_store():
    store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=timedelta(seconds=10), wait_for_workers=False)
    roll_call.register(store, 1)
    verdict = roll_call.roll_call(store, 0, 2, wait_s=0.2)
    import socket

    assert verdict.namer and verdict.missing == [(1, socket.gethostname())]


def test_many_missing_ranks_are_shortened():
    assert roll_call.named([(r, "n") for r in range(6)]) == "ranks 0 on n, 1 on n, 2 on n, 3 on n and 2 more"
