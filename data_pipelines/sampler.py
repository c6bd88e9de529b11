"""Length-bucketed batch sampler for padded batches, split over data-parallel ranks.

This module owns the order in which samples are batched for models that pad every
batch to its longest sample (BERT and friends): the per-epoch shuffle, bucketing by
length so that padding stays small, the split of batches over data-parallel ranks and
the resumable position inside an epoch. ``padding_efficiency`` measures the result.

Usage::

    sampler = BucketedBatchSampler(lengths, max_tokens=16384, dp_rank=rank,
                                   dp_size=world, seed=cfg.seed)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=pad_collate)
    for epoch in range(start_epoch, num_epochs):
        sampler.set_epoch(epoch)  # keeps a position restored by load_state_dict
        for batch in loader:
            ...
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

_STATE_KEYS = ("epoch", "batches_consumed", "seed")


class BucketedBatchSampler:
    """Yields lists of sample indices of similar length, usable as a DataLoader batch_sampler.

    One epoch is built from ``(seed, epoch)`` alone:

    1. permute the sample indices (identity when ``shuffle=False``);
    2. cut the permutation into pools of ``pool_size`` batches' worth of data:
       ``pool_size * batch_size`` samples, or with ``max_tokens`` consecutive runs of
       ``pool_size * max_tokens`` tokens;
    3. sort each pool by length (stable) and cut it into batches of ``batch_size``
       samples, or into the longest runs whose padded size ``max_len * n`` stays within
       ``max_tokens``. A sample longer than ``max_tokens`` cannot be split, so it forms
       a batch of its own: the only batches that exceed the budget;
    4. shuffle the order of the batches (kept as is when ``shuffle=False``).

    That gives the epoch's *global* list of batches, which does not depend on the
    data-parallel layout. Rank ``r`` takes global batches ``r, r + dp_size, ...``, so the
    ranks see disjoint samples, and every rank gets the same number of batches:

    * ``drop_last=True``: the last ``num_batches % dp_size`` global batches are dropped,
      and in ``batch_size`` mode so is the incomplete last batch;
    * ``drop_last=False``: the incomplete last batch is kept, and the global list is
      padded to a multiple of ``dp_size`` by repeating the epoch's first batches, so up
      to ``dp_size - 1`` batches are seen twice in an epoch.

    Resuming: ``state_dict()['batches_consumed']`` counts the *global* batches (all ranks
    together) handed out in the current epoch. After ``load_state_dict`` the next
    iteration continues after that many global batches; the remaining ones are dealt out
    by the rule above for the current ``dp_size``, which may differ from the one that
    saved the state, and no batch is repeated or skipped. Save the state where every
    rank has taken the same number of batches, so that the count is a multiple of the
    old ``dp_size`` (every rank then reports the same count). The count is of batches
    this sampler handed out; a DataLoader with workers runs ahead of the training step,
    so in that case save ``{"epoch", "batches_consumed": steps_done * dp_size, "seed"}``
    from the training loop instead.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        *,
        batch_size: int | None = None,
        max_tokens: int | None = None,
        dp_rank: int,
        dp_size: int,
        seed: int,
        pool_size: int = 100,
        shuffle: bool = True,
        drop_last: bool = True,
    ) -> None:
        name = type(self).__name__
        if (batch_size is None) == (max_tokens is None):
            raise ValueError(
                f"{name}: got batch_size={batch_size} and max_tokens={max_tokens}; "
                "pass exactly one of them (samples per batch, or a padded-token budget)"
            )
        for arg, value in (("batch_size", batch_size), ("max_tokens", max_tokens),
                           ("pool_size", pool_size), ("dp_size", dp_size)):
            if value is not None and value < 1:
                raise ValueError(f"{name}: {arg}={value} must be >= 1")
        if not 0 <= dp_rank < dp_size:
            raise ValueError(
                f"{name}: dp_rank={dp_rank} is outside [0, dp_size={dp_size}); "
                "pass this process's rank within its data-parallel group"
            )
        if seed < 0:
            raise ValueError(f"{name}: seed={seed} must be >= 0")
        lengths_array = np.asarray(lengths)
        if lengths_array.ndim != 1 or lengths_array.size == 0:
            raise ValueError(
                f"{name}: lengths must be a non-empty 1-D sequence of ints, "
                f"got shape {lengths_array.shape}"
            )
        if not np.issubdtype(lengths_array.dtype, np.integer):
            raise ValueError(
                f"{name}: lengths must be ints (token counts), got dtype {lengths_array.dtype}"
            )
        if lengths_array.min() < 1:
            bad = int(np.argmin(lengths_array))
            raise ValueError(
                f"{name}: lengths[{bad}]={lengths_array[bad]} must be >= 1; "
                "filter out empty samples before building the sampler"
            )

        self.lengths = lengths_array.astype(np.int64)
        self.batch_size = batch_size
        self.max_tokens = max_tokens
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.seed = seed
        self.pool_size = pool_size
        self.shuffle = shuffle
        self.drop_last = drop_last

        self._epoch = 0
        self._consumed = 0  # global batches handed out in this epoch (what state_dict says)
        self._resume_at = 0  # global position the next __iter__ starts from
        self._cached_epoch: int | None = None
        self._cached_batches: list[np.ndarray] = []

        if len(self) == 0:
            num_global = len(self._global_batches())
            raise ValueError(
                f"{name}: {self.lengths.size} samples make {num_global} batches in epoch 0, "
                f"fewer than dp_size={dp_size}, so with drop_last=True every rank gets none; "
                "use a smaller batch_size/max_tokens or drop_last=False"
            )

    # --- epoch and position -------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch to iterate. Moving to another epoch starts it from its first
        batch; setting the epoch already set keeps a position restored by load_state_dict."""
        if epoch < 0:
            raise ValueError(f"{type(self).__name__}.set_epoch: epoch={epoch} must be >= 0")
        if epoch != self._epoch:
            self._epoch = epoch
            self._consumed = 0
            self._resume_at = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self._epoch, "batches_consumed": self._consumed, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        name = f"{type(self).__name__}.load_state_dict"
        missing = [key for key in _STATE_KEYS if key not in state]
        if missing:
            raise ValueError(f"{name}: state is missing {missing}; expected keys {list(_STATE_KEYS)}")
        if state["seed"] != self.seed:
            raise ValueError(
                f"{name}: state was saved with seed={state['seed']} but this sampler has "
                f"seed={self.seed}; the position only means something for the same seed, "
                "so build the sampler with the checkpoint's seed"
            )
        epoch, consumed = int(state["epoch"]), int(state["batches_consumed"])
        if epoch < 0 or consumed < 0:
            raise ValueError(
                f"{name}: epoch={epoch} and batches_consumed={consumed} must both be >= 0"
            )
        self._epoch = epoch
        self._consumed = consumed
        self._resume_at = consumed

    # --- iteration ----------------------------------------------------------------

    def __iter__(self) -> Iterator[list[int]]:
        start, self._resume_at = self._resume_at, 0
        self._consumed = start
        for batch in self._rank_batches(start):
            # Counted before the yield: once the caller holds k batches, the state says so.
            self._consumed += self.dp_size
            yield batch.tolist()

    def __len__(self) -> int:
        """Batches this rank gets in a whole epoch (a resumed epoch yields the rest only)."""
        num_global = len(self._global_batches())
        if self.drop_last:
            return num_global // self.dp_size
        return -(-num_global // self.dp_size)

    def _rank_batches(self, start: int) -> list[np.ndarray]:
        """This rank's share of the epoch's global batches from position ``start`` on."""
        batches = self._global_batches()
        remaining = batches[start:]
        if self.drop_last:
            remaining = remaining[: len(remaining) - len(remaining) % self.dp_size]
        elif remaining:
            padding = -len(remaining) % self.dp_size
            remaining = remaining + [batches[i % len(batches)] for i in range(padding)]
        return remaining[self.dp_rank :: self.dp_size]

    def _global_batches(self) -> list[np.ndarray]:
        if self._cached_epoch != self._epoch:
            self._cached_batches = self._build_epoch(self._epoch)
            self._cached_epoch = self._epoch
        return self._cached_batches

    def _build_epoch(self, epoch: int) -> list[np.ndarray]:
        """The epoch's global list of batches (steps 1-4 of the class docstring)."""
        rng = np.random.default_rng([self.seed, epoch])
        num_samples = self.lengths.size
        order = rng.permutation(num_samples) if self.shuffle else np.arange(num_samples)
        lengths = self.lengths[order]
        if self.batch_size is not None:
            pool_id = np.arange(num_samples) // (self.pool_size * self.batch_size)
        else:
            # A pool takes samples until it holds pool_size * max_tokens tokens.
            tokens_before = np.cumsum(lengths) - lengths
            pool_id = tokens_before // (self.pool_size * self.max_tokens)
        by_pool_then_length = np.lexsort((lengths, pool_id))  # stable
        order = order[by_pool_then_length]

        if self.batch_size is not None:
            # Pools hold whole batches, so fixed-size cuts never straddle two pools.
            batches = [order[i : i + self.batch_size]
                       for i in range(0, num_samples, self.batch_size)]
            if self.drop_last and num_samples % self.batch_size:
                batches.pop()
        else:
            starts = _token_budget_starts(
                lengths[by_pool_then_length].tolist(),
                pool_id[by_pool_then_length].tolist(),
                self.max_tokens,
            )
            batches = np.split(order, starts[1:])

        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches


def _token_budget_starts(lengths: list[int], pool_id: list[int], max_tokens: int) -> list[int]:
    """Start offsets of greedy batches over samples sorted by length within each pool.

    A batch grows while ``max_len * n <= max_tokens``; since lengths ascend within a pool,
    the newest sample is the batch's longest. A sample over the budget starts a batch and
    the next one (longer still) starts another, so it ends up alone.
    """
    starts = [0]
    for i in range(1, len(lengths)):
        new_pool = pool_id[i] != pool_id[i - 1]
        if new_pool or lengths[i] * (i - starts[-1] + 1) > max_tokens:
            starts.append(i)
    return starts


def padding_efficiency(batches: Iterable[Sequence[int]], lengths: Sequence[int]) -> float:
    """Real tokens / padded slots when every batch is padded to its longest sample."""
    lengths_array = np.asarray(lengths)
    real = padded = 0
    num_batches = 0
    for batch in batches:
        num_batches += 1
        if len(batch) == 0:
            continue
        batch_lengths = lengths_array[np.asarray(batch)]
        real += int(batch_lengths.sum())
        padded += int(batch_lengths.max()) * len(batch)
    if padded == 0:
        raise ValueError(
            f"padding_efficiency: the {num_batches} batches hold no tokens; "
            "pass at least one non-empty batch of samples with length >= 1"
        )
    return real / padded
