"""Rendered conversations spilled to disk in shards, so a chat preparation holds none of them
whole and one stopped part-way goes on from its finished shards.

A shard is SHARD_CONVERSATIONS conversations in the records' order: their token ids
(`conv-NNNNN.ids`, int32), target masks (`.mask`, uint8), offsets (`.offsets.npy`), where each
came from (`.where`, a line each: for the errors of packing) and the ids that occur in it
(`.held.npy`: the separator must be none of them), then its marker (`.done`: the records
consumed through it, the conversations, digests of the ids and of the masks, kept while they
are appended) written last. A
shard's files are appended to as chunks of conversations come from the renderers, so memory
is one chunk's. `arguments`, a digest of what changes the rendering (the conversations' files,
the tokenizer, the template, data.train_on), is kept beside them: shards of other arguments are
removed, not reused.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import numpy as np

SHARD_CONVERSATIONS = 20_000
ARGUMENTS = "arguments.json"


def _stem(directory: Path, i: int) -> Path:
    return directory / f"conv-{i:05d}"


def _digests(ids: np.ndarray, mask: np.ndarray) -> Tuple[str, str]:
    """xxh3-64 of a shard's ids and of its masks (as `write` keeps them while it appends)."""
    import xxhash

    return xxhash.xxh3_64_hexdigest(ids.tobytes()), xxhash.xxh3_64_hexdigest(mask.tobytes())


class RenderShards:
    """The shards in `directory` for rendering `arguments` (a string): `done` (the intact ones'
    markers, in order), `records_done` (the records they consumed), `write(rendered)` (append
    conversations from where they end), `conversations()` (all of them, in order, read back),
    `held()` (the ids that occur anywhere)."""

    def __init__(self, directory: Path, arguments: str):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        kept = self.directory / ARGUMENTS
        if not kept.exists() or json.loads(kept.read_text()).get("arguments") != arguments:
            for f in self.directory.iterdir():  # another preparation's: nothing of it is reused
                if f.is_file():
                    f.unlink()
            kept.write_text(json.dumps({"arguments": arguments}))
        self.done: List[dict] = []
        while True:
            marker = _stem(self.directory, len(self.done)).with_suffix(".done")
            if not marker.exists() or not self._intact(len(self.done), json.loads(marker.read_text())):
                break
            self.done.append(json.loads(marker.read_text()))
        for f in self.directory.glob("conv-*"):  # a shard cut off part-way, and any after it
            if int(f.name[5:10]) >= len(self.done):
                f.unlink()

    @property
    def records_done(self) -> int:
        return self.done[-1]["records"] if self.done else 0

    def _intact(self, i: int, marker: dict) -> bool:
        stem = _stem(self.directory, i)
        try:
            ids = np.fromfile(stem.with_suffix(".ids"), dtype=np.int32)
            mask = np.fromfile(stem.with_suffix(".mask"), dtype=np.uint8)
        except OSError:
            return False
        return len(ids) == marker["tokens"] and list(_digests(ids, mask)) == marker["xxh3_64"]

    def write(self, rendered: Iterator[Tuple[str, np.ndarray, np.ndarray]]) -> None:
        """Append `rendered` (where, ids, mask), a conversation a record, from the records after
        `records_done`, as shards of SHARD_CONVERSATIONS."""
        size, start = SHARD_CONVERSATIONS, self.records_done
        shard: Optional[dict] = None
        try:
            for k, (where, ids, mask) in enumerate(rendered):
                if shard is None:
                    shard = self._open(len(self.done))
                ids_bytes, mask_bytes = np.asarray(ids, dtype=np.int32).tobytes(), np.asarray(mask, dtype=np.uint8).tobytes()
                shard["ids"].write(ids_bytes)
                shard["mask"].write(mask_bytes)
                shard["ids_digest"].update(ids_bytes)
                shard["mask_digest"].update(mask_bytes)
                shard["where"].write(where.replace("\n", " ") + "\n")
                shard["offsets"].append(shard["offsets"][-1] + len(ids))
                shard["held"][np.asarray(ids, dtype=np.int64)] = True
                shard["records"] = start + k + 1
                if len(shard["offsets"]) - 1 == size:
                    self._close(shard)
                    shard = None
            if shard is not None:
                self._close(shard)
                shard = None
        finally:  # stopped part-way (a bad record, an interrupt): the open shard has no marker
            if shard is not None:
                for f in ("ids", "mask", "where"):
                    shard[f].close()

    def _open(self, i: int) -> dict:
        import xxhash

        stem = _stem(self.directory, i)
        return {"i": i, "ids": open(stem.with_suffix(".ids"), "wb"), "mask": open(stem.with_suffix(".mask"), "wb"),
                "ids_digest": xxhash.xxh3_64(), "mask_digest": xxhash.xxh3_64(),
                "where": open(stem.with_suffix(".where"), "w", encoding="utf-8"), "offsets": [0], "records": 0,
                "held": _Held()}

    def _close(self, shard: dict) -> None:
        for f in ("ids", "mask", "where"):
            shard[f].close()
        stem = _stem(self.directory, shard["i"])
        np.save(stem.with_suffix(".offsets.npy"), np.asarray(shard["offsets"], dtype=np.int64))
        np.save(stem.with_suffix(".held.npy"), shard["held"].ids())
        marker = {"records": shard["records"], "conversations": len(shard["offsets"]) - 1,
                  "tokens": int(shard["offsets"][-1]),
                  "xxh3_64": [shard["ids_digest"].hexdigest(), shard["mask_digest"].hexdigest()]}
        tmp = stem.with_suffix(".done.tmp")
        tmp.write_text(json.dumps(marker))
        os.replace(tmp, stem.with_suffix(".done"))
        self.done.append(marker)

    def held(self) -> np.ndarray:
        """Every id that occurs in a conversation (sorted)."""
        parts = [np.load(_stem(self.directory, i).with_suffix(".held.npy")) for i in range(len(self.done))]
        return np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)

    def conversations(self) -> Iterator[Tuple[str, np.ndarray, np.ndarray]]:
        """(where, ids, mask) of every conversation, in order, read from the shards (memory-mapped)."""
        for i in range(len(self.done)):
            stem = _stem(self.directory, i)
            offsets = np.load(stem.with_suffix(".offsets.npy"))
            if offsets[-1] == 0:
                continue
            ids = np.memmap(stem.with_suffix(".ids"), dtype=np.int32, mode="r")
            mask = np.memmap(stem.with_suffix(".mask"), dtype=np.uint8, mode="r")
            with open(stem.with_suffix(".where"), encoding="utf-8") as wheres:
                for j, where in enumerate(wheres):
                    a, b = offsets[j], offsets[j + 1]
                    yield where.rstrip("\n"), np.asarray(ids[a:b], dtype=np.int64), np.asarray(mask[a:b])

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


class _Held:
    """The ids seen, as a growing boolean table."""

    def __init__(self):
        self.table = np.zeros(1 << 16, dtype=bool)

    def __setitem__(self, ids: np.ndarray, value: bool) -> None:
        if len(ids) and ids.max() >= len(self.table):
            grown = np.zeros(max(int(ids.max()) + 1, 2 * len(self.table)), dtype=bool)
            grown[:len(self.table)] = self.table
            self.table = grown
        self.table[ids] = value

    def ids(self) -> np.ndarray:
        return np.flatnonzero(self.table)
