"""Incremental decoding: each attention module keeps the keys and values of the tokens already
run, so a sampled token costs one position's forward instead of the whole context's.

`decoding(model, max_len)` turns it on for every module under `model` that reads a cache (the
attention modules, GPT's position table): a plain model, a tensor-parallel one (each rank keeps
its own heads) or one pipeline stage (its own layers). The first forward is the prompt
(positions 0..T-1, causal); each later one is one token at position `cache.length`; the caller
advances the cache after each forward. Memory: `max_len` positions of this rank's heads per
layer, allocated at the prompt.
"""
from __future__ import annotations

import contextlib
from typing import Dict, Iterator, Tuple

import torch
import torch.nn as nn

from zoo.models.documents import attention_mask


class DecodeCache:
    """The keys and values of positions 0..length-1, per attention module."""

    def __init__(self, max_len: int):
        self.max_len, self.length = max_len, 0
        self._kv: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def prompt(self) -> bool:
        """The forward in progress is the prompt's (causal among its own tokens)."""
        return self.length == 0

    def extend(self, owner: nn.Module, k: torch.Tensor, v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Append (B, heads, T, head_dim) keys and values at `length`; all of them so far."""
        T = k.shape[2]
        if not self.prompt and T != 1:
            raise ValueError(f"a cached forward after the prompt takes one token, got {T}")
        if self.length + T > self.max_len:
            raise ValueError(f"the decode cache holds {self.max_len} positions; {self.length} + {T} exceed it")
        if id(owner) not in self._kv:
            B, H, _, D = k.shape
            self._kv[id(owner)] = tuple(k.new_empty(B, H, self.max_len, D) for _ in range(2))
        keys, values = self._kv[id(owner)]
        end = self.length + T
        keys[:, :, self.length:end] = k
        values[:, :, self.length:end] = v
        return keys[:, :, :end], values[:, :, :end]

    def advance(self, T: int) -> None:
        self.length += T

    def clear(self) -> None:
        self._kv.clear()
        self.length = 0


class ReadsDecodeCache:
    """A module that uses the cache while `decoding` is on (None otherwise)."""

    decode_cache: "DecodeCache | None" = None

    def cache_start(self) -> int:
        """The position of this forward's first token: 0 without a cache."""
        return 0 if self.decode_cache is None else self.decode_cache.length

    def keys_and_mask(self, positions, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype) -> tuple:
        """(keys, values, mask, causal) of an attention layer's whole-sequence call: the document
        mask where `positions` are given (zoo.models.documents), else causal; while decoding, every
        key and value so far, causal only for the prompt (a later token attends to all of them)."""
        mask = None if positions is None else attention_mask(positions, dtype)
        causal = mask is None
        if self.decode_cache is not None:
            k, v = self.decode_cache.extend(self, k, v)
            causal = self.decode_cache.prompt
        return k, v, mask, causal


@contextlib.contextmanager
def decoding(model: nn.Module, max_len: int) -> Iterator[DecodeCache]:
    """The cache, read by every module under `model` that reads one, until the block ends."""
    cache = DecodeCache(max_len)
    readers = [m for m in model.modules() if isinstance(m, ReadsDecodeCache)]
    for m in readers:
        m.decode_cache = cache
    try:
        yield cache
    finally:
        for m in readers:
            del m.decode_cache  # back to the class's None
        cache.clear()
