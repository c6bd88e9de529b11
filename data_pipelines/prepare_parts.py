"""Preparation beyond one machine: `prepare --part I/N` tokenizes part I of N of the file list
(one Slurm array task's share, slurm/prepare_array.sbatch), and `prepare --merge PART_DIR ...
--out DIR` makes the N parts one prepared directory: a meta.json indexing their shards where
they are (relative paths, no token copied), their counts summed and the tokenizer. A part is
a contiguous run of the sorted files, of about 1/N of their bytes, so the merged directory
holds the tokens of one preparation of all files, in the same order.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import List, Sequence, Tuple

import numpy as np

from zoo.run.errors import DataError


def parse_part(text: str, name: str) -> Tuple[int, int]:
    """(i, n) of `--part I/N`; DataError (one line) for another form or i outside [0, n)."""
    m = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not m:
        raise DataError(f"--part {text}: give I/N, part I (counted from 0) of N, e.g. --part 0/8")
    i, n = int(m.group(1)), int(m.group(2))
    if n < 1 or i >= n:
        raise DataError(f"--part {text}: part {i} of {n} does not exist: I runs from 0 to {max(n - 1, 0)} "
                        f"(a Slurm array's --part $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT)")
    if name != "files":
        raise DataError(f"--part {text} splits the files of --name files; --name {name} is read as one source")
    return i, n


def part_files(files: Sequence[Path], i: int, n: int) -> List[Path]:
    """Part i of n of `files` (sorted): the files whose first byte falls in [i/n, (i+1)/n) of
    all their bytes, so that the parts are contiguous and near-equal in size."""
    sizes = np.array([f.stat().st_size for f in files], dtype=np.float64)
    starts = np.concatenate([[0.0], np.cumsum(sizes)[:-1]]) / max(sizes.sum(), 1.0)
    owner = np.minimum((starts * n).astype(int), n - 1)
    return [f for f, o in zip(files, owner) if o == i]


def merge(parts: Sequence[Path], out: Path) -> dict:
    """One prepared directory `out` over the finished `prepare --part` outputs `parts`."""
    records = []
    for d in parts:
        if not (d / "meta.json").is_file() or not (d / "prepare.json").is_file():
            raise DataError(f"--merge {d}: not a finished preparation (no meta.json or prepare.json): run its "
                            f"prepare --part again, it continues from its intact shards")
        records.append((d, json.loads((d / "prepare.json").read_text()), json.loads((d / "meta.json").read_text())))
    given = sorted(str(job.get("part")) for _, job, _ in records)
    n = {job["part"].split("/")[1] if job.get("part") else None for _, job, _ in records}
    if None in n or len(n) != 1:
        raise DataError(f"--merge takes the outputs of one prepare --part I/N each, of one N; given parts {given}")
    n = int(n.pop())
    order = sorted(records, key=lambda r: int(r[1]["part"].split("/")[0]))
    have = [int(job["part"].split("/")[0]) for _, job, _ in order]
    if have != list(range(n)):
        missing = sorted(set(range(n)) - set(have))
        raise DataError(f"--merge: parts {have} of {n} given" + (f"; part(s) {missing} missing" if missing else
                                                                 "; a part is given twice"))
    first = order[0][1]
    for d, job, _ in order[1:]:
        differ = [k for k in ("tokenizer_xxh3_64", "dtype", "source", "text_column") if job.get(k) != first.get(k)]
        if differ:
            raise DataError(f"--merge: {d} was prepared with another {', '.join(differ)} than {order[0][0]} "
                            f"({', '.join(f'{job.get(k)!r} against {first.get(k)!r}' for k in differ)}): prepare "
                            f"every part with the same --path, --text-column and --tokenizer")
    out.mkdir(parents=True, exist_ok=True)
    shards, skipped, unigram = [], {}, None
    for d, _, meta in order:
        for s in meta["shards"]:
            shards.append({**s, "file": os.path.relpath(d / s["file"], out)})
        for k, v in meta["skipped"].items():
            skipped[k] = skipped.get(k, 0) + v
        counts = np.load(d / "unigram_counts.npy")
        unigram = counts if unigram is None else unigram + counts
    np.save(out / "unigram_counts.npy", unigram)
    if (out / "tokenizer").exists():
        shutil.rmtree(out / "tokenizer")
    shutil.copytree(order[0][0] / "tokenizer", out / "tokenizer")
    m0 = order[0][2]
    meta = {"format": m0["format"], "dtype": m0["dtype"], "tokens": sum(m["tokens"] for _, _, m in order),
            "documents": sum(m["documents"] for _, _, m in order), "eos_id": m0["eos_id"], "vocab": m0["vocab"],
            "source": m0["source"], "skipped": skipped, "merged_from": [os.path.relpath(d, out) for d, _, _ in order],
            "shards": shards}
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta
