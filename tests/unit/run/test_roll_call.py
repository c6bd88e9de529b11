"""zoo.run.roll_call: the survivors of a dead peer name it, once (#54)."""
from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta

import torch.distributed as dist

from zoo.run import roll_call

KEYS = "test"


def _survivors(store, world: int, lost: list, wait_s: float = 0.5) -> dict:
    """`lost`: the ranks whose collective failed (they hold the roll call); every rank but the
    dead one (not in `lost` and without a listener) has a listener."""
    verdicts = {}

    def call(rank):
        verdicts[rank] = roll_call.roll_call(store, rank, world, wait_s, keys=KEYS)

    threads = [threading.Thread(target=call, args=(r,)) for r in lost]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return verdicts


def _listening(store, ranks) -> None:
    for rank in ranks:
        assert roll_call.listen(rank, make_client=lambda: store, keys=KEYS) is not None


def test_one_survivor_names_the_rank_that_did_not_answer_and_a_rank_still_blocked_answers_through_its_listener():
    store = dist.HashStore()
    _listening(store, [0, 1, 3])  # rank 2 died; rank 0 is still blocked in a collective: its listener answers
    store.set(f"{KEYS}/where/2", socket.gethostname())  # (it joined, as every rank did, then died)
    verdicts = _survivors(store, 4, lost=[1, 3])
    namers = [v for v in verdicts.values() if v.namer]
    host = socket.gethostname()
    assert len(namers) == 1 and namers[0].missing == [(2, host)] and namers[0].answered == 3, verdicts
    assert all(v.missing == [] for v in verdicts.values() if not v.namer)
    assert roll_call.named(namers[0].missing) == f"rank 2 on {host}"


def test_without_its_listener_a_blocked_rank_would_be_named_dead():
    store = dist.HashStore()
    _listening(store, [1, 3])
    verdict = next(v for v in _survivors(store, 4, lost=[1, 3]).values() if v.namer)
    assert [r for r, _ in verdict.missing] == [0, 2]


def test_where_everyone_answers_nobody_is_named_and_nobody_waits():
    store = dist.HashStore()
    _listening(store, [0, 1])
    t0 = time.monotonic()
    verdicts = _survivors(store, 2, lost=[0, 1], wait_s=30)
    assert time.monotonic() - t0 < 10 and [v.missing for v in verdicts.values()] == [[], []]


def test_a_rank_that_left_before_is_named_and_its_listener_is_joined_without_answering():
    store = dist.HashStore()
    listeners = [roll_call.listen(r, make_client=lambda: store, keys=KEYS) for r in range(3)]
    listeners[2].stop()  # rank 2 ended on its own error: its thread returned, nothing answered
    assert not listeners[2].thread.is_alive() and not store.check([f"{KEYS}/alive/2"])
    verdict = next(v for v in _survivors(store, 3, lost=[0, 1]).values() if v.namer)
    assert [r for r, _ in verdict.missing] == [2] and verdict.answered == 2
    for listener in listeners[:2]:
        listener.stop()
        assert not listener.thread.is_alive()


def test_a_store_that_went_with_its_rank_names_nobody():
    class Gone:
        def set(self, *args):
            raise RuntimeError("Connection reset by peer")

    assert roll_call.roll_call(Gone(), 1, 4, keys=KEYS) is None and roll_call.roll_call(None, 1, 4) is None
    assert roll_call.listen(0, make_client=lambda: None) is None


def test_a_listener_over_a_real_tcp_store_stops_while_its_thread_waits():
    """The thread's client is inside its wait: stopping on that same client waited behind it
    (every rank of a Slurm job hung at its end)."""
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=10), wait_for_workers=False)

    def client():
        return dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=10),
                             wait_for_workers=False)

    listener = roll_call.listen(0, make_client=client, keys=KEYS)
    time.sleep(0.2)  # inside its wait
    t0 = time.monotonic()
    listener.stop()
    assert time.monotonic() - t0 < 1.5 and not listener.thread.is_alive()
    assert not server.check([f"{KEYS}/alive/0"])


def test_over_a_real_tcp_store_with_a_client_per_process():
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=10), wait_for_workers=False)

    def client():
        return dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=10),
                             wait_for_workers=False)

    for rank in (0, 2):
        roll_call.listen(rank, make_client=client, keys=KEYS)
    server.set(f"{KEYS}/where/1", "node1")  # rank 1 joined, then died with its listener
    verdict = roll_call.roll_call(client(), 0, 3, wait_s=0.5, keys=KEYS)
    assert verdict == roll_call.Verdict(namer=True, missing=[(1, "node1")], answered=2)


def test_the_rank_serving_the_store_stays_until_every_rank_that_answered_had_its_call():
    """Under srun rank 0's process serves the store: leaving at once would take it from the
    namer mid-scan, and from a rank still blocked on a peer that notices only when that peer
    leaves; a rank coming after the verdict does not wait for answers again."""
    store = dist.HashStore()
    listeners = [roll_call.listen(r, make_client=lambda: store, keys=KEYS) for r in (0, 1, 3)]  # rank 2 died
    left = {}

    def serving():
        left["verdict"] = roll_call.roll_call(store, 0, 4, wait_s=2.0, keeps_store=True, keys=KEYS)
        left["at"] = time.monotonic()

    t0 = time.monotonic()
    host = threading.Thread(target=serving)
    host.start()
    named = roll_call.roll_call(store, 1, 4, wait_s=0.3, keys=KEYS)  # rank 1 names rank 2 and leaves
    time.sleep(0.5)
    assert "at" not in left  # rank 3 (answered, blocked) has not had its call: rank 0 stays
    t3 = time.monotonic()
    late = roll_call.roll_call(store, 3, 4, wait_s=2.0, keys=KEYS)
    assert time.monotonic() - t3 < 0.5 and not late.namer  # after the verdict: no second wait
    host.join()
    namer = named if named.namer else left["verdict"]  # whichever of ranks 0 and 1 claimed it: one
    assert named.namer != left["verdict"].namer and [r for r, _ in namer.missing] == [2]
    assert left["at"] - t0 < 2.5
    for listener in listeners:
        listener.stop()


def test_the_keys_are_the_attempts_and_the_steps():
    torchrun = {"TORCHELASTIC_RUN_ID": "r", "TORCHELASTIC_RESTART_COUNT": "2", "WORLD_SIZE": "4"}
    assert roll_call.prefix(torchrun) == "zoo/roll_call/r/2/4"
    assert roll_call.prefix({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "1", "WORLD_SIZE": "8"}) == "zoo/roll_call/7.1/0/8"


def test_many_missing_ranks_are_shortened():
    assert roll_call.named([(r, "n") for r in range(6)]) == "ranks 0 on n, 1 on n, 2 on n, 3 on n and 2 more"
