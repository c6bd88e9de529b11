"""Text sources: the embedded corpus, local files, Hugging Face datasets, and (for BERT)
weighted mixtures of them, with bad data counted, never dropped silently.

- `pydoc`: the Python documentation inside CPython (no download).
- `files`: `data.path` is a file, a directory or a glob of .txt (one document per file),
  .jsonl/.json, .parquet or .csv files (the `data.text_column` column, default `text`).
- `hub`: `data.path` is a `save_to_disk` directory, a local directory `load_dataset` reads,
  or a Hub dataset name (needs the network); its `train` split's text column.

`open_source` finds a source without reading it; its `texts()` streams the documents (files
one by one, jsonl line by line, tables and datasets row by row), which is how GPT and Llama
tokenize a source into the cache (data_pipelines.token_cache). `read_source` holds them in a
list (BERT's sentence pairs), and `mix` mixes such lists by characters (BERT's data.mix; GPT
and Llama mix prepared corpora by tokens: data_pipelines.mixture).
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from zoo.run.errors import DataError

TEXT_SUFFIXES = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


@dataclass
class Documents:
    texts: List[str]
    key: str
    """Identifies the content (for caches): source, paths with sizes and mtimes, settings."""
    counts: Dict[str, int] = field(default_factory=dict)
    """Skipped or repaired records by reason (empty, invalid_utf8_replaced, ...)."""


def expand_paths(path: str) -> List[Path]:
    """The readable text files `data.path` names (a file, a directory or a glob); DataError if none."""
    p = Path(path).expanduser()
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.suffix.lower() in TEXT_SUFFIXES)
    elif any(ch in path for ch in "*?["):
        files = sorted(Path(f) for f in glob.glob(os.path.expanduser(path), recursive=True))
    elif p.exists():
        files = [p]
    else:
        raise DataError(f"data.path={path}: no such file or directory")
    files = [f for f in files if f.is_file()]
    if not files:
        raise DataError(f"data.path={path} matches no file with a suffix among {sorted(TEXT_SUFFIXES)}")
    unknown = [f.name for f in files if f.suffix.lower() not in TEXT_SUFFIXES]
    if unknown:
        raise DataError(f"data.path={path}: cannot read {unknown[:3]}; use files ending in {sorted(TEXT_SUFFIXES)}")
    return files


def _fingerprint(files: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def _column(table, column: str, where: str) -> List:
    if column not in table.column_names:
        raise DataError(f"{where} has no column {column!r} (columns: {table.column_names}); "
                        f"set data.text_column")
    return table[column]


def _count(counts: Dict[str, int], reason: str) -> None:
    counts[reason] = counts.get(reason, 0) + 1


def _text_file(f: Path, counts: Dict[str, int]) -> str:
    """A .txt file's text: decoded here so invalid bytes are counted, not a crash in a worker."""
    raw = f.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        _count(counts, "invalid_utf8_replaced")
        return raw.decode("utf-8", errors="replace")


def numbered_jsonl_rows(f: Path) -> Iterator[Tuple[int, dict]]:
    """A .jsonl file's rows with their line numbers (blank lines counted, as an editor shows
    them), line by line (no table of a whole block of the file in memory)."""
    with open(f, encoding="utf-8", errors="replace") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{f} line {n} is not JSON ({err.msg}): a .jsonl file holds one JSON object a line") from None
            line = None  # not held beside its row while the row is used (a document of megabytes)
            if not isinstance(row, dict):
                raise DataError(f"{f} line {n} is a JSON {type(row).__name__}, not an object with a text column")
            yield n, row


def _jsonl_rows(f: Path) -> Iterator[dict]:
    """numbered_jsonl_rows without the numbers."""
    return (row for _, row in numbered_jsonl_rows(f))


def _table_rows(f: Path, kind: str) -> Iterator[dict]:
    """A .json/.parquet/.csv file's rows through `datasets` streaming (a batch at a time)."""
    import datasets

    try:
        rows = iter(datasets.load_dataset(kind, data_files=str(f), split="train", streaming=True))
        while True:
            try:
                row = next(rows)
            except StopIteration:
                return
            yield row
    except Exception as err:  # datasets raises many types for unreadable files
        root = err.__cause__ or err.__context__ or err  # datasets wraps the parser's own words
        why = f"{type(root).__name__}: {str(root).splitlines()[0] if str(root) else ''}"
        raise DataError(f"cannot read {f} as {kind}: {why}; fix the file or leave it out of data.path") from None


def _file_texts(files: Sequence[Path], column: str, counts: Dict[str, int]) -> Iterator[str]:
    for f in files:
        kind = TEXT_SUFFIXES[f.suffix.lower()]
        if kind == "text":
            yield _text_file(f, counts)
            continue
        if f.stat().st_size == 0:  # datasets fails on an empty file with a bare StopIteration
            _count(counts, "empty_files_skipped")
            continue
        for row in _jsonl_rows(f) if f.suffix.lower() == ".jsonl" else _table_rows(f, kind):
            if column not in row:
                raise DataError(f"{f} has no column {column!r} (columns: {sorted(row)}); set data.text_column")
            yield row[column]


def train_split(path: str):
    """The `train` split of a save_to_disk directory, a local directory load_dataset reads, or a
    Hub name: an Arrow table on disk (memory-mapped), read row by row."""
    import datasets

    local = Path(path).expanduser()
    if (local / "state.json").exists() or (local / "dataset_dict.json").exists():
        ds = datasets.load_from_disk(str(local))
    else:
        try:
            ds = datasets.load_dataset(str(local) if local.exists() else path)
        except Exception as err:
            raise DataError(f"data.path={path}: cannot load it with datasets ({type(err).__name__}: {err}); give a "
                            f"local dataset directory, or a Hub name on a machine that is online") from None
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise DataError(f"data.path={path} has no train split (splits: {list(ds)})")
        ds = ds["train"]
    return ds


def _hub_dataset(path: str, column: str):
    """train_split's `column`."""
    ds = train_split(path)
    _column(ds, column, f"data.path={path}")
    return ds.select_columns([column])


def _kept(texts: Iterable, counts: Dict[str, int]) -> Iterator[str]:
    """The texts that hold text; the others counted (empty_skipped)."""
    for t in texts:
        if not isinstance(t, str) or not t.strip():
            _count(counts, "empty_skipped")
            continue
        yield t


@dataclass
class TextSource:
    """One text source, opened (its files listed, its dataset found) but not read: `texts()`
    streams its documents, as often as asked, never holding them all."""

    name: str
    path: Optional[str]
    column: str
    key: str
    """Identifies the content (for caches) without reading it: paths with sizes and mtimes, a
    dataset's fingerprint, settings."""
    _files: List[Path] = field(default_factory=list, repr=False)
    _dataset: Any = field(default=None, repr=False)

    def texts(self, counts: Dict[str, int], part: Optional[Tuple[int, int]] = None) -> Iterator[str]:
        """The documents in order, empty ones skipped and counted into `counts` (also invalid
        UTF-8, replaced, and empty files). `part` (i, n): the files of part i of n only."""
        if self.name == "pydoc":
            from data_pipelines.corpus import pydoc_documents

            yield from _kept(pydoc_documents(), counts)
        elif self.name == "hub":
            yield from _kept((row[self.column] for row in self._dataset), counts)
        else:
            files = self._files
            if part is not None:
                from data_pipelines.prepare_parts import part_files

                files = part_files(files, *part)
            yield from _kept(_file_texts(files, self.column, counts), counts)

    def describe(self) -> str:
        return f"data.path={self.path}" if self.path else f"data={self.name}"


def open_source(name: str, path: Optional[str] = None, text_column: str = "text") -> TextSource:
    """The source `name` at `path`: DataError where its files or dataset cannot be found."""
    if name == "pydoc":
        from data_pipelines.corpus import pydoc_documents

        texts = pydoc_documents()  # built in and small: its size is its key
        return TextSource(name, None, text_column, f"pydoc:{len(texts)}:{sum(map(len, texts))}")
    if name not in ("files", "hub"):
        raise DataError(f"data.name={name!r} is not a text source; use pydoc, files or hub")
    if not path:
        raise DataError(f"data.name={name} needs data.path (a file, directory or glob"
                        f"{'' if name == 'files' else ', or a dataset name'})")
    if name == "files":
        files = expand_paths(path)
        return TextSource(name, path, text_column, f"files:{_fingerprint(files)}:{text_column}", _files=files)
    ds = _hub_dataset(path, text_column)
    return TextSource(name, path, text_column, f"hub:{path}:{text_column}:{ds._fingerprint}", _dataset=ds)


def no_text(source: TextSource, counts: Dict[str, int]) -> DataError:
    """The error of a source that yields no document."""
    return DataError(f"{source.describe()} holds no text ({counts.get('empty_skipped', 0)} empty records and "
                     f"{counts.get('empty_files_skipped', 0)} empty files skipped); point data.path at files with text")


def read_source(name: str, path: Optional[str] = None, text_column: str = "text") -> Documents:
    """The documents of one source in memory (BERT's sentence pairs; small sources), empty ones
    skipped and counted."""
    source = open_source(name, path, text_column)
    counts: Dict[str, int] = {}
    texts = list(source.texts(counts))
    if not texts:
        raise no_text(source, counts)
    return Documents(texts, source.key, counts)


def mix(sources: Sequence[Documents], weights: Sequence[float]) -> Documents:
    """Documents of several sources in proportion to `weights` (by characters): each
    source's documents are cycled or cut, in order, to its share of the mixture."""
    if len(sources) != len(weights) or any(w <= 0 for w in weights):
        raise DataError(f"data.mix weights {list(weights)} must be positive, one per source")
    sizes = [sum(map(len, s.texts)) for s in sources]
    # The mixture's size: every source at least once, scaled so the largest weight-to-size ratio is met.
    total = max(size / (w / sum(weights)) for size, w in zip(sizes, weights))
    texts, counts = [], {}
    for s, w in zip(sources, weights):
        want, got, i = total * w / sum(weights), 0, 0
        while got < want:
            doc = s.texts[i % len(s.texts)]
            texts.append(doc)
            got += len(doc)
            i += 1
        for k, v in s.counts.items():
            counts[k] = counts.get(k, 0) + v
    key = "mix:" + ",".join(f"{s.key}*{w}" for s, w in zip(sources, weights))
    return Documents(texts, key, counts)


def read_documents(data_cfg) -> Documents:
    """The documents `data_cfg` (a DataConfig) selects: one source, or `data.mix`."""
    if data_cfg.mix:
        parts = [read_source(m["name"], m.get("path"), m.get("text_column", data_cfg.text_column))
                 for m in data_cfg.mix]
        return mix(parts, [float(m.get("weight", 1.0)) for m in data_cfg.mix])
    return read_source(data_cfg.name, data_cfg.path, data_cfg.text_column)


def as_eval_path_error(err: Exception, eval_path: str) -> DataError:
    """A DataError about the held-out source, naming data.eval_path (the readers say data.path)."""
    text = str(err)
    if text.startswith("data.path="):
        return DataError("data.eval_path=" + text[len("data.path="):])
    return DataError(f"data.eval_path={eval_path}: {text}")
