"""Length-bucketed global batches computed one pool at a time: O(pool) memory a rank.

BERT pads each micro-batch to its longest sample, so its order gathers samples of similar
length into a global batch. `BucketedStream` (data_pipelines.mlm) did it the sampler's way:
the epoch's whole shuffled order, sorted pool by pool and its batches shuffled, held as an
array on every rank (8 B a sample, plus the lengths of every sample: at 488M samples about
8 GB a rank). `PooledBuckets` gives the same kind of order and holds only the pools it reads:

1. the epoch's samples are a keyed permutation of the training set (`FeistelOrder`,
   evaluated at the positions read), cut into pools of `pool_batches` global batches; the
   samples past the last whole global batch (fewer than one batch) sit the epoch out, a
   different few each epoch;
2. a pool is sorted by length (stable) and cut into global batches, each in ascending length;
3. the epoch's batches are taken in the order of a second keyed permutation, so consecutive
   steps draw from pools all over the epoch.

A global batch therefore costs its pool's permutation, lengths and sort (pool_batches x the
global batch of samples), once a step on each rank, and the last two pools are kept.
Layout-free like every stream: positions are global, the global batch is fixed.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Optional

import numpy as np

from data_pipelines.permutation import FeistelOrder

POOL_BATCHES = 100  # global batches sorted together (BucketedBatchSampler's pool_size)
PADDING_STEPS = 256  # padding_efficiency: counted over at most the run's first this many steps


class PooledBuckets:
    """`indices(start, count)`: training-set positions at stream positions [start, start + count)
    (an epoch is `per_epoch` positions); `epochs(start, count)`: the epoch of each.
    `length_of(positions)` returns the samples' lengths in tokens."""

    order = "bucketed-pools"  # what a checkpoint records (the trainer's data_order)

    def __init__(self, num_samples: int, length_of: Callable[[np.ndarray], np.ndarray], *, global_batch: int,
                 seed: int, pool_batches: int = POOL_BATCHES, legacy: Optional[Callable[[Optional[str]], object]] = None):
        if num_samples < global_batch:
            raise ValueError(f"{num_samples} samples hold no global batch of {global_batch}")
        self.num_samples, self.length_of, self.seed = num_samples, length_of, seed
        self.global_batch, self.pool_batches = global_batch, pool_batches
        self.batches_per_epoch = num_samples // global_batch
        self.per_epoch = self.batches_per_epoch * global_batch
        self._legacy = legacy
        self._pools: "OrderedDict[tuple, np.ndarray]" = OrderedDict()
        self._orders: dict = {}

    # -- the order ----------------------------------------------------------------------------
    def _order(self, epoch: int, salt: int) -> FeistelOrder:
        key = (epoch, salt)
        if key not in self._orders:
            if len(self._orders) > 4:
                self._orders.clear()
            n = self.num_samples if salt == 0 else self.batches_per_epoch
            self._orders[key] = FeistelOrder(n, self.seed, epoch, salt=salt)
        return self._orders[key]

    def _pool(self, epoch: int, pool: int) -> np.ndarray:
        """Pool `pool` of epoch `epoch`: its training-set positions sorted by length (stable)."""
        key = (epoch, pool)
        if key in self._pools:
            self._pools.move_to_end(key)
            return self._pools[key]
        size = self.pool_batches * self.global_batch
        first = pool * size
        members = self._order(epoch, 0)(np.arange(first, min(first + size, self.per_epoch)))
        lengths = np.asarray(self.length_of(members))
        members = members[np.argsort(lengths, kind="stable")]
        self._pools[key] = members
        if len(self._pools) > 2:
            self._pools.popitem(last=False)
        return members

    def batch(self, epoch: int, step: int) -> np.ndarray:
        """The training-set positions of the epoch's `step`-th global batch, in ascending length."""
        which = int(self._order(epoch, 1)(np.array([step]))[0])
        pool, within = divmod(which, self.pool_batches)
        b = self.global_batch
        return self._pool(epoch, pool)[within * b:(within + 1) * b]

    def indices(self, start: int, count: int) -> np.ndarray:
        out = np.empty(count, dtype=np.int64)
        done = 0
        while done < count:  # one slice per global batch the positions fall in
            epoch, offset = divmod(start + done, self.per_epoch)
            step, at = divmod(offset, self.global_batch)
            take = min(count - done, self.global_batch - at)
            out[done:done + take] = self.batch(epoch, step)[at:at + take]
            done += take
        return out

    def epochs(self, start: int, count: int) -> np.ndarray:
        return np.arange(start, start + count) // self.per_epoch

    # -- what the run reports -------------------------------------------------------------------
    def padding_efficiency(self, samples: int, micro_batch: int, pad_to: Optional[int] = None) -> float:
        """Real tokens / padded slots of micro-batches of `micro_batch` over the stream's first
        `samples` samples (at most its first PADDING_STEPS global batches: an estimate of a long
        run's, O(those batches) to count), each padded to its longest sample or to `pad_to`."""
        if samples % micro_batch or self.global_batch % micro_batch:
            raise ValueError(f"micro_batch={micro_batch} must divide samples={samples} and the global batch "
                             f"({self.global_batch} samples)")
        real = slots = 0
        for start in range(0, min(samples, PADDING_STEPS * self.global_batch), self.global_batch):
            take = min(self.global_batch, samples - start)
            per_micro = np.asarray(self.length_of(self.indices(start, take))).reshape(-1, micro_batch)
            real += int(per_micro.sum())
            slots += micro_batch * (pad_to * len(per_micro) if pad_to else int(per_micro.max(axis=1).sum()))
        return real / slots if slots else 1.0

    # -- resuming -------------------------------------------------------------------------------
    def restored(self, saved: Optional[str]):
        """The stream a checkpoint written with order `saved` goes on with: this one, or
        `legacy(saved)`, the order of runs started before this one was (BERT's whole-epoch
        `BucketedStream`, recorded as "bucketed" or as nothing; a chat run's unbucketed order), so
        an epoch goes on as it began."""
        if saved == self.order or self._legacy is None:
            return self
        return self._legacy(saved)
