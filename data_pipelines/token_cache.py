"""A text source tokenized once into the data cache, through the sharded preparation."""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Optional

from data_pipelines.cache import cache_key, cache_root, cached_dir


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
        prepare(source.name, source.path, str(tokenizer_dir), tmp, text_column=source.column, workers=workers or 1,
                source=source, progress=Progress(every_s=10.0, label="zoo: data: tokenized"))

    return cached_dir(entry, build)
