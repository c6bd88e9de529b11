"""Text sources: the embedded corpus, local files through `datasets`, Hugging Face datasets,
and weighted mixtures of them, read into documents with bad data counted, never dropped
silently.

- `pydoc`: the Python documentation inside CPython (no download).
- `files`: `data.path` is a file, a directory or a glob of .txt (one document per file),
  .jsonl/.json, .parquet or .csv files (the `data.text_column` column, default `text`).
- `hub`: `data.path` is a `save_to_disk` directory, a local directory `load_dataset` reads,
  or a Hub dataset name (needs the network); its `train` split's text column.
- mixtures: `data.mix=[{name: files, path: a.jsonl, weight: 3}, {name: pydoc, weight: 1}]`;
  each source contributes documents in proportion to its weight (by characters, sources
  repeated or cut deterministically).
"""
from __future__ import annotations

import glob
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

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


def _read_files(path: str, column: str, counts: Dict[str, int]) -> List[str]:
    import datasets

    texts: List[str] = []
    for f in expand_paths(path):
        kind = TEXT_SUFFIXES[f.suffix.lower()]
        if kind == "text":  # decoded here so invalid bytes are counted, not a crash in a worker
            raw = f.read_bytes()
            try:
                texts.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                texts.append(raw.decode("utf-8", errors="replace"))
                counts["invalid_utf8_replaced"] = counts.get("invalid_utf8_replaced", 0) + 1
            continue
        if f.stat().st_size == 0:  # datasets fails on an empty file with a bare StopIteration
            counts["empty_files_skipped"] = counts.get("empty_files_skipped", 0) + 1
            continue
        try:
            table = datasets.load_dataset(kind, data_files=str(f), split="train")
        except Exception as err:  # datasets raises many types for unreadable files
            root = err.__cause__ or err.__context__ or err  # datasets wraps the parser's own words
            why = f"{type(root).__name__}: {str(root).splitlines()[0] if str(root) else ''}"
            raise DataError(f"cannot read {f} as {kind}: {why}; fix the file or leave it out of data.path") from None
        texts.extend(_column(table, column, str(f)))
    return texts


def _read_hub(path: str, column: str) -> List[str]:
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
    return list(_column(ds, column, f"data.path={path}"))


def _clean(texts: Sequence, counts: Dict[str, int]) -> List[str]:
    out = []
    for t in texts:
        if not isinstance(t, str) or not t.strip():
            counts["empty_skipped"] = counts.get("empty_skipped", 0) + 1
            continue
        out.append(t)
    return out


def read_source(name: str, path: Optional[str] = None, text_column: str = "text") -> Documents:
    """The documents of one source, empty ones skipped and counted."""
    counts: Dict[str, int] = {}
    if name == "pydoc":
        from data_pipelines.corpus import pydoc_documents

        texts = pydoc_documents()
        key = f"pydoc:{len(texts)}:{sum(map(len, texts))}"
    elif name in ("files", "hub"):
        if not path:
            raise DataError(f"data.name={name} needs data.path (a file, directory or glob"
                            f"{'' if name == 'files' else ', or a dataset name'})")
        if name == "files":
            texts = _read_files(path, text_column, counts)
            key = f"files:{_fingerprint(expand_paths(path))}:{text_column}"
        else:
            texts = _read_hub(path, text_column)
            key = f"hub:{path}:{text_column}:{len(texts)}:{sum(len(t or '') for t in texts)}"
    else:
        raise DataError(f"data.name={name!r} is not a text source; use pydoc, files or hub")
    texts = _clean(texts, counts)
    if not texts:
        raise DataError(f"data.name={name}{' data.path=' + path if path else ''} holds no text "
                        f"({counts.get('empty_skipped', 0)} empty records and {counts.get('empty_files_skipped', 0)} "
                        f"empty files skipped); point data.path at files with text")
    return Documents(texts, key, counts)


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
