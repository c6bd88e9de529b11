"""Language-model data: tokenize documents once (batched `datasets.map`), concatenate them
with an end-of-text token and pack the stream into fixed-length blocks: zero padding.

Blocks hold block_size + 1 tokens (inputs are [:-1], targets [1:]); every token of the
corpus lands in exactly one block (the tail shorter than a block is dropped and counted).
Every k-th block (k = round(1 / eval_fraction)) is held out for evaluation, at least one. The result is
cached as .npy files keyed by source, tokenizer and settings, and read memory-mapped.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import numpy as np

from data_pipelines.cache import cache_key, cache_root, cached_dir
from zoo.run.errors import DataError


@dataclass
class PackedBlocks:
    train: np.ndarray  # (N_train, block_size + 1) int32, memory-mapped
    eval: np.ndarray  # (N_eval, block_size + 1)
    meta: dict


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


def held_out(n: int, eval_fraction: float) -> np.ndarray:
    """Which of n blocks are held out: every k-th (k = round(1 / eval_fraction)), and at least
    one where there are two or more (a corpus of fewer than k blocks still evaluates)."""
    held = np.zeros(n, dtype=bool)
    if eval_fraction > 0 and n >= 2:
        k = min(max(2, round(1 / eval_fraction)), n)
        held[k - 1 :: k] = True
    return held


def split_eval(blocks: np.ndarray, eval_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    held = held_out(len(blocks), eval_fraction)
    return blocks[~held], blocks[held]


def prepare_packed_blocks(docs: List[str], tokenizer_dir: str, *, block_size: int, eval_fraction: float,
                          source_key: str, cache_dir: Optional[str] = None, num_proc: int = 1) -> Path:
    """Build (or find) the cached packed blocks of `docs`; returns the cache entry."""
    tok_meta = json.loads((Path(tokenizer_dir) / "tokenizer.json").read_text())
    key = cache_key(source=source_key, tokenizer=tok_meta, block=block_size, eval=eval_fraction)
    entry = cache_root(cache_dir) / "datasets" / f"packed-{key}"

    def build(tmp: Path) -> None:
        from transformers import AutoTokenizer

        eos_id = AutoTokenizer.from_pretrained(tokenizer_dir).eos_token_id
        if eos_id is None:
            raise DataError(f"tokenizer at {tokenizer_dir} has no end-of-text token; packing needs one")
        doc_ids = tokenize_documents(docs, tokenizer_dir, num_proc)
        blocks, tail = pack(doc_ids, eos_id, block_size)
        if len(blocks) < 2:
            raise DataError(f"the source yields {len(blocks)} blocks of {block_size + 1} tokens; "
                             f"use more text or a smaller model.block_size")
        train, held = split_eval(blocks, eval_fraction)
        np.save(tmp / "train.npy", train)
        np.save(tmp / "eval.npy", held)
        counts = np.bincount(train[:, :-1].ravel(), minlength=0)
        np.save(tmp / "unigram_counts.npy", counts)
        meta = {"documents": len(docs), "tokens": int(sum(len(d) + 1 for d in doc_ids)),
                "tail_tokens_dropped": int(tail), "block_size": block_size, "eos_id": int(eos_id),
                "train_blocks": int(len(train)), "eval_blocks": int(len(held))}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))

    return cached_dir(entry, build)


def load_packed_blocks(entry: Path) -> PackedBlocks:
    return PackedBlocks(train=np.load(entry / "train.npy", mmap_mode="r"),
                        eval=np.load(entry / "eval.npy", mmap_mode="r"),
                        meta=json.loads((entry / "meta.json").read_text()))


def unigram_perplexity(train: np.ndarray, held: np.ndarray, vocab_size: int) -> float:
    """Perplexity of the add-one unigram model of the train targets on the held-out targets."""
    counts = np.bincount(train[:, 1:].ravel(), minlength=vocab_size).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(np.exp(-logp[held[:, 1:].ravel()].mean()))
