"""Pre-tokenize a corpus larger than memory into memory-mapped token shards, in parallel.

    python -m data_pipelines.prepare --name files --path 'corpus/*.jsonl' --tokenizer TOKENIZER_DIR \
        --out DATA_DIR [--workers N] [--shard-tokens N] [--text-column text] [--batch-docs 1000]
    python -m data_pipelines.prepare --name files --path 'corpus/*.jsonl' --train-tokenizer 32000 --out DATA_DIR

Documents are streamed (file by file; jsonl line by line, parquet/csv through `datasets`
streaming), a long one cut into pieces of about 64K characters where that leaves its tokens
unchanged (GPT-2's byte-level BPE), and cut into batches (of --batch-docs documents or
--batch-chars characters) in their order; --workers processes (default: one per core) tokenize
the batches with the fast tokenizer, each document followed by the end-of-text token (a BERT
tokenizer's [SEP] where it has none), and the main process writes their tokens in the batches'
order into DATA_DIR/tokens-00000.bin, tokens-00001.bin, ... (uint16 when the vocabulary fits,
else uint32; a shard ends after the batch that brings it to --shard-tokens), so the output is
the same bytes for any number of workers. Only a few batches per worker are in flight, and a
local tokenizer is read without importing transformers: memory does not grow with the corpus
(about 110-125 MB for two workers). Each finished shard gets a marker
(tokens-NNNNN.done: its tokens, bytes, xxh3-64 digest and the batches through it) and its
token counts; a preparation stopped part-way continues from its intact shards when run again
with the same arguments (a shard without its marker, or not matching it, is written again).
At the end DATA_DIR/meta.json indexes the shards, with the per-token counts for the unigram
baseline and a copy of the tokenizer. Training reads the shards as one corpus, without
loading them:

    python -m zoo.train data=prepared data.path=DATA_DIR
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

from data_pipelines.lm import BlockSplit
from data_pipelines.text_sources import DataError, TextSource, no_text, open_source
from data_pipelines.tokenizer import save_tokenizer
from data_pipelines.workers import pool_start_method


class Progress:
    """Documents, tokens and text read so far, and the rate, every `every_s` seconds (stderr)."""

    def __init__(self, every_s: float = 2.0, stream=None, label: str = "prepare:"):
        import time

        self.clock, self.every_s, self.stream, self.label = time.monotonic, every_s, stream or sys.stderr, label
        self.start = self.last = self.clock()
        self.docs = self.tokens = self.bytes = 0

    def add(self, docs: int, tokens: int, text_bytes: int, *, final: bool = False) -> None:
        self.docs, self.tokens, self.bytes = self.docs + docs, self.tokens + tokens, self.bytes + text_bytes
        now = self.clock()
        if final or now - self.last >= self.every_s:
            self.last = now
            took = max(now - self.start, 1e-9)
            print(f"{self.label} {self.docs:,} documents, {self.tokens:,} tokens, {self.bytes / 1e6:,.1f} MB of text in "
                  f"{took:.1f} s ({self.bytes / 1e6 / took:.1f} MB/s, {self.tokens / took:,.0f} tokens/s)",
                  file=self.stream, flush=True)


SHARD_TOKENS = 1 << 28  # 268M tokens: 512 MiB of uint16 a shard
BATCH_CHARS = 1 << 18  # a batch's text (2 x workers batches in flight): 1 << 20 peaked 8-12 MB higher on 200 MB here
FORMAT = "zoo-tokens-2"


PIECE_CHARS = 1 << 16  # a long document is encoded in pieces of about this many characters, where that is exact
GROUP_CHARS = 1 << 16  # text per encode call in a worker: the encodings (tens of bytes a token) of this much at once


def splits_exactly(backend: dict) -> bool:
    """Whether cutting a text where `pieces` cuts leaves its ids unchanged: true for GPT-2's
    byte-level pre-tokenizer (the cut falls between two of its pre-tokens, and BPE merges only
    inside a pre-token) with no normalizer; other tokenizers (SentencePiece's Metaspace
    prepends a space to every piece) get whole documents."""
    pre = backend.get("pre_tokenizer") or {}
    return (backend.get("normalizer") is None and pre.get("type") == "ByteLevel" and pre.get("use_regex", True)
            and not pre.get("add_prefix_space", False))  # a space before every piece would change its first token


def pieces(text: str, size: int = PIECE_CHARS) -> Iterator[str]:
    """`text` cut after about every `size` characters, before the last space or newline of a
    run of them that a printable ASCII character follows. GPT-2's regex gives the same
    pre-tokens there: in the whole text the run but its last character is one pre-token (the
    last one starts the next, or joins the word after it as its leading space), and at the end
    of a piece the run but its last character is one pre-token too. One piece at a time."""
    import re

    start = 0
    boundary = re.compile(r"(?<=[ \n!-~])(?=[ \n][!-~])")
    while len(text) - start > size:
        m = boundary.search(text, start + size)
        if m is None:
            break
        yield text[start:m.start()]
        start = m.start()
    yield text[start:]


Item = Tuple[str, bool]  # a text to tokenize, and whether it ends its document (a whole one, or its last piece)


def items(texts: Iterator[str], split: bool) -> Iterator[Item]:
    """The documents as items: a long one cut by `pieces` where `split` (splits_exactly), so
    that no batch, and no encoding, holds more than about a batch's characters, however long a
    document is (the corpus here has documents of 2-4 MB)."""
    for text in texts:
        if not split:
            yield text, True
            continue
        parts = pieces(text)
        part = next(parts)
        for following in parts:  # one piece ahead: the last one ends the document
            yield part, False
            part = following
        yield part, True


class _Tokenize:
    """A batch of items (`items`) to their token ids, each document followed by `end`, as one
    array of `dtype`: the tokenizer's backend (tokenizers), the same in a worker and in-process.
    The text goes to the tokenizer in groups of about GROUP_CHARS (in-process, where the
    tokenizer's threads share a group: that times the cores, at least 4), so a batch does not
    hold its whole encoding (tens of bytes a token) at once."""

    def __init__(self, backend_json: str, end: int, dtype: str, threads: bool):
        if not threads:  # N worker processes: no tokenizer thread pool inside each
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
        from tokenizers import Tokenizer

        self.tok, self.end, self.dtype = Tokenizer.from_str(backend_json), end, np.dtype(dtype)
        self.group_chars = GROUP_CHARS * (max(4, len(os.sched_getaffinity(0))) if threads else 1)

    def __call__(self, batch: List[Item]) -> np.ndarray:
        # The ids alone (no offsets): the same ids as encode_batch, 2.3x faster on a 4 MB document here.
        encode = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)
        end = np.asarray([self.end], dtype=self.dtype)
        out: List[np.ndarray] = []
        group: List[Item] = []
        held = 0

        def flush() -> None:
            for (_, last), e in zip(group, encode([t for t, _ in group], add_special_tokens=False)):
                out.append(np.asarray(e.ids, dtype=self.dtype))
                if last:
                    out.append(end)
            group.clear()

        for item in batch:
            group.append(item)
            held += len(item[0])
            if held >= self.group_chars:
                flush()
                held = 0
        if group:
            flush()
        return np.concatenate(out) if out else np.empty(0, dtype=self.dtype)


_WORKER: Optional[_Tokenize] = None


def _worker_init(backend_json: str, end: int, dtype: str) -> None:
    global _WORKER
    _WORKER = _Tokenize(backend_json, end, dtype, threads=False)


def _worker_run(batch: List[Item]) -> np.ndarray:
    return _WORKER(batch)


def _batches(source: Iterator[Item], size: int, chars: int) -> Iterator[List[Item]]:
    """The items in batches of `size` documents or `chars` characters, whichever comes first."""
    batch: List[Item] = []
    held = docs = 0
    for item in source:
        batch.append(item)
        held += len(item[0])
        docs += item[1]
        if docs >= size or held >= chars:
            yield batch
            batch, held, docs = [], 0, 0
    if batch:
        yield batch


def _tokenized(batches: Iterator[List[Item]], workers: int, init_args: tuple) -> Iterator[Tuple[List[Item], np.ndarray]]:
    """(batch, its tokens) in the batches' order; with workers > 1 at most 2 x workers batches
    in flight (Pool.imap would read the whole input ahead), the workers started by
    pool_start_method()."""
    if workers == 1:
        tokenize = _Tokenize(*init_args, threads=True)
        for batch in batches:
            yield batch, tokenize(batch)
        return
    import multiprocessing as mp
    from collections import deque

    # fork where safe: a worker needs only the tokenizer (no re-import of a caller's main module, as spawn does)
    with mp.get_context(pool_start_method()).Pool(workers, initializer=_worker_init, initargs=init_args) as pool:
        pending: deque = deque()
        for batch in batches:
            pending.append((batch, pool.apply_async(_worker_run, (batch,))))
            if len(pending) >= 2 * workers:
                done, result = pending.popleft()
                yield done, result.get()
        while pending:
            done, result = pending.popleft()
            yield done, result.get()


def _shard(out: Path, i: int) -> Path:
    return out / f"tokens-{i:05d}.bin"


def _marker(out: Path, i: int) -> Path:
    return out / f"tokens-{i:05d}.done"


def _counts(out: Path, i: int) -> Path:
    return out / f"tokens-{i:05d}.counts.npy"


def _intact_shards(out: Path) -> List[dict]:
    """The markers of the shards written in full, in order, up to the first that is missing
    or does not match its file; that one's and every later shard's files are removed."""
    from zoo.run.checksums import digest

    kept: List[dict] = []
    i = 0
    while True:
        shard, marker = _shard(out, i), _marker(out, i)
        if not marker.is_file() or not shard.is_file() or not _counts(out, i).is_file():
            break
        record = json.loads(marker.read_text())
        if shard.stat().st_size != record["bytes"] or digest(shard) != record["xxh3_64"]:
            break
        kept.append(record)
        i += 1
    for stale in [*out.glob("tokens-*.bin"), *out.glob("tokens-*.done"), *out.glob("tokens-*.counts.npy"),
                  *out.glob("tokens-*.tmp")]:
        if int(stale.name[len("tokens-"):len("tokens-") + 5]) >= i:
            stale.unlink()
    return kept


def _job(out: Path, job: dict) -> None:
    """Record what this preparation is (prepare.json), or check that --out holds the same one."""
    path = out / "prepare.json"
    if path.is_file():
        before = json.loads(path.read_text())
        if before != job:
            differ = ", ".join(f"{k} {before.get(k)!r} -> {job.get(k)!r}" for k in sorted(set(job) | set(before))
                               if before.get(k) != job.get(k))
            raise DataError(f"--out {out} holds a preparation made otherwise ({differ}): prepare into another --out, "
                            f"or remove {out} to start it again")
        return
    if any(out.glob("tokens*.bin")):
        raise DataError(f"--out {out} already holds token files of another preparation (no prepare.json): prepare "
                        f"into another --out, or remove them")
    path.write_text(json.dumps(job, indent=1))


def _tokenizer(tokenizer_dir: str) -> Tuple[str, int, int]:
    """The fast tokenizer's backend (JSON), the id ending each document and the vocabulary's
    size: read with `tokenizers` alone from a local directory that allows it, else through
    transformers (a Hub name, a tokenizer without tokenizer.json)."""
    from data_pipelines.tokenizer import backend_without_transformers

    local = Path(tokenizer_dir).expanduser()
    if local.is_file():
        raise DataError(f"--tokenizer {tokenizer_dir} is a file: give the directory that holds it (tokenizer.json "
                        f"with its tokenizer_config.json, as save_pretrained writes them), or a Hub name")
    light = backend_without_transformers(local) if local.is_dir() else None
    if light is not None:
        backend, end, vocab = light
    else:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer_dir, use_fast=True)
        if not getattr(tok, "is_fast", False):
            raise DataError(f"tokenizer {tokenizer_dir} has no fast (tokenizers) version: save one with tokenizer.json")
        backend, vocab = tok.backend_tokenizer.to_str(), len(tok)
        end = tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id
    if end is None:
        raise DataError(f"tokenizer {tokenizer_dir} has no end-of-text token (eos) and no [SEP] to end documents with")
    return backend, end, vocab


def prepare(name: str, path: str | None, tokenizer_dir: str, out: Path, *, text_column: str = "text",
            batch_docs: int = 1000, batch_chars: int = BATCH_CHARS, workers: Optional[int] = None,
            shard_tokens: int = SHARD_TOKENS, part: Optional[Tuple[int, int]] = None,
            progress: Progress | None = None, source: Optional[TextSource] = None) -> dict:
    """Prepare `out` (see the module's docstring); returns its meta.json as a dict. `source`:
    the source `name` at `path`, already opened (data_pipelines.text_sources.open_source)."""
    import xxhash

    source = source or open_source(name, path, text_column)

    workers = workers or max(1, len(os.sched_getaffinity(0)))
    if min(workers, batch_docs, batch_chars, shard_tokens) < 1:
        raise DataError(f"--workers {workers}, --batch-docs {batch_docs}, --batch-chars {batch_chars} and "
                        f"--shard-tokens {shard_tokens} must be positive")
    backend, end, vocab = _tokenizer(tokenizer_dir)
    dtype = np.dtype(np.uint16 if vocab <= np.iinfo(np.uint16).max else np.uint32)
    split = splits_exactly(json.loads(backend))
    out.mkdir(parents=True, exist_ok=True)
    _job(out, {"format": FORMAT, "source": f"{name}:{path}", "text_column": text_column, "batch_docs": batch_docs,
               "batch_chars": batch_chars, "shard_tokens": shard_tokens, "tokenizer_xxh3_64": xxhash.xxh3_64_hexdigest(backend.encode()),
               "dtype": dtype.name, "part": f"{part[0]}/{part[1]}" if part else None,
               "piece_chars": PIECE_CHARS if split else None})
    shards = _intact_shards(out)
    skip = shards[-1]["batches"] if shards else 0  # batches already in intact shards: read past, not tokenized
    counts: dict = {}
    batches = _batches(items(source.texts(counts, part), split), batch_docs, batch_chars)
    for _ in range(skip):
        if next(batches, None) is None:
            raise DataError(f"--out {out} holds shards of {skip} batches but the source now has fewer: it changed "
                            f"since; remove {out} and prepare again")
    state = {"batches": skip, "documents": shards[-1]["documents"] if shards else 0}
    current: Dict[str, object] = {}

    def open_shard() -> None:
        i = len(shards)
        current.update(i=i, fh=open(_shard(out, i), "wb"), hash=xxhash.xxh3_64(), tokens=0,
                       unigram=np.zeros(vocab, dtype=np.int64))

    def close_shard() -> None:
        fh, i = current["fh"], current["i"]
        fh.flush()
        os.fsync(fh.fileno())
        fh.close()
        np.save(_counts(out, i), current["unigram"])
        record = {"file": _shard(out, i).name, "tokens": current["tokens"],
                  "bytes": current["tokens"] * dtype.itemsize, "xxh3_64": current["hash"].hexdigest(), **state}
        tmp = _marker(out, i).with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, _marker(out, i))  # last: the shard is finished
        shards.append(record)
        current.clear()

    delay = float(os.environ.get("ZOO_TEST_PREPARE_BATCH_DELAY_S", "0"))  # tests: a preparation to stop part-way
    for batch, ids in _tokenized(batches, workers, (backend, end, dtype.name)):
        if delay:
            time.sleep(delay)
        if not current:
            open_shard()
        data = ids.tobytes()
        current["fh"].write(data)
        current["hash"].update(data)
        current["unigram"] += np.bincount(ids, minlength=vocab)[:vocab]
        current["tokens"] += len(ids)
        state["batches"] += 1
        docs = sum(last for _, last in batch)
        state["documents"] += docs
        if progress is not None:
            progress.add(docs, len(ids), sum(len(t.encode("utf-8", "replace")) for t, _ in batch))
        if current["tokens"] >= shard_tokens:
            close_shard()
    if current:
        close_shard()
    if progress is not None:
        progress.add(0, 0, 0, final=True)
    n_tokens = sum(r["tokens"] for r in shards)
    if n_tokens == 0:
        raise no_text(source, counts)
    unigram = np.zeros(vocab, dtype=np.int64)
    for i in range(len(shards)):
        unigram += np.load(_counts(out, i))
    np.save(out / "unigram_counts.npy", unigram)
    save_tokenizer(tokenizer_dir, out / "tokenizer")
    meta = {"format": FORMAT, "dtype": dtype.name, "tokens": n_tokens, "documents": state["documents"],
            "eos_id": end, "vocab": vocab, "source": f"{name}:{path}", "skipped": counts,
            "part": f"{part[0]}/{part[1]}" if part else None,
            "shards": [{k: r[k] for k in ("file", "tokens", "bytes", "xxh3_64")} for r in shards]}
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta


class TokenShards:
    """A prepared directory's tokens as one sequence, over one memory map per shard (format 2),
    or the one tokens.bin of format 1; `block(i, width)` reads tokens [i x width, (i + 1) x
    width), across a shard boundary where it falls on one."""

    def __init__(self, directory: Path):
        self.meta = json.loads((directory / "meta.json").read_text())
        dtype = np.dtype(self.meta["dtype"])
        files = [s["file"] for s in self.meta["shards"]] if "shards" in self.meta else ["tokens.bin"]
        self.maps = [np.memmap(directory / f, dtype=dtype, mode="r") for f in files]
        self.starts = np.cumsum([0] + [len(m) for m in self.maps])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def read(self, start: int, stop: int) -> np.ndarray:
        first = int(np.searchsorted(self.starts, start, side="right")) - 1
        parts = []
        while start < stop:
            lo = start - int(self.starts[first])
            take = min(stop - start, len(self.maps[first]) - lo)
            parts.append(self.maps[first][lo:lo + take])
            start, first = start + take, first + 1
        return np.asarray(parts[0]) if len(parts) == 1 else np.concatenate(parts)

    def block(self, i: int, width: int) -> np.ndarray:
        return self.read(i * width, (i + 1) * width)


def check_shards(directory: Path, verified: Path, lists=("shards",)) -> None:
    """DataError, naming the shard and how to rebuild it, where a shard of a prepared directory
    is missing, of another size than its index says, or (read once per file version: its
    digest is remembered under `verified`, keyed by path, size and modification time) not of
    its recorded xxh3-64 digest. Ranks validating at once (torchrun, srun) read a shard once
    per cache: the first takes its lock and reads it, the others find the digest remembered.
    `lists`: meta.json's lists of shards (a chat directory's target masks: "mask_shards"; a
    shard recorded without a digest, by an older version, is checked by its size)."""
    from data_pipelines.cache import locked
    from zoo.run.checksums import digest

    def rebuild(f: Path) -> str:
        return (f"rebuild it: remove {f} and its .done marker, and run python -m data_pipelines.prepare again with "
                f"the same arguments (--out {f.parent}; then --merge again if it is a part): the intact shards are kept")

    try:
        meta = json.loads((directory / "meta.json").read_text())
    except ValueError as err:
        raise DataError(f"{directory / 'meta.json'} does not parse ({err}): it is written last by python -m "
                        f"data_pipelines.prepare; run it again with the same arguments (--out {directory})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("shards", []), list):
        raise DataError(f"{directory / 'meta.json'} is not a prepared directory's index (no list of shards); run "
                        f"python -m data_pipelines.prepare again with the same arguments (--out {directory})")
    for shard in [shard for key in lists for shard in meta.get(key, [])]:
        f = directory / shard["file"]
        if not f.is_file():
            raise DataError(f"{f} is missing (meta.json lists it); " + rebuild(f))
        st = f.stat()
        if st.st_size != shard["bytes"]:
            raise DataError(f"{f} holds {st.st_size:,} bytes, meta.json says {shard['bytes']:,}: it is cut short or "
                            f"was changed; " + rebuild(f))
        if "xxh3_64" not in shard:
            continue
        stamp = verified / "shards" / hashlib.sha256(f"{f.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()
        if stamp.is_file() and stamp.read_text() == shard["xxh3_64"]:
            continue
        with locked(stamp.with_suffix(".lock")):
            if stamp.is_file() and stamp.read_text() == shard["xxh3_64"]:
                continue  # another rank read it while this one waited
            if digest(f) != shard["xxh3_64"]:
                raise DataError(f"{f} fails its checksum (xxh3-64 recorded in meta.json): its bytes changed since it "
                                f"was written; " + rebuild(f))
            stamp.write_text(shard["xxh3_64"])


def _rows(directory: Path, width: int):
    tokens = TokenShards(directory)
    n = len(tokens) // width
    return tokens.meta, tokens, n, _Blocks(tokens, width)


class _Blocks:
    def __init__(self, tokens: TokenShards, width: int):
        self.tokens, self.width = tokens, width

    def __getitem__(self, i):
        if np.ndim(i) == 0:
            return self.tokens.block(int(i), self.width)
        return np.stack([self.tokens.block(int(j), self.width) for j in np.asarray(i)])


class PreparedBlocks:
    """Blocks of block_size + 1 tokens over a prepared token file, memory-mapped; every
    k-th block held out, or, given eval_directory (another prepared file), every block of
    this one trained on and every block of that one held out. Rows are read only when indexed."""

    def __init__(self, directory: Path, block_size: int, eval_fraction: float, eval_directory: Path | None = None,
                 *, names: tuple = ()):
        """`names`: how errors call the directory and the held-out one (default: their paths),
        e.g. the text source a cache entry was tokenized from."""
        width = block_size + 1
        name, held_name = (*names, None, None)[:2] if names else (None, None)
        meta, tokens, n, rows = _rows(directory, width)
        if n < (1 if eval_directory else 2):
            blocks = "one block" if eval_directory else "two blocks"
            raise DataError(f"{name or directory} holds {len(tokens):,} tokens: fewer than {blocks} of {width} "
                            f"(model.block_size + 1); give more text or a smaller model.block_size")
        if eval_directory is None:
            self.train = _Rows(rows, BlockSplit(n, eval_fraction, held=False))
            self.eval = _Rows(rows, BlockSplit(n, eval_fraction, held=True))
        else:
            _, held_tokens, held_n, held_rows = _rows(eval_directory, width)
            if held_n < 1:
                raise DataError(f"data.eval_path={held_name or eval_directory} holds {len(held_tokens):,} tokens: "
                                f"fewer than one block of {width}; give more held-out text")
            self.train = _Rows(rows, BlockSplit(n, 0.0, held=False))  # every block trained on
            self.eval = _Rows(held_rows, BlockSplit(held_n, 0.0, held=False))  # every block held out
        meta = {**{k: v for k, v in meta.items() if k != "shards"}, "shards": len(meta.get("shards", [None]))}
        self.meta = {**meta, "tail_tokens_dropped": int(len(tokens) - n * width), "train_blocks": len(self.train),
                     "eval_blocks": len(self.eval)}
        self.unigram_counts = np.load(directory / "unigram_counts.npy")


class _Rows:
    def __init__(self, rows: _Blocks, index: BlockSplit):
        self.rows, self.index = rows, index

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i):
        return np.asarray(self.rows[self.index[i]])


def _steady_malloc() -> None:
    """glibc's mmap threshold fixed at its default (128 KiB): freeing a long document's text
    otherwise raises the threshold to its size, after which blocks that large stay in the heap
    and the process grows with the largest documents it has met (+30 MB on the benchmark's
    corpus, 2-4 MB documents). For this command's own process only: in a training rank torch
    keeps the adaptive threshold."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):  # not glibc
        pass


# The readers name training's keys (data.path=...); this command's user typed its flags.
FLAGS = (("data.path=", "--path "), ("data.path", "--path"), ("data.text_column", "--text-column"),
         ("data.name=", "--name "), ("data.name", "--name"))


def as_flags(message: str) -> str:
    """A reader's error with this command's flags in place of the training keys it names."""
    for key, flag in FLAGS:
        message = message.replace(key, flag)
    return message


def _main_chat(a) -> None:
    from data_pipelines.chat_prepare import prepare_chat

    try:
        if not a.tokenizer:
            raise DataError("--format chat needs --tokenizer: a model's directory with its tokenizer and chat template")
        if not a.block_size or a.block_size < 1:
            raise DataError(f"--format chat needs --block-size N >= 1 (given {a.block_size}): the model.block_size the "
                            f"conversations are packed for")
        meta = prepare_chat(a.path, a.tokenizer, a.out, block_size=a.block_size, train_on=a.train_on,
                            chat_template=a.chat_template, packing=not a.no_packing, truncate=a.truncate,
                            workers=a.workers)
    except DataError as err:
        print(f"data_pipelines.prepare: error: {as_flags(str(err))}", file=sys.stderr)
        sys.exit(2)
    print(f"prepared {meta['conversations']:,} conversations into {meta['tokens'] // (a.block_size + 1):,} blocks of "
          f"{a.block_size + 1} tokens ({meta['supervised_tokens']:,} targets, {meta['truncated']:,} truncated, "
          f"{meta['padding_tokens']:,} padding) in {a.out}; train with data=chat data.path={a.out}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m data_pipelines.prepare", description=__doc__.split("\n")[0])
    ap.add_argument("--name", default="files", choices=["files", "hub", "pydoc"])
    ap.add_argument("--path")
    ap.add_argument("--text-column", default="text")
    ap.add_argument("--tokenizer", help="a local tokenizer directory or a Hub name")
    ap.add_argument("--train-tokenizer", type=int, metavar="VOCAB_SIZE",
                    help="instead of --tokenizer: train a byte-level BPE of VOCAB_SIZE tokens on the same documents "
                         "first, saved as OUT/tokenizer (data_pipelines.prepare_tokenizer)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--part", help="I/N: prepare only part I (from 0) of N of the files (a Slurm array task's "
                                   "share); then --merge the N parts' directories")
    ap.add_argument("--merge", type=Path, nargs="+", metavar="PART_DIR",
                    help="index the --part outputs' shards as one prepared directory --out (no copy)")
    ap.add_argument("--batch-docs", type=int, default=1000, help="documents a worker tokenizes at once")
    ap.add_argument("--batch-chars", type=int, default=BATCH_CHARS,
                    help=f"characters a batch reaches at most (default {BATCH_CHARS:,}): bounds memory")
    ap.add_argument("--workers", type=int, default=None,
                    help="tokenizing processes (default: one per core); the output is the same for any number")
    ap.add_argument("--shard-tokens", type=int, default=SHARD_TOKENS,
                    help=f"tokens a shard reaches before the next begins (default {SHARD_TOKENS:,})")
    chat = ap.add_argument_group("--format chat: conversations for fine-tuning (data_pipelines.chat_prepare)")
    ap.add_argument("--format", default="text", choices=["text", "chat"],
                    help="text: documents into token shards; chat: conversations rendered with --tokenizer's chat "
                         "template, packed into blocks of --block-size with their target masks (data=chat reads them)")
    chat.add_argument("--block-size", type=int, help="the model.block_size the blocks are packed for")
    chat.add_argument("--train-on", default="assistant", choices=["assistant", "last_turn", "all"])
    chat.add_argument("--chat-template", help="chatml or a .jinja file (default: the tokenizer's own)")
    chat.add_argument("--no-packing", action="store_true", help="one conversation a block")
    chat.add_argument("--truncate", default="end", choices=["end", "refuse"])
    a = ap.parse_args(argv)
    if a.format == "chat":
        _main_chat(a)
        return
    for flag, value in (("--workers", a.workers), ("--batch-docs", a.batch_docs), ("--batch-chars", a.batch_chars),
                        ("--shard-tokens", a.shard_tokens)):
        if value is not None and value < 1:
            print(f"data_pipelines.prepare: error: {flag} {value} must be at least 1"
                  + (" (omit it for one process per core)" if flag == "--workers" else ""), file=sys.stderr)
            sys.exit(2)
    _steady_malloc()
    try:
        if a.merge:
            from data_pipelines.prepare_parts import merge

            meta = merge(a.merge, a.out)
        else:
            from data_pipelines.prepare_parts import parse_part

            part = parse_part(a.part, a.name) if a.part else None
            tokenizer, source = a.tokenizer, None
            if a.train_tokenizer is not None:
                from data_pipelines.prepare_tokenizer import check_vocab, trained_tokenizer

                if a.tokenizer:
                    raise DataError(f"--tokenizer {a.tokenizer} and --train-tokenizer {a.train_tokenizer} both give the "
                                    f"tokenizer: keep one")
                check_vocab(a.train_tokenizer, part)
                source = open_source(a.name, a.path, a.text_column)
                counts: dict = {}  # a wrong column, an unreadable first file or no text: refused before training
                if next(source.texts(counts), None) is None:
                    raise no_text(source, counts)
                tokenizer = str(trained_tokenizer(source, a.train_tokenizer, a.out, where=as_flags(source.describe())))
            elif not tokenizer:
                raise DataError("--tokenizer is required (a local tokenizer directory or a Hub name), or "
                                "--train-tokenizer VOCAB_SIZE to train one on the corpus, except with --merge")
            meta = prepare(a.name, a.path, tokenizer, a.out, text_column=a.text_column, batch_docs=a.batch_docs,
                           batch_chars=a.batch_chars, workers=a.workers, shard_tokens=a.shard_tokens,
                           part=part, progress=Progress(), source=source)
    except DataError as err:
        print(f"data_pipelines.prepare: error: {as_flags(str(err))}", file=sys.stderr)
        sys.exit(2)
    print(f"{'merged' if a.merge else 'prepared'} {meta['documents']:,} documents, {meta['tokens']:,} tokens "
          f"({meta['dtype']}) in "
          f"{len(meta['shards'])} shard(s) in {a.out}; "
          f"skipped {meta['skipped'] or 'nothing'}")


if __name__ == "__main__":
    main()
