"""The checkpoint's index of saved boxes, merged once at save and read per tensor at resume.

Each rank writes `index-RRRRR.json`, the boxes of its own shard. A resume that read all of
them would be O(world) on every rank: at 1,024 ranks under ZeRO-3, ~370 MB of JSON and 1,024
file opens a rank. So `finish` also writes the union once (rank 0, from what each rank sends
it: a few integers a box, no file read):

    index.json   {"format", "files": [shard names], "ndim": D,
                  "tensors": {name: {"shape", "dtype", "first", "count"}}}
    boxes.npy    int64 rows [file, key, offset_0..offset_D-1, size_0..size_D-1], a tensor's
                 `count` rows from `first` on, in order of their offsets

and a resume reads index.json (O(tensors)), memory-maps boxes.npy and touches only the rows
of the tensors it holds, selecting the ones that meet its own boxes with array arithmetic.
No pickle: np.load(allow_pickle=False). Checkpoints written before it resume from the per-
rank files (zoo.checkpoint.sharded.Index).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

FORMAT = "zoo-index-1"
INDEX, BOXES = "index.json", "boxes.npy"


def rank_part(shard: str, entries: Sequence[dict]) -> dict:
    """What a rank sends for the merged index: its shard's name, its tensors' names, shapes
    and dtypes once each, and one row of integers a box (entries: index-RRRRR.json's)."""
    names: Dict[str, int] = {}
    meta: List[Tuple[str, list, str]] = []
    ndim = max((len(e["offsets"]) for e in entries), default=1)
    rows = np.zeros((len(entries), 2 + 2 * ndim), dtype=np.int64)
    for i, e in enumerate(entries):
        if e["tensor"] not in names:
            names[e["tensor"]] = len(meta)
            meta.append((e["tensor"], list(e["shape"]), e["dtype"]))
        d = len(e["offsets"])
        rows[i, 0], rows[i, 1] = names[e["tensor"]], int(e["key"])
        rows[i, 2:2 + d] = e["offsets"]
        rows[i, 2 + ndim:2 + ndim + d] = e["sizes"]
        rows[i, 2 + ndim + d:] = 1  # a size of 1 in the dimensions the tensor lacks
    return {"file": shard, "tensors": meta, "rows": rows}


def write(directory: Path, parts: Sequence[dict]) -> None:
    """Merge every rank's part (rank_part) into index.json and boxes.npy in `directory`:
    one sort of all rows by (tensor name, offsets), no loop over tensors per rank."""
    ndim = max(((p["rows"].shape[1] - 2) // 2 for p in parts), default=1)
    ids: Dict[str, int] = {}  # tensor name -> its number here
    meta: List[Tuple[list, str]] = []
    wide_rows, tensor_of = [], []
    for f, part in enumerate(parts):
        local = np.array([ids.setdefault(name, len(ids)) for name, _, _ in part["tensors"]] or [0], dtype=np.int64)
        for name, shape, dtype in part["tensors"]:
            if ids[name] == len(meta):
                meta.append((shape, dtype))
        rows, d = part["rows"], (part["rows"].shape[1] - 2) // 2
        wide = np.ones((len(rows), 2 + 2 * ndim), dtype=np.int64)  # a size of 1 where a part has fewer dims
        wide[:, 0], wide[:, 1], wide[:, 2:2 + ndim] = f, rows[:, 1], 0
        wide[:, 2:2 + d], wide[:, 2 + ndim:2 + ndim + d] = rows[:, 2:2 + d], rows[:, 2 + d:]
        wide_rows.append(wide)
        tensor_of.append(local[rows[:, 0]])
    names = sorted(ids)
    place = np.empty(len(names), dtype=np.int64)  # a tensor's number here -> its place in name order
    place[[ids[n] for n in names]] = np.arange(len(names))
    rows = np.concatenate(wide_rows) if wide_rows else np.zeros((0, 2 + 2 * ndim), dtype=np.int64)
    group = place[np.concatenate(tensor_of)] if tensor_of else np.zeros(0, dtype=np.int64)
    order = np.lexsort((*rows[:, 2 + ndim - 1:1:-1].T, group))  # by name, then offsets
    rows, counts = rows[order], np.bincount(group, minlength=len(names))
    firsts = np.concatenate([[0], np.cumsum(counts)[:-1]]) if len(names) else counts
    tensors = {n: {"shape": meta[ids[n]][0], "dtype": meta[ids[n]][1], "first": int(firsts[i]), "count": int(counts[i])}
               for i, n in enumerate(names)}
    np.save(directory / BOXES, rows, allow_pickle=False)
    (directory / INDEX).write_text(json.dumps({"format": FORMAT, "files": [p["file"] for p in parts], "ndim": ndim,
                                               "tensors": tensors}, separators=(",", ":")))


class MergedIndex:
    """index.json and the memory-mapped boxes.npy of a checkpoint directory."""

    def __init__(self, directory: Path):
        record = json.loads((directory / INDEX).read_text())
        if record.get("format") != FORMAT:
            raise ValueError(f"{directory / INDEX} is of format {record.get('format')!r}, not {FORMAT}")
        self.files: List[str] = record["files"]
        self.ndim: int = record["ndim"]
        self.tensors: Dict[str, dict] = record["tensors"]
        self.rows = np.load(directory / BOXES, mmap_mode="r", allow_pickle=False)

    def boxes(self, tensor: str, near: Optional[Tuple[Tuple[int, ...], Tuple[int, ...]]] = None):
        """[(file, key, (offsets, sizes))] of `tensor`'s saved boxes; with `near` (a box of the
        full tensor) only those that meet it."""
        t = self.tensors[tensor]
        d = len(t["shape"])
        rows = np.asarray(self.rows[t["first"]:t["first"] + t["count"]])
        if near is not None and len(rows):
            off, size = rows[:, 2:2 + d], rows[:, 2 + self.ndim:2 + self.ndim + d]
            lo, hi = np.asarray(near[0], dtype=np.int64), np.asarray(near[0], dtype=np.int64) + np.asarray(near[1])
            rows = rows[((off < hi) & (off + size > lo)).all(axis=1)]
        return [(self.files[r[0]], str(r[1]), (tuple(int(x) for x in r[2:2 + d]),
                                                tuple(int(x) for x in r[2 + self.ndim:2 + self.ndim + d])))
                for r in rows]
