"""What one rank spends to learn where its boxes are in a checkpoint at resume, against the
world size: every rank's index-RRRRR.json parsed (before) or the merged index read per tensor
(zoo.checkpoint.merged_index, now), and what rank 0 spends merging it at save.

    python benchmarks/resume_index.py [--worlds 64,256,1024] [--layers 80]

The indexes are those of llama2-70b's shape (h 8192, 80 layers, SwiGLU 28672, 8 KV heads,
vocab 32000) under ZeRO-3 at tp8 x ppP x dpD, synthesised with zoo's own box arithmetic
(zoo.checkpoint.boxes.flat_boxes over each tp shard, placed in the full tensor): every rank
holds a flat 1/dp of the tp shard of every parameter of its stage, for the fp32 weights and
AdamW's two moments (3 keys). No shard data is written: only the index files, in a temporary
folder. Each way runs in a fresh process as rank 0 of a resume on the same layout would: load
the index, then find the saved boxes that meet each of its own boxes. Memory is the Python
heap that tracemalloc sees (its peak); the memory-mapped rows are not heap.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TP = 8
KEYS = ("model", "exp_avg", "exp_avg_sq")


def tensors(layers: int):
    """(name, full shape, tp split dim or None) of llama2-70b's parameters, in stage order."""
    h, kv, inter, vocab = 8192, 1024, 28672, 32000
    out = [("embed.weight", (vocab, h), 0)]
    for i in range(layers):
        p = f"layers.{i}."
        out += [(p + "q.weight", (h, h), 0), (p + "k.weight", (kv, h), 0), (p + "v.weight", (kv, h), 0),
                (p + "o.weight", (h, h), 1), (p + "gate.weight", (inter, h), 0), (p + "up.weight", (inter, h), 0),
                (p + "down.weight", (h, inter), 1), (p + "norm1.weight", (h,), None), (p + "norm2.weight", (h,), None)]
    return out + [("norm.weight", (h,), None), ("lm_head.weight", (vocab, h), 0)]


def layout(world: int):
    """(pp, dp) for tp8 at `world` ranks: pp up to 8, then dp."""
    pp = min(8, world // TP)
    return pp, world // (TP * pp)


def rank_entries(rank: int, world: int, layers: int) -> list:
    from zoo.checkpoint.boxes import flat_boxes

    pp, dp = layout(world)
    tp_rank, rest = rank % TP, rank // TP
    stage, dp_rank = rest % pp, rest // pp
    params = tensors(layers)
    per_stage = math.ceil(len(params) / pp)
    entries, key = [], 0
    for name, full, split in params[stage * per_stage:(stage + 1) * per_stage]:
        shard = list(full)
        if split is not None:
            shard[split] //= TP
        numel = math.prod(shard)
        part = math.ceil(numel / dp)
        start, count = dp_rank * part, max(0, min(part, numel - dp_rank * part))
        for kind in KEYS:
            for off, size in flat_boxes(shard, start, count):
                off = list(off)
                if split is not None and tp_rank:
                    off[split] += tp_rank * shard[split]
                elif split is None and tp_rank:
                    continue  # a replicated tensor: written by tp rank 0
                entries.append({"tensor": f"{kind}/{name}", "shape": list(full), "dtype": "F32",
                                "offsets": off, "sizes": list(size), "key": str(key)})
                key += 1
    return entries


def child(way: str, directory: Path, world: int, layers: int) -> dict:
    from zoo.checkpoint import merged_index
    from zoo.checkpoint.boxes import intersect
    from zoo.checkpoint.sharded import Index

    mine = rank_entries(0, world, layers)  # what rank 0 needs on the same layout: its own boxes
    tracemalloc.start()
    t0 = time.perf_counter()
    if way == "merge":  # rank 0 at save: every rank's part (sent to it), merged and written
        parts = [merged_index.rank_part(f"shard-{r:05d}.safetensors", rank_entries(r, world, layers))
                 for r in range(world)]
        tracemalloc.reset_peak()
        t0 = time.perf_counter()
        merged_index.write(directory, parts)
        found = len(parts)
    else:
        if way == "before":
            (directory / merged_index.INDEX).rename(directory / "moved.json")
        try:
            index = Index(directory)
            found = 0
            for e in mine:  # what Index.fill does for each box it needs: intersect the candidates
                box = (tuple(e["offsets"]), tuple(e["sizes"]))
                found += sum(intersect(box, saved) is not None for _, _, saved in index.boxes(e["tensor"], box))
        finally:
            if way == "before":
                (directory / "moved.json").rename(directory / merged_index.INDEX)
    seconds = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    return {"way": way, "seconds": seconds, "heap_peak_mb": peak / 1e6, "found": found, "needed": len(mine)}


def run(way: str, directory: Path, world: int, layers: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", way, str(directory), str(world), str(layers)],
                         capture_output=True, text=True, cwd=REPO, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worlds", default="64,256,1024", help="world sizes, comma-separated (multiples of 8)")
    p.add_argument("--layers", type=int, default=80)
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        way, directory, world, layers = a.child
        print(json.dumps(child(way, Path(directory), int(world), int(layers))))
        return
    try:
        worlds = [int(w) for w in a.worlds.split(",")]
    except ValueError:
        p.error(f"--worlds {a.worlds!r}: give world sizes as integers, e.g. --worlds 64,256,1024")
    if any(w < TP or w % TP for w in worlds) or a.layers < 1:
        p.error(f"--worlds {a.worlds} must be multiples of {TP} (tp8) and --layers {a.layers} at least 1: "
                f"e.g. --worlds 64,256,1024 --layers 80")
    print(f"llama2-70b's shape ({a.layers} layers), ZeRO-3, tp{TP}; rank 0 of a resume on the same layout "
          f"finds the saved boxes that meet its own")
    print(f"{'world':>6} {'layout':>14} {'index files MB':>15} {'before s':>9} {'before MB':>10} {'now s':>7} "
          f"{'now MB':>7} {'merge s':>8} {'merge MB':>9} {'boxes found':>12}")
    for world in worlds:
        with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/tmp")) as tmp:
            d = Path(tmp)
            total = 0
            for r in range(world):
                text = json.dumps({"file": f"shard-{r:05d}.safetensors", "entries": rank_entries(r, world, a.layers)},
                                  separators=(",", ":"))
                (d / f"index-{r:05d}.json").write_text(text)
                total += len(text)
            merge = run("merge", d, world, a.layers)
            now, before = run("now", d, world, a.layers), run("before", d, world, a.layers)
            assert now["found"] == before["found"] == now["needed"], (now, before)  # each its own saved box
            pp, dp = layout(world)
            print(f"{world:6d} {f'tp{TP}-pp{pp}-dp{dp}':>14} {total / 1e6:15.1f} {before['seconds']:9.2f} "
                  f"{before['heap_peak_mb']:10.1f} {now['seconds']:7.3f} {now['heap_peak_mb']:7.1f} "
                  f"{merge['seconds']:8.2f} {merge['heap_peak_mb']:9.1f} {now['found']:12d}")
            print(f"{'':6} now / before: {now['seconds'] / before['seconds']:.3f} of the time, "
                  f"{now['heap_peak_mb'] / before['heap_peak_mb']:.3f} of the heap", flush=True)


if __name__ == "__main__":
    main()
