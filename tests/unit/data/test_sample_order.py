"""The epoch's order computed at the positions read (data_pipelines.permutation): a
permutation of the samples every epoch, a different one each epoch and seed, the same on
every call and across epoch boundaries, and nothing of the epoch's size held by a rank (the
array order held 4 B a sample: 1.95 GB a rank at 1T tokens in blocks of 2,049)."""
from __future__ import annotations

import numpy as np
import pytest

from data_pipelines.permutation import FeistelOrder
from data_pipelines.schedule import SampleStream, restore_order


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 65, 1000, 123_457])
def test_every_epoch_is_a_permutation_and_the_epochs_differ(n):
    stream = SampleStream(n, seed=11)
    epochs = stream.indices(0, 3 * n).reshape(3, n)
    for order in epochs:
        assert np.array_equal(np.sort(order), np.arange(n))
    if n >= 64:
        assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[1], epochs[2])
        assert not np.array_equal(epochs[0], np.arange(n))  # shuffled
        other_seed = SampleStream(n, seed=12).indices(0, n)
        assert not np.array_equal(other_seed, epochs[0])


def test_reads_of_any_size_and_place_agree_with_the_whole_stream():
    n = 1000
    whole = SampleStream(n, seed=5).indices(0, 3 * n)
    stream = SampleStream(n, seed=5)
    for start, count in ((0, 1), (998, 7), (1500, 2), (2999, 1), (0, 3 * n), (17, 1234)):
        assert np.array_equal(stream.indices(start, count), whole[start:start + count])


def test_the_order_looks_random():
    n = 200_000
    order = FeistelOrder(n, 3, 0)(np.arange(n))
    assert abs(np.corrcoef(order, np.arange(n))[0, 1]) < 0.01
    assert abs(np.abs(np.diff(order)).mean() / n - 1 / 3) < 0.01  # two uniform draws: E|U - V| = 1/3
    assert (order == np.arange(n)).sum() < 10  # about one fixed point expected


def test_a_rank_holds_nothing_of_the_epoch_s_size():
    n = 488_000_000  # 1T tokens in blocks of 2,049
    stream = SampleStream(n, seed=1)
    got = stream.indices(n - 3, 6)  # across an epoch boundary
    assert got.shape == (6,) and (0 <= got).all() and (got < n).all()
    held = [v for v in vars(stream).values() if isinstance(v, np.ndarray)]
    held += [v for v in vars(stream._feistel).values() if isinstance(v, np.ndarray)]
    assert all(v.size <= 8 for v in held)


def test_a_resume_keeps_the_order_its_checkpoint_was_written_with():
    stream = SampleStream(500, seed=9)
    restore_order(stream, "feistel")
    assert stream.order == "feistel"
    restore_order(stream, None)  # a checkpoint of before the computed order: the array one
    assert stream.order == "numpy"
    assert np.array_equal(stream.indices(0, 500), np.random.default_rng([9, 0]).permutation(500))
    unshuffled = SampleStream(500, seed=9, shuffle=False)
    restore_order(unshuffled, None)
    assert np.array_equal(unshuffled.indices(0, 5), np.arange(5))
