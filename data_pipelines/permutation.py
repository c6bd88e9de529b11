"""An epoch's shuffled order computed position by position: nothing of size n is ever held.

A rank of a pretraining run reads a few micro-batches a step, yet holding the epoch's order
as an array costs 4 B a sample on every rank (at 1T tokens in blocks of 2,049: 488M blocks,
1.95 GB a rank). `FeistelOrder` is a keyed pseudorandom permutation of [0, n) evaluated on
just the positions asked for: a balanced Feistel network on the smallest even number of bits
that covers n (a bijection of [0, 2^bits), whatever its round function), restricted to [0, n)
by cycle walking (re-encrypting a value until it lands below n, which keeps it a bijection;
2^bits < 4n, so under four rounds of walking on average). The round function is SplitMix64's
finaliser of the half-block xor a round key; the keys come from numpy's SeedSequence of
(seed, epoch). Six rounds: well past the three or four a Feistel network needs to look
random to an observer without the key (Luby-Rackoff), for the price of a few microseconds a
micro-batch.
"""
from __future__ import annotations

import numpy as np

ROUNDS = 6
_C1, _C2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S27, _S30, _S31 = np.uint64(27), np.uint64(30), np.uint64(31)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, element-wise on uint64 (wrapping multiplication)."""
    x = (x ^ (x >> _S30)) * _C1
    x = (x ^ (x >> _S27)) * _C2
    return x ^ (x >> _S31)


class FeistelOrder:
    """order(positions) -> the samples at those positions of a permutation of range(n) keyed
    by (seed, epoch): every sample exactly once an epoch, a different order each epoch."""

    def __init__(self, n: int, seed: int, epoch: int, salt: int = 0):
        """`salt` > 0 keys an independent permutation of the same (seed, epoch), e.g. the order
        of an epoch's batches beside the order of its samples; 0 is the samples' key."""
        if n <= 0:
            raise ValueError(f"a permutation of {n} elements")
        half = max(1, -(-max(n - 1, 1).bit_length() // 2))
        self.n, self.half = n, np.uint64(half)
        self.mask = np.uint64((1 << half) - 1)
        entropy = [seed, epoch, salt] if salt else [seed, epoch]
        self.keys = np.random.SeedSequence(entropy).generate_state(ROUNDS, dtype=np.uint64)

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self.half, x & self.mask
        for key in self.keys:
            left, right = right, left ^ (_mix(right ^ key) & self.mask)
        return (left << self.half) | right

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= self.n):
            raise IndexError(f"positions outside [0, {self.n})")
        out = positions.astype(np.uint64)
        walking = np.arange(out.size)
        while walking.size:  # cycle walking: stays a bijection of [0, n)
            out[walking] = self._encrypt(out[walking])
            walking = walking[out[walking] >= np.uint64(self.n)]
        return out.astype(np.int64)
