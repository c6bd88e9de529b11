"""Which samples each rank reads at each step, independent of the parallel layout.

The sample stream is the concatenation of per-epoch permutations (seeded by seed and
epoch), each computed only at the positions read (data_pipelines.permutation: no rank holds
an epoch's order). A step of global batch B that starts after `consumed` samples reads
positions [consumed, consumed + B); the data-parallel rank d takes the d-th contiguous slice
of B/dp of them, cut into micro-batches. So the data position is one integer (samples
consumed), which carries over unchanged when tp, pp or dp change, and every layout sees the
same samples per step.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from data_pipelines.permutation import FeistelOrder
from zoo.run.errors import DataError

# How an epoch is ordered: "feistel", computed at the positions read; "numpy", the whole
# epoch's `Generator.permutation` held on every rank (4 B a sample), the order of runs
# started before it and of their checkpoints, which record no order (restore_order).
ORDERS = ("feistel", "numpy")


class SampleStream:
    def __init__(self, num_samples: int, seed: int, shuffle: bool = True, order: str = "feistel"):
        if num_samples <= 0:
            raise DataError("the dataset is empty: no samples to train on")
        if order not in ORDERS:
            raise ValueError(f"order={order!r}: one of {', '.join(ORDERS)}")
        self.num_samples = num_samples
        self.seed = seed
        self.shuffle = shuffle
        self.order = order
        self._perm_epoch = -1
        self._perm = None
        self._feistel: Optional[FeistelOrder] = None  # order="feistel": the current epoch's
        self._feistel_epoch = -1

    def _epoch_slice(self, epoch: int, within: int, take: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(within, within + take)
        if self.order == "numpy":
            return self._permutation(epoch)[within:within + take]
        if self._feistel is None or self._feistel_epoch != epoch:
            self._feistel, self._feistel_epoch = FeistelOrder(self.num_samples, self.seed, epoch), epoch
        return self._feistel(np.arange(within, within + take))

    def _permutation(self, epoch: int) -> np.ndarray:
        """order="numpy": the epoch's whole order, in the narrowest integer type that holds it:
        int32 below 2**31 samples (4 bytes a sample on every rank, not 8). Shuffling an int32
        range draws what `Generator.permutation(n)` draws: the same order as int64 gives (a unit
        test holds it)."""
        if epoch != self._perm_epoch:
            self._perm = None  # the last epoch's order is freed before the next is built
            order = np.arange(self.num_samples, dtype=np.int32 if self.num_samples < 2**31 else np.int64)
            if self.shuffle:
                np.random.default_rng([self.seed, epoch]).shuffle(order)
            self._perm, self._perm_epoch = order, epoch
        return self._perm

    def indices(self, start: int, count: int) -> np.ndarray:
        """Sample indices at stream positions [start, start + count)."""
        out = np.empty(count, dtype=np.int64)
        pos = start
        while pos < start + count:  # one slice per epoch the positions cross
            epoch, within = divmod(pos, self.num_samples)
            take = min(start + count - pos, self.num_samples - within)
            out[pos - start:pos - start + take] = self._epoch_slice(epoch, within, take)
            pos += take
        return out


def restore_order(stream, saved: Optional[str]):
    """The stream a resumed run goes on with: the order its checkpoint was written with
    (`data_order` in its state.json; none recorded: "numpy", the only order then), so an
    epoch it is inside goes on as it began. Streams of another kind (BERT's bucketed ones)
    say themselves (`restored`)."""
    if isinstance(stream, SampleStream):
        if stream.shuffle:
            stream.order = saved if saved in ORDERS else "numpy"
        return stream
    restored = getattr(stream, "restored", None)
    return restored(saved) if restored else stream


def micro_batch_start(consumed: int, micro: int, *, global_batch: int, micro_batch: int, dp_rank: int,
                      dp_size: int) -> int:
    """First stream position of micro-batch `micro` of `dp_rank` in the step that starts
    after `consumed` samples (the layout-free data position)."""
    return consumed + dp_rank * (global_batch // dp_size) + micro * micro_batch
