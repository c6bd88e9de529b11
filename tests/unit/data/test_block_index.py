"""The split of blocks and the sample stream hold nothing per block but the epoch's order,
and give exactly the blocks and samples the stored arrays gave (a checkpoint's data
position means the same samples as before)."""
from __future__ import annotations

import numpy as np
import pytest

from data_pipelines.lm import BlockSplit, held_out
from data_pipelines.schedule import SampleStream


@pytest.mark.parametrize("eval_fraction", [0.0, 0.01, 0.05, 0.1, 0.3, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("n", [1, 2, 3, 7, 19, 20, 21, 100, 1001])
def test_the_split_by_arithmetic_is_the_masks_split(n, eval_fraction):
    mask = held_out(n, eval_fraction)
    for held, want in ((False, np.flatnonzero(~mask)), (True, np.flatnonzero(mask))):
        split = BlockSplit(n, eval_fraction, held=held)
        assert len(split) == len(want)
        assert np.array_equal(split[np.arange(len(want))], want)
        assert [int(split[i]) for i in range(len(want))] == want.tolist()
        if len(want):
            assert int(split[-1]) == want[-1]
        with pytest.raises(IndexError):
            split[len(want)]
        with pytest.raises(IndexError):
            split[np.array([0, len(want)])]


def test_the_split_of_a_large_corpus_stores_nothing_per_block():
    n = 50_000_000  # 100B tokens in blocks of 2,049
    train, held = BlockSplit(n, 0.01, held=False), BlockSplit(n, 0.01, held=True)
    assert len(train) + len(held) == n and len(held) == n // 100
    assert int(held[0]) == 99 and int(train[98]) == 98 and int(train[99]) == 100
    assert int(train[-1]) == n - 2 and int(held[-1]) == n - 1
    assert all(not isinstance(v, np.ndarray) or v.size < 16 for v in vars(train).values())


@pytest.mark.parametrize("n", [1, 5, 1000, 123_457])
@pytest.mark.parametrize("shuffle", [True, False])
def test_the_numpy_order_gives_the_int64_permutations_samples_across_epochs(n, shuffle):
    """order="numpy" (runs whose checkpoints record no order): the epoch's Generator.permutation."""
    stream = SampleStream(n, seed=11, shuffle=shuffle, order="numpy")
    reads = ((0, min(n, 64)), (max(0, n - 3), 7), (n + 1, n + 2), (0, 3 * n))
    epochs = max(start + count for start, count in reads) // n + 1
    whole = np.concatenate([np.random.default_rng([11, e]).permutation(n) if shuffle else np.arange(n)
                            for e in range(epochs)])
    for start, count in reads:
        assert np.array_equal(stream.indices(start, count), whole[start:start + count])
    assert stream._permutation(0).dtype == np.int32  # 4 bytes a sample on every rank
