"""Rendered conversations packed into blocks, written as a prepared directory with the target
mask beside the tokens, and read back as blocks with their masks.

Each block is block_size + 1 tokens that start with a conversation: conversations are placed
whole, each followed by the separator (but at a block's end; a token none of them holds: with
data.document_mask it ends a document, so no conversation attends to another and positions
restart), each into the first of the open blocks it fits (first fit), the rest of a block
filled with the separator (`packing`: true). `packing: false` gives every
conversation a row of its own, which training cuts to the longest row of each micro-batch
(`row_lengths`; zoo.families.causal_lm_task orders them by length). A conversation longer than
the block is cut at its end (`truncate: end`) or refused (`truncate: refuse`). The directory
holds tokens-00000.bin (as data_pipelines.prepare writes them: data=prepared reads it),
mask-00000.bin (uint8, 1 where the token is a target), lengths-00000.npy (each row's tokens
before its padding: a directory written before it has them counted from the rows when asked)
and meta.json (`format: zoo-chat-1`, the block size it was packed for, what was counted).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np

from data_pipelines.lm import BlockSplit
from data_pipelines.text_sources import DataError

FORMAT = "zoo-chat-1"
TRUNCATE = ("end", "refuse")
LENGTHS = "lengths-00000.npy"


def pick_separator(tokenizer, conversations: List[np.ndarray]) -> int:
    """The token that separates conversations: the first of eos, pad and bos that no
    conversation holds (a chat model's eos often ends every turn: Qwen's <|im_end|>)."""
    held = np.unique(np.concatenate([np.asarray(ids, dtype=np.int64) for ids in conversations])) if conversations \
        else np.zeros(0, np.int64)
    return separator_not_in(tokenizer, held)


def separator_not_in(tokenizer, held) -> int:
    """`pick_separator` given the ids the conversations hold (any collection of ints)."""
    held = set(np.asarray(held).tolist())
    names = ("eos_token_id", "pad_token_id", "bos_token_id")
    for name in names:
        token = getattr(tokenizer, name, None)
        if token is not None and token not in held:
            return int(token)
    raise DataError(f"every one of the tokenizer's eos, pad and bos tokens "
                    f"({[getattr(tokenizer, n, None) for n in names]}) occurs inside the conversations, so none can "
                    f"separate them; give a tokenizer with a token the template does not use (e.g. a pad token)")


OPEN_BLOCKS = 64
"""Blocks packing keeps open at once: a conversation goes into the first of them it fits."""


def pack_rows(conversations: Iterable[Tuple[str, np.ndarray, np.ndarray]], block_size: int, separator: int,
              counts: Dict[str, int], *, packing: bool = True,
              truncate: str = "end") -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """(where, ids, mask) in order -> (tokens, mask) rows of block_size + 1 as blocks close,
    `counts` filled on the way. Packing is first fit over the last OPEN_BLOCKS blocks opened (a
    short conversation fills the room an earlier long one left; the oldest block is closed
    when a new one would be the 65th), deterministic: the same blocks for the same
    conversations. A conversation is held only until its block closes."""
    if truncate not in TRUNCATE:
        raise DataError(f"data.truncate={truncate!r}; use one of {', '.join(TRUNCATE)}")
    width = block_size + 1
    for key in ("conversations", "truncated", "dropped_no_target_left", "padding_tokens", "supervised_tokens"):
        counts.setdefault(key, 0)
    blocks: List[dict] = []  # open, in the order opened: {"t": [...], "m": [...], "used": n}

    def close(block: dict) -> Tuple[np.ndarray, np.ndarray]:
        pad = width - block["used"]
        if pad:
            block["t"].append(np.full(pad, separator, dtype=np.int64))
            block["m"].append(np.zeros(pad, dtype=np.uint8))
            counts["padding_tokens"] += pad
        del blocks[next(i for i, b in enumerate(blocks) if b is block)]  # by identity (== compares arrays)
        row, row_mask = np.concatenate(block["t"]), np.concatenate(block["m"])
        counts["supervised_tokens"] += int(row_mask[1:].sum())  # a block's first token is no one's target
        return row, row_mask

    for where, ids, mask in conversations:
        if len(ids) > width:  # a block holds block_size + 1 tokens: block_size inputs and their targets
            if truncate == "refuse":
                raise DataError(f"{where}: the conversation is {len(ids):,} tokens, more than a block's {width:,} "
                                f"(model.block_size={block_size} + 1); raise model.block_size, set data.truncate=end, "
                                f"or drop the record")
            ids, mask = ids[:width], mask[:width]
            counts["truncated"] += 1
            if not mask[1:].any():  # no target left (a target is a token after the first)
                counts["dropped_no_target_left"] += 1
                continue
        block = next((b for b in blocks if b["used"] + len(ids) <= width), None) if packing else None
        if block is None:
            if len(blocks) >= (OPEN_BLOCKS if packing else 1):
                yield close(blocks[0])
            block = {"t": [], "m": [], "used": 0}
            blocks.append(block)
        block["t"].append(np.asarray(ids, dtype=np.int64))
        block["m"].append(np.asarray(mask, dtype=np.uint8))
        block["used"] += len(ids)
        if block["used"] < width:  # the separator (a block's end separates as well)
            block["t"].append(np.asarray([separator], dtype=np.int64))
            block["m"].append(np.zeros(1, dtype=np.uint8))
            block["used"] += 1
        counts["conversations"] += 1
        if block["used"] >= width:
            yield close(block)
    while blocks:
        yield close(blocks[0])


def pack(conversations: Iterable[Tuple[str, np.ndarray, np.ndarray]], block_size: int, separator: int, *,
         packing: bool = True, truncate: str = "end") -> Tuple[np.ndarray, np.ndarray, Dict[str, int]]:
    """`pack_rows` gathered: (tokens, mask, counts), each of n x (block_size + 1)."""
    counts: Dict[str, int] = {}
    rows = list(pack_rows(conversations, block_size, separator, counts, packing=packing, truncate=truncate))
    width = block_size + 1
    if not rows:
        return np.zeros((0, width), np.int64), np.zeros((0, width), np.uint8), counts
    return np.stack([t for t, _ in rows]), np.stack([m for _, m in rows]), counts


def row_lengths(rows: np.ndarray, separator: int) -> np.ndarray:
    """Each row's tokens up to its last conversation's separator (the padding after it left
    out; a row that ends inside a conversation: the whole row), int32."""
    rows = np.atleast_2d(rows)
    width = rows.shape[1]
    held = rows != separator
    last = width - 1 - np.argmax(held[:, ::-1], axis=1)  # the last token that is no separator
    used = np.where(held.any(axis=1), last + 2, 1)
    return np.minimum(used, width).astype(np.int32)


class BlockWriter:
    """A chat directory written as its rows come (`add`), never held whole: the token and mask
    files appended to, their digests and the unigram counts kept running; `finish` writes the
    lengths, the tokenizer and meta.json, the last under a temporary name, then renamed: a
    directory without it is no chat directory (`is_chat`)."""

    def __init__(self, out: Path, *, vocab: int, separator: int, block_size: int):
        import xxhash

        out.mkdir(parents=True, exist_ok=True)
        self.out, self.vocab, self.separator, self.block_size = out, vocab, separator, block_size
        self.dtype = np.dtype(np.uint16 if vocab <= np.iinfo(np.uint16).max else np.uint32)
        self.tokens, self.mask = open(out / "tokens-00000.bin", "wb"), open(out / "mask-00000.bin", "wb")
        self.token_digest, self.mask_digest = xxhash.xxh3_64(), xxhash.xxh3_64()
        self.unigrams = np.zeros(vocab, dtype=np.int64)
        self.lengths: List[np.ndarray] = []  # 4 bytes a row
        self.count = 0

    def add(self, tokens: np.ndarray, mask: np.ndarray) -> None:
        """Rows (n x (block_size + 1)) appended."""
        if not len(tokens):
            return
        flat, flat_mask = tokens.reshape(-1).astype(self.dtype), mask.reshape(-1).astype(np.uint8)
        self.tokens.write(flat.tobytes())
        self.mask.write(flat_mask.tobytes())
        self.token_digest.update(flat.tobytes())
        self.mask_digest.update(flat_mask.tobytes())
        self.unigrams += np.bincount(flat, minlength=self.vocab)[:self.vocab]
        self.lengths.append(row_lengths(tokens, self.separator))
        self.count += flat.size

    def finish(self, tokenizer_dir: str, meta: dict) -> dict:
        from data_pipelines.tokenizer import save_tokenizer

        self.tokens.close()
        self.mask.close()
        out, itemsize = self.out, self.dtype.itemsize
        np.save(out / LENGTHS, np.concatenate(self.lengths) if self.lengths else np.zeros(0, np.int32))
        np.save(out / "unigram_counts.npy", self.unigrams)
        save_tokenizer(tokenizer_dir, out / "tokenizer")
        record = {"format": FORMAT, "dtype": self.dtype.name, "tokens": self.count, "eos_id": int(self.separator),
                  "vocab": int(self.vocab), "block_size": int(self.block_size),
                  "documents": int(meta.get("conversations", 0)), **meta,
                  "shards": [{"file": "tokens-00000.bin", "tokens": self.count, "bytes": self.count * itemsize,
                              "xxh3_64": self.token_digest.hexdigest()}],
                  "mask_shards": [{"file": "mask-00000.bin", "bytes": self.count,
                                   "xxh3_64": self.mask_digest.hexdigest()}]}
        tmp = out / "meta.json.tmp"
        tmp.write_text(json.dumps(record, indent=1))
        os.replace(tmp, out / "meta.json")
        return record


def write(out: Path, tokens: np.ndarray, mask: np.ndarray, *, vocab: int, separator: int, block_size: int,
          tokenizer_dir: str, meta: dict) -> dict:
    """The prepared directory `out` of rows held whole (BlockWriter, all at once)."""
    writer = BlockWriter(out, vocab=vocab, separator=separator, block_size=block_size)
    writer.add(tokens, mask)
    return writer.finish(tokenizer_dir, meta)


def is_chat(directory: Path) -> bool:
    try:
        return json.loads((Path(directory) / "meta.json").read_text()).get("format") == FORMAT
    except (OSError, ValueError):
        return False


class _MaskedRows:
    """Rows of a split: (tokens, mask) of width block_size + 1, read when indexed; `lengths`:
    the input tokens a row needs (its tokens before the padding, less the last one's place)."""

    def __init__(self, tokens: np.memmap, mask: np.memmap, width: int, index: BlockSplit,
                 used: Optional[np.ndarray] = None, separator: Optional[int] = None):
        self.tokens, self.mask, self.width, self.index = tokens, mask, width, index
        self.used, self.separator = used, separator

    def lengths(self, i) -> np.ndarray:
        rows = np.atleast_1d(self.index[i])
        used = self.used[rows] if self.used is not None else row_lengths(self._rows(self.tokens, i), self.separator)
        return np.maximum(np.asarray(used, dtype=np.int64) - 1, 1)

    def __len__(self) -> int:
        return len(self.index)

    def _rows(self, source, i):
        rows = np.atleast_1d(self.index[i])
        return np.stack([np.asarray(source[r * self.width:(r + 1) * self.width]) for r in rows])

    def __getitem__(self, i):
        return self._rows(self.tokens, i) if np.ndim(i) else self._rows(self.tokens, i)[0]

    def masks(self, i) -> np.ndarray:
        return self._rows(self.mask, i)


def _open(directory: Path, block_size: int, name: str):
    meta = json.loads((directory / "meta.json").read_text())
    if meta["block_size"] != block_size:
        raise DataError(f"{name} holds conversations packed into blocks of {meta['block_size']} tokens, and "
                        f"model.block_size={block_size}; prepare them again with --block-size {block_size} (or set "
                        f"model.block_size={meta['block_size']})")
    tokens = np.memmap(directory / meta["shards"][0]["file"], dtype=np.dtype(meta["dtype"]), mode="r")
    mask = np.memmap(directory / meta["mask_shards"][0]["file"], dtype=np.uint8, mode="r")
    used = np.load(directory / LENGTHS, mmap_mode="r") if (directory / LENGTHS).exists() else None
    return meta, tokens, mask, len(tokens) // (block_size + 1), used


class ChatBlocks:
    """A chat directory's blocks: `train` and `eval` rows (every k-th block held out, or all of
    `eval_directory`'s), each with `.masks(i)`; the meta and unigram counts as PreparedBlocks'."""

    def __init__(self, directory: Path, block_size: int, eval_fraction: float,
                 eval_directory: Optional[Path] = None, *, names: tuple = ()):
        width = block_size + 1
        name = names[0] if names else str(directory)
        meta, tokens, mask, n, used = _open(Path(directory), block_size, name)
        sep = int(meta["eos_id"])
        if n < (1 if eval_directory else 2):
            raise DataError(f"{name} packs into {n} block(s) of {width} tokens; give more conversations (at least two "
                            f"blocks: one to hold out) or a smaller model.block_size")
        if eval_directory is None:
            self.train = _MaskedRows(tokens, mask, width, BlockSplit(n, eval_fraction, held=False), used, sep)
            self.eval = _MaskedRows(tokens, mask, width, BlockSplit(n, eval_fraction, held=True), used, sep)
        else:
            held_name = names[1] if len(names) > 1 else str(eval_directory)
            held_meta, held_tokens, held_mask, held_n, held_used = _open(Path(eval_directory), block_size, held_name)
            self.train = _MaskedRows(tokens, mask, width, BlockSplit(n, 0.0, held=False), used, sep)
            self.eval = _MaskedRows(held_tokens, held_mask, width, BlockSplit(held_n, 0.0, held=False), held_used,
                                    int(held_meta["eos_id"]))
        self.meta = {**{k: v for k, v in meta.items() if k not in ("shards", "mask_shards")}, "shards": 1,
                     "tail_tokens_dropped": 0, "train_blocks": len(self.train), "eval_blocks": len(self.eval)}
        self.unigram_counts = np.load(Path(directory) / "unigram_counts.npy")
