"""Prepared corpora mixed by tokens (`data.mix` of the causal LMs).

Each source is a prepared directory (data=prepared's, or a text source tokenized into the
cache), cut into blocks of block_size + 1 tokens and split into train and held-out blocks as
alone. The mixture trains on each source's train blocks in proportion to its weight, by
tokens: source i gets total x w_i / sum(w) tokens' worth of blocks, its blocks repeated
(whole, in order) or cut, where total is the smallest size that holds every source at least
once. It evaluates on every source's held-out blocks, each once, so no held-out block is
ever trained on. A mixture index is (source, block) by arithmetic over the per-source
counts: nothing per block is held, whatever the corpora's size.
"""
from __future__ import annotations

from typing import List, Sequence

import numpy as np

from zoo.run.errors import DataError


class _Concat:
    """Rows of several parts, part i's rows repeated or cut to counts[i]."""

    def __init__(self, parts: Sequence, counts: Sequence[int]):
        self.parts, self.counts = list(parts), np.asarray(counts, dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.counts)])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _one(self, k: int) -> np.ndarray:
        i = int(np.searchsorted(self.starts, k, side="right")) - 1
        part = self.parts[i]
        return np.asarray(part[np.asarray([(k - int(self.starts[i])) % len(part)])])[0]

    def __getitem__(self, index):
        if np.ndim(index) == 0:
            return self._one(int(index))
        return np.stack([self._one(int(k)) for k in np.asarray(index)])


class MixedBlocks:
    """`parts` (PreparedBlocks of one tokenizer) mixed by `weights` over their train blocks."""

    def __init__(self, parts: Sequence, weights: Sequence[float], names: Sequence[str]):
        if len(parts) != len(weights) or any(w <= 0 for w in weights):
            raise DataError(f"data.mix weights {list(weights)} must be positive, one per source")
        for part, name in zip(parts, names):
            if len(part.train) == 0:
                raise DataError(f"data.mix source {name} has no block to train on; give it more text")
        share = np.asarray(weights, dtype=np.float64) / float(sum(weights))
        sizes = np.asarray([len(p.train) for p in parts], dtype=np.float64)
        total = float(np.max(sizes / share))  # every source at least once
        counts = [max(1, int(round(total * s))) for s in share]
        self.train = _Concat([p.train for p in parts], counts)
        self.eval = _Concat([p.eval for p in parts], [len(p.eval) for p in parts])
        ends = {p.meta.get("eos_id") for p in parts}
        skipped: dict = {}
        for p in parts:
            for k, v in (p.meta.get("skipped") or {}).items():
                skipped[k] = skipped.get(k, 0) + v
        self.sources: List[dict] = [
            {"source": name, "weight": float(w), "blocks": int(len(p.train)), "mixed_blocks": int(c),
             "share_of_tokens": round(c / len(self.train), 4)} for name, w, p, c in zip(names, weights, parts, counts)]
        self.meta = {"documents": sum(int(p.meta.get("documents", 0)) for p in parts),
                     "tokens": sum(int(p.meta.get("tokens", 0)) for p in parts),
                     "tail_tokens_dropped": sum(int(p.meta.get("tail_tokens_dropped", 0)) for p in parts),
                     "train_blocks": len(self.train), "eval_blocks": len(self.eval), "eos_id": ends.pop(),
                     "skipped": skipped, "mix": self.sources}
        # The unigram baseline over the mixture's train tokens: each source's counts as often as it is repeated.
        self.unigram_counts = sum(p.unigram_counts.astype(np.float64) * (c / len(p.train))
                                  for p, c in zip(parts, counts))
