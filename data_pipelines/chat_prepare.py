"""Conversations prepared for fine-tuning: read and checked (data_pipelines.chat), rendered with
the tokenizer's chat template, packed (data_pipelines.chat_blocks), written once into the data
cache (keyed by the conversations' files, the tokenizer, the template and every setting that
changes the blocks) or into a directory of your own:

    python -m data_pipelines.prepare --format chat --path 'chats/*.jsonl' --tokenizer MODEL_DIR \
        --block-size 2048 --out DATA_DIR [--train-on assistant] [--chat-template chatml] [--no-packing]
    python -m zoo.train model=qwen2 model.init_from=MODEL_DIR data=chat data.path=DATA_DIR

The conversations are rendered by worker processes (--workers, data.num_proc: the same blocks
for any number) into shards on disk beside the output (data_pipelines.chat_shards), then
packed from them into the blocks, which are written as they close: no step holds the set (a
chunk of conversations, the open blocks, a length a block). A `--out` preparation stopped
part-way goes on from its finished shards when run again with the same conversations,
tokenizer, template and data.train_on; its meta.json is written last (a directory without it
is no chat directory). In the data cache an entry is built whole under a temporary name, as
text's are (a build cut off starts over).
"""
from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import sys
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import numpy as np

from data_pipelines.cache import cache_key, cache_root, cached_dir
from data_pipelines.chat import ChatRenderer, load_template, open_chat, to_messages
from data_pipelines.chat_blocks import OPEN_BLOCKS, BlockWriter, pack_rows, separator_not_in
from data_pipelines.chat_shards import RenderShards
from data_pipelines.text_sources import DataError

RENDERED = "rendering"  # the shards' folder inside the output, removed once it is written
ROWS_AT_ONCE = 256  # packed rows handed to the writer together

CHUNK = 256  # conversations a worker renders at a time


_RENDERER: Optional[ChatRenderer] = None  # a worker's own, built once by _start_worker


def _start_worker(tokenizer_dir: str, template: Optional[str], train_on: str) -> None:
    from data_pipelines.tokenizer import load_tokenizer

    global _RENDERER
    _RENDERER = ChatRenderer(load_tokenizer(tokenizer_dir), template, train_on)


def _render(chunk: List[Tuple[str, dict]]) -> List[Tuple[str, np.ndarray, np.ndarray]]:
    return [(where, *_RENDERER.render(to_messages(record, where), where)) for where, record in chunk]


def _chunks(records: Iterator[Tuple[str, dict]]) -> Iterator[List[Tuple[str, dict]]]:
    chunk = []
    for item in records:
        chunk.append(item)
        if len(chunk) == CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def rendered_conversations(source, tokenizer_dir: str, template: Optional[str], train_on: str,
                           workers: int) -> Iterator[Tuple[str, np.ndarray, np.ndarray]]:
    """(where, ids, mask) of every record in order, rendered by `workers` processes (the same
    output for any number: chunks of CHUNK records, their results in order; a bad record's
    error is the first one in order)."""
    if workers <= 1:
        _start_worker(tokenizer_dir, template, train_on)
        for chunk in _chunks(source.records()):
            yield from _render(chunk)
        return
    import multiprocessing

    from data_pipelines.workers import pool_start_method

    context = multiprocessing.get_context(pool_start_method())
    with context.Pool(workers, initializer=_start_worker, initargs=(tokenizer_dir, template, train_on)) as pool:
        for done in pool.imap(_render, _chunks(source.records())):
            yield from done


class _After:
    """`source` with its first `skip` records left out (read, not rendered)."""

    def __init__(self, source, skip: int):
        self.source, self.skip = source, skip

    def records(self):
        return itertools.islice(self.source.records(), self.skip, None)


def prepare_chat(path: str, tokenizer_dir: str, out: Path, *, block_size: int, train_on: str = "assistant",
                 chat_template: Optional[str] = None, packing: bool = True, truncate: str = "end",
                 workers: Optional[int] = None) -> dict:
    """`out`, a chat directory of the conversations at `path`; returns its meta.json. `workers`:
    rendering processes (default: one per core, at most 8)."""
    from data_pipelines.tokenizer import load_tokenizer

    source = open_chat(path)
    tok = load_tokenizer(tokenizer_dir)
    template = load_template(chat_template)
    renderer = ChatRenderer(tok, template, train_on)  # refuses a template-less tokenizer before any worker starts
    workers = workers or min(8, len(os.sched_getaffinity(0)))
    out = Path(out)
    existed = out.exists()
    shards = RenderShards(out / RENDERED, _rendering_key(source, tokenizer_dir, template, train_on))
    if shards.done:
        print(f"zoo: data: going on from {len(shards.done)} rendered shard(s) of {shards.records_done:,} "
              f"conversations in {shards.directory}", file=sys.stderr, flush=True)
    try:
        shards.write(rendered_conversations(_After(source, shards.records_done), tokenizer_dir, template, train_on,
                                            workers))
        if not shards.records_done:
            raise DataError(f"data.path={path} holds no conversations; give files with one record a line")
    except DataError:  # the records need mending, which changes them: nothing rendered is kept
        shards.remove()
        if not existed:
            shutil.rmtree(out, ignore_errors=True)
        raise
    first_user = next((m["content"] for where, record in source.records()
                       for m in to_messages(record, where) if m["role"] == "user"), None)
    separator = separator_not_in(tok, shards.held())
    (out / "meta.json").unlink(missing_ok=True)  # the blocks of an earlier preparation are written over
    writer, counts, rows = BlockWriter(out, vocab=len(tok), separator=separator, block_size=block_size), {}, []
    for row in pack_rows(shards.conversations(), block_size, separator, counts, packing=packing, truncate=truncate):
        rows.append(row)
        if len(rows) == ROWS_AT_ONCE:
            writer.add(np.stack([t for t, _ in rows]), np.stack([m for _, m in rows]))
            rows = []
    if rows:
        writer.add(np.stack([t for t, _ in rows]), np.stack([m for _, m in rows]))
    meta = {**counts, "source": f"chat:{path}", "train_on": train_on, "packing": packing, "truncate": truncate,
            "template": "generation markers" if renderer.markers else "turns found by prefix",
            "first_user_turn": first_user}  # the end-of-run sample's default prompt
    record = writer.finish(tokenizer_dir, meta)
    shards.remove()
    return record


def _rendering_key(source, tokenizer_dir: str, template: Optional[str], train_on: str) -> str:
    """What changes the rendered conversations (not the packing: the shards serve any block)."""
    tok_json = Path(tokenizer_dir) / "tokenizer.json"
    tok_id = hashlib.sha256(tok_json.read_bytes()).hexdigest() if tok_json.exists() else str(tokenizer_dir)
    return cache_key(source=source.key, tokenizer=tok_id, template=hashlib.sha256((template or "").encode()).hexdigest(),
                     own_template=_own_template(tokenizer_dir), train_on=train_on)


def chat_cached(path: str, tokenizer_dir: str, *, block_size: int, train_on: str, chat_template: Optional[str],
                packing: bool, truncate: str, cache_dir: Optional[str] = None, workers: Optional[int] = None) -> Path:
    """The cache entry of `prepare_chat` with these settings: built once (under the cache's lock:
    the first rank builds, the others wait), then reused by every run that asks the same."""
    source = open_chat(path)
    tok_json = Path(tokenizer_dir) / "tokenizer.json"
    tok_id = hashlib.sha256(tok_json.read_bytes()).hexdigest() if tok_json.exists() else str(tokenizer_dir)
    template = load_template(chat_template)
    key = cache_key(source=source.key, tokenizer=tok_id, template=hashlib.sha256((template or "").encode()).hexdigest(),
                    own_template=_own_template(tokenizer_dir), train_on=train_on, block=block_size, packing=packing,
                    truncate=truncate, packer=f"first-fit-{OPEN_BLOCKS}")
    entry = cache_root(cache_dir) / "datasets" / f"chat-{key}"

    def build(tmp: Path) -> None:
        print(f"zoo: data: rendering the conversations of data.path={path} into the cache ({entry.name}) once; later "
              f"runs reuse it", file=sys.stderr, flush=True)
        prepare_chat(path, tokenizer_dir, tmp, block_size=block_size, train_on=train_on, chat_template=chat_template,
                     packing=packing, truncate=truncate, workers=workers)

    return cached_dir(entry, build)


def _own_template(tokenizer_dir: str) -> str:
    """A digest of the tokenizer directory's own chat template files (they change the rendering)."""
    h = hashlib.sha256()
    for name in ("tokenizer_config.json", "chat_template.jinja", "chat_template.json"):
        f = Path(tokenizer_dir) / name
        if f.is_file():
            h.update(f.read_bytes())
    return h.hexdigest()
