"""A text source tokenized once into the data cache, through the sharded preparation."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

from data_pipelines.cache import cache_key, cache_root, cached_dir

LABEL = "zoo: data: tokenized"


def prepare_cached(source, tokenizer_dir: str, *, cache_dir: Optional[str] = None,
                   workers: Optional[int] = None, in_process: bool = False) -> Path:
    """The cache entry holding `source` (a data_pipelines.text_sources.TextSource) tokenized by
    `tokenizer_dir`: a prepared directory (data_pipelines.prepare's shards, streamed from the
    source, never a list of its texts), read like data=prepared. Keyed by the source's content
    key and the tokenizer, not by block size or split: blocks are cut when read, so another
    model.block_size reuses it. Built once under the cache's lock (the first rank builds, the
    others wait), with a progress line every few seconds.

    The preparation runs in a fresh interpreter (`python -m data_pipelines.token_cache`), not in
    the calling training rank: its memory (tokenizer, batches in flight, heap that glibc keeps
    after freeing) is returned when it ends instead of staying under the training that follows,
    and its `workers` processes (default: one per core) fork from a process that holds no
    process group's threads. `in_process`: prepare here instead (tests that watch the stream)."""
    from zoo.run.errors import DataError

    tok_json = Path(tokenizer_dir) / "tokenizer.json"
    tok_id = hashlib.sha256(tok_json.read_bytes()).hexdigest() if tok_json.exists() else str(tokenizer_dir)
    entry = cache_root(cache_dir) / "datasets" / f"tokens-{cache_key(source=source.key, tokenizer=tok_id)}"
    job = {"name": source.name, "path": source.path, "column": source.column, "key": source.key,
           "tokenizer": str(tokenizer_dir), "workers": workers}

    def build(tmp: Path) -> None:
        print(f"zoo: data: tokenizing {source.describe()} into the cache ({entry.name}) once; later runs reuse it",
              file=sys.stderr, flush=True)
        if in_process:
            _prepare(job, tmp, source)
            return
        package_root = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
        child = subprocess.run([sys.executable, "-m", "data_pipelines.token_cache", json.dumps({**job, "out": str(tmp), "parent": os.getpid()})],
                               stdout=subprocess.PIPE, text=True, env=env)
        if child.returncode == 2:  # a DataError, its one line on stdout
            raise DataError(child.stdout.strip())
        if child.returncode != 0:
            raise RuntimeError(f"the preparation of {source.describe()} into the cache exited {child.returncode} "
                               f"(its error above)")

    return cached_dir(entry, build)


def _prepare(job: dict, out: Path, source=None) -> None:
    from data_pipelines.prepare import Progress, prepare
    from zoo.run.errors import DataError

    if source is None:
        from data_pipelines.text_sources import open_source

        source = open_source(job["name"], job["path"], job["column"])
        if source.key != job["key"]:
            raise DataError(f"{source.describe()} changed while the run started (its files' sizes or modification "
                            f"times); start the run again")
    prepare(source.name, source.path, job["tokenizer"], out, text_column=source.column, workers=job["workers"],
            source=source, progress=Progress(every_s=10.0, label=LABEL))


def _die_with_parent() -> None:
    """Linux: end when the training rank that started this preparation ends (killed mid-way)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main(argv=None) -> None:
    from data_pipelines.prepare import _steady_malloc
    from zoo.run.errors import DataError

    job = json.loads((argv or sys.argv[1:])[0])
    _die_with_parent()
    if os.getppid() != job["parent"]:  # the rank ended before the signal was armed
        sys.exit(1)
    _steady_malloc()
    try:
        _prepare(job, Path(job["out"]))
    except DataError as err:
        print(err, flush=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
