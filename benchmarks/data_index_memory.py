"""What a training rank holds to index a large prepared corpus: the split into train and
held-out blocks and the epoch's sample order, against the arrays it held before.

    python benchmarks/data_index_memory.py [--tokens 100e9] [--block-size 2048] [--eval-fraction 0.01] [--family bert]

A prepared directory of --tokens uint16 tokens is written as sparse shards of 2 GB (no disk
used, every token 0: the index never reads a token it does not train on), and each way of
indexing it runs in a fresh process, as a rank would at its start: open the directory
(data=prepared), split the blocks, build epoch 0's order and read the first global batch's
sample indices and one micro-batch. Memory is the numpy heap that tracemalloc sees (its peak
and what stays after the build) and the process's RSS before and after; the memory-mapped
shards are not heap, and the one micro-batch read touches 16 KB of them.

"before" is the code up to this benchmark's commit, reproduced as it was: a boolean mask of
the held-out blocks, np.flatnonzero of it and of its negation (int64 block numbers of each
side), and Generator.permutation over the train blocks (int64). "now" is
data_pipelines.prepare.PreparedBlocks and data_pipelines.schedule.SampleStream as they are:
the same blocks (tests/unit/data/test_block_index.py), and since session 26 the epoch's
order computed at the positions read (data_pipelines.permutation), another order than the
permutation's, which SampleStream(order="numpy") still gives for runs that began with it.

--family bert: BERT over the same prepared directory (each block one `[CLS] block [SEP]`
sample, length-bucketed batches). "before": data_pipelines.mlm.PackedMLMSamples as it was
(np.arange of the train and held-out sample numbers, np.full of every length), the task's
lengths of the train samples and the whole-epoch BucketedStream (kept for runs that began
with it); "now": IndexRange sample numbers, lengths by arithmetic, and PooledBuckets
(data_pipelines.bucket_stream), which sorts only the pool of the batch read.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHARD_BYTES = 2_000_000_000
GLOBAL_BATCH, MICRO_BATCH = 1024, 8


def sparse_corpus(dest: Path, tokens: int) -> None:
    """A prepared directory of `tokens` uint16 zeros in sparse shards, and its meta.json."""
    dest.mkdir(parents=True, exist_ok=True)
    shards, left, i = [], tokens * 2, 0
    while left > 0:
        size = min(SHARD_BYTES, left)
        f = dest / f"tokens-{i:05d}.bin"
        with open(f, "wb") as fh:
            fh.truncate(size)
        shards.append({"file": f.name, "bytes": size, "tokens": size // 2})
        left, i = left - size, i + 1
    (dest / "meta.json").write_text(json.dumps({"dtype": "uint16", "tokens": tokens, "documents": 1,
                                                "eos_id": 0, "shards": shards}))
    np.save(dest / "unigram_counts.npy", np.zeros(8192, dtype=np.int64))


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(way: str, directory: Path, block_size: int, eval_fraction: float) -> dict:
    from data_pipelines.lm import held_out
    from data_pipelines.prepare import PreparedBlocks
    from data_pipelines.schedule import SampleStream

    rss0 = rss_mb()
    tracemalloc.start()
    blocks = PreparedBlocks(directory, block_size, eval_fraction)  # the same directory and rows either way
    if way == "before":
        n = len(blocks.train) + len(blocks.eval)
        held = held_out(n, eval_fraction)
        train_index, eval_index = np.flatnonzero(~held), np.flatnonzero(held)
        order = np.random.default_rng([0, 0]).permutation(len(train_index))
        samples = order[:GLOBAL_BATCH]
        rows = np.stack([blocks.train.rows[int(train_index[s])] for s in samples[:MICRO_BATCH]])
        kept = (held, train_index, eval_index, order)
    else:
        stream = SampleStream(len(blocks.train), seed=0)
        samples = stream.indices(0, GLOBAL_BATCH)
        rows = blocks.train[samples[:MICRO_BATCH]]
        kept = (blocks, stream)
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert rows.shape == (MICRO_BATCH, block_size + 1) and kept
    return {"way": way, "blocks": len(blocks.train) + len(blocks.eval), "train_blocks": len(blocks.train),
            "first_samples": [int(s) for s in samples[:4]], "heap_mb": current / 1e6, "heap_peak_mb": peak / 1e6,
            "rss_mb": rss_mb() - rss0}


def child_bert(way: str, directory: Path, block_size: int, eval_fraction: float) -> dict:
    from data_pipelines.bucket_stream import PooledBuckets
    from data_pipelines.mlm import BucketedStream, PackedMLMSamples

    rss0 = rss_mb()
    tracemalloc.start()
    samples = PackedMLMSamples(directory, block_size + 1, eval_fraction, cls_id=1, sep_id=2)  # blocks as GPT's
    n_train, n_eval = len(samples.train), len(samples.eval)
    if way == "before":
        train, held = np.arange(n_train), np.arange(n_train, n_train + n_eval)
        lengths = np.full(n_train + n_eval, block_size + 1, dtype=np.int64)
        stream = BucketedStream(lengths[train], global_batch=GLOBAL_BATCH, seed=0)
        kept = (train, held, lengths, stream)
    else:
        stream = PooledBuckets(n_train, lambda p: samples.length_of(samples.train[p]), global_batch=GLOBAL_BATCH,
                               seed=0)
        kept = (stream,)
    first = stream.indices(0, GLOBAL_BATCH)
    rows = np.stack([samples.tokens(int(samples.train[int(i)]))[0] for i in first[:MICRO_BATCH]])
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert rows.shape == (MICRO_BATCH, block_size + 1) and kept
    return {"way": way, "blocks": n_train + n_eval, "train_blocks": n_train,
            "first_samples": [int(s) for s in first[:4]], "heap_mb": current / 1e6, "heap_peak_mb": peak / 1e6,
            "rss_mb": rss_mb() - rss0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=float, default=100e9, help="tokens in the corpus (default 100e9)")
    p.add_argument("--block-size", type=int, default=2048)
    p.add_argument("--eval-fraction", type=float, default=0.01)
    p.add_argument("--family", choices=("gpt", "bert"), default="gpt",
                   help="gpt: blocks in a shuffled order (default); bert: [CLS] block [SEP] samples, length-bucketed")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.tokens < 2 * (a.block_size + 1) or a.block_size < 1 or not 0 <= a.eval_fraction < 1:
        p.error(f"--tokens {a.tokens:.0f} must hold two blocks of --block-size + 1 = {a.block_size + 1} and "
                f"--eval-fraction {a.eval_fraction} lie in [0, 1): give e.g. --tokens 100e9 --block-size 2048 "
                f"--eval-fraction 0.01")
    if a.child:
        build = child_bert if a.family == "bert" else child
        print(json.dumps(build(a.child[0], Path(a.child[1]), a.block_size, a.eval_fraction)))
        return
    tokens = int(a.tokens)
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/tmp")) as tmp:
        sparse_corpus(Path(tmp) / "corpus", tokens)
        res = {}
        for way in ("before", "now"):
            out = subprocess.run([sys.executable, __file__, "--tokens", str(a.tokens), "--block-size",
                                  str(a.block_size), "--eval-fraction", str(a.eval_fraction), "--family", a.family,
                                  "--child", way,
                                  str(Path(tmp) / "corpus")], capture_output=True, text=True, cwd=REPO, check=True)
            res[way] = json.loads(out.stdout.strip().splitlines()[-1])
    b, n = res["before"], res["now"]
    assert b["blocks"] == n["blocks"] and b["train_blocks"] == n["train_blocks"], (b, n)
    blocks = n["blocks"]
    print(f"{a.family}: corpus: {tokens / 1e9:,.0f}B tokens, {blocks:,} blocks of {a.block_size + 1} "
          f"({n['train_blocks']:,} trained on), eval_fraction {a.eval_fraction}; the same blocks either way")
    print(f"{'a rank indexing it':22} {'heap MB':>9} {'heap peak MB':>13} {'RSS MB':>8} {'bytes/block':>12}")
    for r in (b, n):
        print(f"{r['way']:22} {r['heap_mb']:9.1f} {r['heap_peak_mb']:13.1f} {r['rss_mb']:8.1f} "
              f"{r['heap_mb'] * 1e6 / blocks:12.2f}")
    print(f"now / before, heap held: {n['heap_mb'] / b['heap_mb']:.3f}; peak: {n['heap_peak_mb'] / b['heap_peak_mb']:.3f}")
    per_rank = {r["way"]: r["heap_mb"] * 1e6 / blocks * (1e12 / (a.block_size + 1)) / 1e9 for r in (b, n)}
    print(f"projected for 1T tokens at this block size, a rank: {per_rank['before']:.2f} GB before, "
          f"{per_rank['now']:.2f} GB now; a node of 8 ranks: {8 * per_rank['before']:.1f} GB before, "
          f"{8 * per_rank['now']:.1f} GB now")


if __name__ == "__main__":
    main()
