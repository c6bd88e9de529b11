"""Language-model data: packing documents into blocks, and the split of blocks.

A text source is tokenized once into the cache by data_pipelines.token_cache (the sharded
preparation) and read as data=prepared is (data_pipelines.prepare.PreparedBlocks): blocks of
block_size + 1 tokens (inputs are [:-1], targets [1:]), every token in exactly one block (the tail shorter than a block dropped and counted), every k-th
block (k = round(1 / eval_fraction)) held out, at least one. `pack` and
`tokenize_documents` are the in-memory form of the same (benchmarks/data_pipeline.py).
"""
from __future__ import annotations

from typing import List

import numpy as np


def tokenize_documents(docs: List[str], tokenizer_dir: str, num_proc: int = 1) -> List[List[int]]:
    """Token ids of each document, through a fast tokenizer in batched `datasets.map`."""
    import datasets
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir, use_fast=True)
    ds = datasets.Dataset.from_dict({"text": docs})
    datasets.disable_progress_bars()  # one map over a corpus; a bar per rank is noise
    ds = ds.map(lambda b: {"ids": tok(b["text"], add_special_tokens=False)["input_ids"]},
                batched=True, remove_columns=["text"], num_proc=num_proc if num_proc > 1 else None,
                load_from_cache_file=False, desc=None)
    return ds["ids"]


def pack(doc_ids: List[List[int]], eos_id: int, block_size: int) -> tuple[np.ndarray, int]:
    """Concatenate documents, each followed by `eos_id`, into (N, block_size + 1) blocks.

    Returns the blocks and the number of tail tokens that did not fill a block.
    """
    stream = np.fromiter((t for ids in doc_ids for t in (*ids, eos_id)), dtype=np.int32)
    width = block_size + 1
    n = len(stream) // width
    return stream[: n * width].reshape(n, width), len(stream) - n * width


def held_out_period(n: int, eval_fraction: float) -> int:
    """k: every k-th of n blocks is held out (blocks k - 1, 2k - 1, ...); 0 where none is.
    k = round(1 / eval_fraction), at least 2 and at most n, so that a corpus of fewer than
    k blocks still evaluates (on its last block) where it has two or more."""
    if eval_fraction > 0 and n >= 2:
        return min(max(2, round(1 / eval_fraction)), n)
    return 0


def held_out(n: int, eval_fraction: float) -> np.ndarray:
    """Which of n blocks are held out, as a mask (the in-memory form; `BlockSplit` is the
    same split by arithmetic, for a corpus of any size)."""
    held = np.zeros(n, dtype=bool)
    k = held_out_period(n, eval_fraction)
    if k:
        held[k - 1 :: k] = True
    return held


class BlockSplit:
    """The block numbers of one side of `held_out(n, eval_fraction)` (`held`: the held-out
    blocks, else the trained ones) in order, computed from the index: the numbers
    np.flatnonzero(mask) would give, with nothing stored per block. A prepared corpus of
    100B tokens is 49M blocks of 2,049 tokens; the mask and the index arrays held 9 bytes a
    block on every rank, 440 MB (benchmarks/data_index_memory.py)."""

    def __init__(self, n: int, eval_fraction: float, held: bool):
        self.k, self.held = held_out_period(n, eval_fraction), held
        self.length = (n // self.k if held else n - n // self.k) if self.k else (0 if held else n)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i):
        i = np.asarray(i, dtype=np.int64)
        if np.any(i >= self.length) or np.any(i < -self.length):
            raise IndexError(f"block {i} of a split of {self.length}")
        i = np.where(i < 0, i + self.length, i)
        if not self.k:
            return i
        if self.held:
            return (i + 1) * self.k - 1
        return (i // (self.k - 1)) * self.k + i % (self.k - 1)


def split_eval(blocks: np.ndarray, eval_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    held = held_out(len(blocks), eval_fraction)
    return blocks[~held], blocks[held]


def unigram_perplexity(train: np.ndarray, held: np.ndarray, vocab_size: int) -> float:
    """Perplexity of the add-one unigram model of the train targets on the held-out targets."""
    counts = np.bincount(train[:, 1:].ravel(), minlength=vocab_size).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(np.exp(-logp[held[:, 1:].ravel()].mean()))
