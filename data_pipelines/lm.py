"""Language-model data: a text source tokenized once into the cache, and the split of blocks.

`prepare_cached` streams a source (data_pipelines.text_sources) through the sharded
preparation (data_pipelines.prepare: documents each followed by an end-of-text token,
tokenized by --workers processes, written as token shards) into a cache entry keyed by the
source's content and the tokenizer; training reads it as data=prepared does
(PreparedBlocks): blocks of block_size + 1 tokens (inputs are [:-1], targets [1:]), every
token in exactly one block (the tail shorter than a block dropped and counted), every k-th
block (k = round(1 / eval_fraction)) held out, at least one. `pack` and
`tokenize_documents` are the in-memory form of the same (benchmarks/data_pipeline.py).
"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import List, Optional

import numpy as np

from data_pipelines.cache import cache_key, cache_root, cached_dir


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


def prepare_cached(source, tokenizer_dir: str, *, cache_dir: Optional[str] = None,
                   workers: Optional[int] = None) -> Path:
    """The cache entry holding `source` (a data_pipelines.text_sources.TextSource) tokenized by
    `tokenizer_dir`: a prepared directory (data_pipelines.prepare's shards, streamed from the
    source by `workers` processes, never a list of its texts), read like data=prepared. Keyed by
    the source's content key and the tokenizer, not by block size or split: blocks are cut when
    read, so another model.block_size reuses it. Built once under the cache's lock (the first
    rank builds, the others wait), with a progress line every few seconds."""
    from data_pipelines.prepare import Progress, prepare

    tok_json = Path(tokenizer_dir) / "tokenizer.json"
    tok_id = hashlib.sha256(tok_json.read_bytes()).hexdigest() if tok_json.exists() else str(tokenizer_dir)
    entry = cache_root(cache_dir) / "datasets" / f"tokens-{cache_key(source=source.key, tokenizer=tok_id)}"

    def build(tmp: Path) -> None:
        print(f"zoo: data: tokenizing {source.describe()} into the cache ({entry.name}) once; later runs reuse it",
              file=sys.stderr, flush=True)
        prepare(source.name, source.path, str(tokenizer_dir), tmp, text_column=source.column, workers=workers,
                source=source, progress=Progress(every_s=10.0))

    return cached_dir(entry, build)


def unigram_perplexity(train: np.ndarray, held: np.ndarray, vocab_size: int) -> float:
    """Perplexity of the add-one unigram model of the train targets on the held-out targets."""
    counts = np.bincount(train[:, 1:].ravel(), minlength=vocab_size).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(np.exp(-logp[held[:, 1:].ravel()].mean()))
