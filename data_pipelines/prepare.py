"""Pre-tokenize a corpus larger than memory into a memory-mapped token file.

    python -m data_pipelines.prepare --name files --path 'corpus/*.jsonl' --tokenizer TOKENIZER_DIR \
        --out DATA_DIR [--text-column text] [--batch-docs 1000]

Documents are streamed (file by file; jsonl/parquet/csv through `datasets` streaming),
tokenized in batches by the fast tokenizer, each followed by the end-of-text token (a BERT
tokenizer's [SEP] where it has none), and
appended to DATA_DIR/tokens.bin (uint16 when the vocabulary fits, else uint32), with the
per-token counts for the unigram baseline, DATA_DIR/meta.json and a copy of the tokenizer.
Nothing is held in memory but one batch. Training reads it without loading it whole:

    python -m zoo.train data=prepared data.path=DATA_DIR
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Iterator, List

import numpy as np

from data_pipelines.lm import held_out
from data_pipelines.text_sources import TEXT_SUFFIXES, DataError, expand_paths, read_source


def stream_texts(name: str, path: str | None, column: str, counts: dict) -> Iterator[str]:
    """Documents one at a time; files are read one by one (streaming for tables)."""
    if name != "files":  # pydoc and hub datasets are read through the in-memory reader
        yield from read_source(name, path, column).texts
        return
    import datasets

    for f in expand_paths(path):
        kind = TEXT_SUFFIXES[f.suffix.lower()]
        if kind == "text":
            raw = f.read_bytes()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = raw.decode("utf-8", errors="replace")
                counts["invalid_utf8_replaced"] = counts.get("invalid_utf8_replaced", 0) + 1
            rows: Iterator = iter([{column: text}])
        else:
            rows = iter(datasets.load_dataset(kind, data_files=str(f), split="train", streaming=True))
        for row in rows:
            if column not in row:
                raise DataError(f"{f} has no column {column!r} (columns: {sorted(row)}); set --text-column")
            text = row[column]
            if not isinstance(text, str) or not text.strip():
                counts["empty_skipped"] = counts.get("empty_skipped", 0) + 1
                continue
            yield text


class Progress:
    """Documents, tokens and text read so far, and the rate, every `every_s` seconds (stderr)."""

    def __init__(self, every_s: float = 2.0, stream=None):
        import time

        self.clock, self.every_s, self.stream = time.monotonic, every_s, stream or sys.stderr
        self.start = self.last = self.clock()
        self.docs = self.tokens = self.bytes = 0

    def add(self, docs: int, tokens: int, text_bytes: int, *, final: bool = False) -> None:
        self.docs, self.tokens, self.bytes = self.docs + docs, self.tokens + tokens, self.bytes + text_bytes
        now = self.clock()
        if final or now - self.last >= self.every_s:
            self.last = now
            took = max(now - self.start, 1e-9)
            print(f"prepare: {self.docs:,} documents, {self.tokens:,} tokens, {self.bytes / 1e6:,.1f} MB of text in "
                  f"{took:.1f} s ({self.bytes / 1e6 / took:.1f} MB/s, {self.tokens / took:,.0f} tokens/s)",
                  file=self.stream, flush=True)


def prepare(name: str, path: str | None, tokenizer_dir: str, out: Path, *, text_column: str = "text",
            batch_docs: int = 1000, progress: Progress | None = None) -> dict:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir, use_fast=True)
    end = tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id
    if end is None:
        raise DataError(f"tokenizer {tokenizer_dir} has no end-of-text token (eos) and no [SEP] to end documents with")
    dtype = np.uint16 if len(tok) <= np.iinfo(np.uint16).max else np.uint32
    out.mkdir(parents=True, exist_ok=True)
    counts: dict = {}
    unigram = np.zeros(len(tok), dtype=np.int64)
    n_tokens = n_docs = 0
    tmp = out / "tokens.bin.tmp"
    with open(tmp, "wb") as fh:
        batch: List[str] = []

        def flush() -> None:
            nonlocal n_tokens, n_docs
            ids = tok(batch, add_special_tokens=False)["input_ids"]
            arr = np.fromiter((t for d in ids for t in (*d, end)), dtype=np.int64)
            unigram[:] += np.bincount(arr, minlength=len(unigram))[:len(unigram)]
            fh.write(arr.astype(dtype).tobytes())
            n_tokens += len(arr)
            n_docs += len(batch)
            if progress is not None:
                progress.add(len(batch), len(arr), sum(len(t.encode("utf-8", "replace")) for t in batch))
            batch.clear()

        for text in stream_texts(name, path, text_column, counts):
            batch.append(text)
            if len(batch) >= batch_docs:
                flush()
        if batch:
            flush()
    if progress is not None:
        progress.add(0, 0, 0, final=True)
    if n_tokens == 0:
        tmp.unlink()
        raise DataError(f"data source {name} {path or ''} holds no text ({counts})")
    os.replace(tmp, out / "tokens.bin")
    np.save(out / "unigram_counts.npy", unigram)
    tok.save_pretrained(str(out / "tokenizer"))
    meta = {"format": "zoo-tokens-1", "dtype": np.dtype(dtype).name, "tokens": n_tokens, "documents": n_docs,
            "eos_id": end, "vocab": len(tok), "source": f"{name}:{path}", "skipped": counts}
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta


def _rows(directory: Path, width: int):
    meta = json.loads((directory / "meta.json").read_text())
    tokens = np.memmap(directory / "tokens.bin", dtype=np.dtype(meta["dtype"]), mode="r")
    n = len(tokens) // width
    return meta, tokens, n, tokens[: n * width].reshape(n, width)


class PreparedBlocks:
    """Blocks of block_size + 1 tokens over a prepared token file, memory-mapped; every
    k-th block held out, or, given eval_directory (another prepared file), every block of
    this one trained on and every block of that one held out. Rows are read only when indexed."""

    def __init__(self, directory: Path, block_size: int, eval_fraction: float, eval_directory: Path | None = None):
        width = block_size + 1
        meta, tokens, n, rows = _rows(directory, width)
        if n < (1 if eval_directory else 2):
            blocks = "one block" if eval_directory else "two blocks"
            raise DataError(f"{directory} holds {len(tokens)} tokens: fewer than {blocks} of {width}")
        if eval_directory is None:
            held = held_out(n, eval_fraction)
            self.train, self.eval = _Rows(rows, np.flatnonzero(~held)), _Rows(rows, np.flatnonzero(held))
        else:
            _, held_tokens, held_n, held_rows = _rows(eval_directory, width)
            if held_n < 1:
                raise DataError(f"data.eval_path={eval_directory} holds {len(held_tokens)} tokens: fewer than one "
                                f"block of {width}; prepare more held-out text")
            self.train, self.eval = _Rows(rows, np.arange(n)), _Rows(held_rows, np.arange(held_n))
        self.meta = {**meta, "tail_tokens_dropped": int(len(tokens) - n * width), "train_blocks": len(self.train),
                     "eval_blocks": len(self.eval)}
        self.unigram_counts = np.load(directory / "unigram_counts.npy")


class _Rows:
    def __init__(self, rows: np.ndarray, index: np.ndarray):
        self.rows, self.index = rows, index

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i):
        return np.asarray(self.rows[self.index[i]])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m data_pipelines.prepare", description=__doc__.split("\n")[0])
    ap.add_argument("--name", default="files", choices=["files", "hub", "pydoc"])
    ap.add_argument("--path")
    ap.add_argument("--text-column", default="text")
    ap.add_argument("--tokenizer", required=True, help="a local tokenizer directory or a Hub name")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--batch-docs", type=int, default=1000)
    a = ap.parse_args(argv)
    try:
        meta = prepare(a.name, a.path, a.tokenizer, a.out, text_column=a.text_column, batch_docs=a.batch_docs,
                       progress=Progress())
    except DataError as err:
        print(f"data_pipelines.prepare: error: {err}", file=sys.stderr)
        sys.exit(2)
    print(f"prepared {meta['documents']:,} documents, {meta['tokens']:,} tokens ({meta['dtype']}) in {a.out}; "
          f"skipped {meta['skipped'] or 'nothing'}")


if __name__ == "__main__":
    main()
