"""Which samples each rank reads at each step, independent of the parallel layout.

The sample stream is the concatenation of per-epoch permutations (seeded by seed and
epoch). A step of global batch B that starts after `consumed` samples reads positions
[consumed, consumed + B); the
data-parallel rank d takes the d-th contiguous slice of B/dp of them, cut into micro-
batches. So the data position is one integer (samples consumed), which carries over
unchanged when tp, pp or dp change, and every layout sees the same samples per step.
"""
from __future__ import annotations

import numpy as np

from zoo.run.errors import DataError


class SampleStream:
    def __init__(self, num_samples: int, seed: int, shuffle: bool = True):
        if num_samples <= 0:
            raise DataError("the dataset is empty: no samples to train on")
        self.num_samples = num_samples
        self.seed = seed
        self.shuffle = shuffle
        self._perm_epoch = -1
        self._perm = None

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._perm_epoch:
            if self.shuffle:
                self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)
            else:
                self._perm = np.arange(self.num_samples)
            self._perm_epoch = epoch
        return self._perm

    def indices(self, start: int, count: int) -> np.ndarray:
        """Sample indices at stream positions [start, start + count)."""
        out = np.empty(count, dtype=np.int64)
        for i, pos in enumerate(range(start, start + count)):
            epoch, within = divmod(pos, self.num_samples)
            out[i] = self._permutation(epoch)[within]
        return out


def micro_batch_start(consumed: int, micro: int, *, global_batch: int, micro_batch: int, dp_rank: int,
                      dp_size: int) -> int:
    """First stream position of micro-batch `micro` of `dp_rank` in the step that starts
    after `consumed` samples (the layout-free data position)."""
    return consumed + dp_rank * (global_batch // dp_size) + micro * micro_batch
