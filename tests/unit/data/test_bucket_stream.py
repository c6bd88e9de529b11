"""BERT's length-bucketed order computed a pool at a time (data_pipelines.bucket_stream):
every epoch a set of distinct samples in whole global batches, each batch in ascending
length and padded little, the same on every call, nothing of the epoch's size held (the
whole-epoch `BucketedStream` held 8 B a sample and every length), and checkpoints written
with the whole-epoch order going on with it."""
from __future__ import annotations

import numpy as np
import pytest

from data_pipelines.bucket_stream import PooledBuckets
from data_pipelines.mlm import BucketedStream, IndexRange
from data_pipelines.sampler import padding_efficiency
from data_pipelines.schedule import restore_order


def _lengths(n, seed=0):
    return np.random.default_rng(seed).integers(3, 128, size=n)


def _stream(lengths, batch, seed=4, pool_batches=5, asked=None):
    def length_of(positions):
        if asked is not None:
            asked.append(len(positions))
        return lengths[positions]

    return PooledBuckets(len(lengths), length_of, global_batch=batch, seed=seed, pool_batches=pool_batches,
                         legacy=lambda _saved: BucketedStream(lengths, global_batch=batch, seed=seed))


@pytest.mark.parametrize("n,batch", [(1003, 8), (64, 64), (650, 16), (97, 4)])
def test_an_epoch_is_distinct_samples_in_ascending_batches_and_epochs_differ(n, batch):
    lengths = _lengths(n)
    stream = _stream(lengths, batch)
    assert stream.per_epoch == n // batch * batch
    epochs = stream.indices(0, 2 * stream.per_epoch).reshape(2, -1)
    for order in epochs:
        assert len(np.unique(order)) == stream.per_epoch and order.min() >= 0 and order.max() < n
        per_batch = lengths[order].reshape(-1, batch)
        assert (np.diff(per_batch, axis=1) >= 0).all()  # each global batch in ascending length
    if n > batch:
        assert not np.array_equal(epochs[0], epochs[1])
        assert not np.array_equal(np.sort(epochs[0]), np.sort(epochs[1]))  # a different few sit an epoch out
    assert np.array_equal(_stream(lengths, batch).indices(0, stream.per_epoch), epochs[0])  # deterministic
    assert not np.array_equal(_stream(lengths, batch, seed=5).indices(0, stream.per_epoch), epochs[0])


def test_reads_of_any_size_and_place_agree_with_the_whole_stream():
    lengths = _lengths(1003)
    whole = _stream(lengths, 8).indices(0, 3 * 1000)
    stream = _stream(lengths, 8)
    for start, count in ((0, 1), (995, 9), (1500, 3), (2999, 1), (17, 1234), (3, 5)):
        assert np.array_equal(stream.indices(start, count), whole[start:start + count])
    assert np.array_equal(stream.epochs(998, 4), [0, 0, 1, 1])


def test_batches_pad_little_and_consecutive_steps_come_from_all_over_the_epoch():
    lengths = _lengths(20_000, seed=2)
    batch, micro = 32, 8
    stream = _stream(lengths, batch, pool_batches=100)
    first = stream.indices(0, 64 * batch)
    bucketed = padding_efficiency(first.reshape(-1, micro), lengths)
    shuffled = padding_efficiency(np.random.default_rng(0).permutation(64 * batch).reshape(-1, micro), lengths)
    assert bucketed > 0.95 > shuffled
    pools = {int(stream._order(0, 1)(np.array([s]))[0]) // 100 for s in range(64)}
    assert len(pools) > 1  # batches of several pools, not one pool's after another


@pytest.mark.parametrize("pooled", [True, False], ids=["pooled", "whole-epoch"])
def test_padding_efficiency_equals_the_per_micro_batch_count(pooled):
    """The run's padding efficiency against the batch-by-batch count over `indices`, across
    epoch boundaries and with a fixed pad length, for both orders."""
    lengths = _lengths(203, seed=1)
    stream = _stream(lengths, 8) if pooled else BucketedStream(lengths, global_batch=8, seed=3)
    samples = 2 * stream.per_epoch + 5 * 8
    starts = range(0, samples, 4)
    expected = padding_efficiency((stream.indices(s, 4) for s in starts), lengths)
    assert stream.padding_efficiency(samples, 4) == pytest.approx(expected, rel=1e-12)
    fixed = sum(int(lengths[stream.indices(s, 4)].sum()) for s in starts) / (len(starts) * 4 * 128)
    assert stream.padding_efficiency(samples, 4, pad_to=128) == pytest.approx(fixed, rel=1e-12)
    assert stream.padding_efficiency(0, 4) == 1.0
    with pytest.raises(ValueError, match="must divide"):
        stream.padding_efficiency(samples, 3)


def test_a_rank_holds_and_reads_only_pools():
    """488M samples (1T tokens): a step reads one pool's lengths and holds at most two pools."""
    n, batch, asked = 488_000_000, 256, []
    stream = PooledBuckets(n, lambda p: asked.append(len(p)) or np.full(len(p), 100), global_batch=batch, seed=1)
    for start in (0, 5 * batch, stream.per_epoch - 3):  # the last across an epoch boundary
        got = stream.indices(start, 6)
        assert got.shape == (6,) and (0 <= got).all() and (got < n).all()
    assert max(asked) <= 100 * batch
    held = sum(a.size for a in stream._pools.values())
    held += sum(v.size for o in stream._orders.values() for v in vars(o).values() if isinstance(v, np.ndarray))
    assert held <= 2 * 100 * batch + 64


def test_a_resume_goes_on_with_the_order_its_checkpoint_was_written_with():
    lengths = _lengths(500)
    stream = _stream(lengths, 8)
    assert restore_order(stream, "bucketed-pools") is stream
    for saved in ("bucketed", None):  # the whole-epoch order, or a checkpoint of before orders were recorded
        legacy = restore_order(stream, saved)
        assert legacy.order == "bucketed"
        assert np.array_equal(legacy.indices(0, 496), BucketedStream(lengths, global_batch=8, seed=4).indices(0, 496))


def test_index_range_indexes_like_an_arange():
    r, a = IndexRange(10, 20), np.arange(10, 20)
    assert len(r) == 10 and np.array_equal(r[[0, 9, 3]], a[[0, 9, 3]]) and r[np.int64(2)] == 12
    assert np.array_equal(np.asarray(r[2:5][np.arange(3)]), a[2:5]) and len(r[8:100]) == 2
    assert np.array_equal(r[::3], a[::3])
    with pytest.raises(IndexError):
        r[[10]]
