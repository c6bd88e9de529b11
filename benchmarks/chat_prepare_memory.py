"""What preparing conversations for fine-tuning holds: the preparing process's peak resident
memory at two sizes of the same generated set, and a preparation stopped part-way and run again.

    python benchmarks/chat_prepare_memory.py [--small 10000 --large 80000 --block 256]

Each size is one `python -m data_pipelines.prepare --format chat --workers 1` (one process: the
rendering, the packing and the writing all in it), its peak RSS read from the kernel
(ru_maxrss of the finished child). The conversations are data_pipelines.chat_synthetic's
(a ChatML tokenizer trained here); `--no-packing` for the unpacked rows. A preparation that
holds the set grows with it; one that streams it through its rendering shards does not
(target: large / small peak at most 1.2x for 8x the conversations). Then the large set is
prepared again, stopped (SIGTERM) once half its shards are written, and run once more: that
run's time against a whole run's, and the same bytes.
"""
from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _prepare(chats: Path, tok: Path, out: Path, block: int, packing: bool, stop_after_shards: int = 0) -> dict:
    cmd = [sys.executable, "-m", "data_pipelines.prepare", "--format", "chat", "--path", str(chats), "--tokenizer",
           str(tok), "--block-size", str(block), "--out", str(out), "--workers", "1", *([] if packing else ["--no-packing"])]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if stop_after_shards:
        while len(list((out / "rendering").glob("*.done"))) < stop_after_shards and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate()
    took = time.perf_counter() - t0
    if not stop_after_shards and proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{err[-2000:]}")
    return {"s": took, "rc": proc.returncode, "stderr": err}


def _peak_of_child(fn) -> tuple:
    """(fn(), the peak RSS in MB of the one child it runs): a fresh interpreter per size, so the
    children's maximum is that child's."""
    code = (f"import json, resource, sys; sys.path.insert(0, {str(REPO)!r}); sys.path.insert(0, {str(REPO / 'benchmarks')!r});"
            f"from chat_prepare_memory import {fn[0]} as f; r = f(*{fn[1]!r}); "
            f"print(json.dumps([r, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return tuple(json.loads(out.strip().splitlines()[-1]))


def prepared(chats: str, tok: str, out: str, block: int, packing: bool) -> float:
    return _prepare(Path(chats), Path(tok), Path(out), block, packing)["s"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", type=int, default=10_000)
    ap.add_argument("--large", type=int, default=80_000)
    ap.add_argument("--block", type=int, default=256)
    a = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from data_pipelines import chat_shards
    from data_pipelines.chat_synthetic import write_chat_tokenizer, write_conversations

    work = Path(tempfile.mkdtemp(prefix="zoo-chat-memory-"))
    tok = work / "tok"
    write_chat_tokenizer(tok)
    print(f"conversations of data_pipelines.chat_synthetic, block {a.block}, one process (--workers 1); "
          f"rendering shards of {chat_shards.SHARD_CONVERSATIONS:,}", flush=True)
    peaks = {}
    for packing in (True, False):
        for n in (a.small, a.large):
            chats = work / f"chats-{n}.jsonl"
            if not chats.exists():
                write_conversations(chats, n)
            out = work / f"out-{n}-{packing}"
            took, peak = _peak_of_child(("prepared", (str(chats), str(tok), str(out), a.block, packing)))
            meta = json.loads((out / "meta.json").read_text())
            peaks[(packing, n)] = peak
            print(f"{'packed' if packing else 'unpacked'} {n:>7,} conversations: peak {peak:6.0f} MB, {took:6.1f} s, "
                  f"{meta['tokens'] // (a.block + 1):,} rows", flush=True)
        ratio = peaks[(packing, a.large)] / peaks[(packing, a.small)]
        print(f"  {'packed' if packing else 'unpacked'}: {a.large / a.small:.0f}x the conversations, {ratio:.2f}x the "
              f"peak (target <= 1.2x)", flush=True)
    chats, whole = work / f"chats-{a.large}.jsonl", work / f"out-{a.large}-True"
    shards = -(-a.large // chat_shards.SHARD_CONVERSATIONS)
    part = work / "stopped"
    _prepare(chats, tok, part, a.block, True, stop_after_shards=max(1, shards // 2))
    done = len(list((part / "rendering").glob("*.done")))
    again = _prepare(chats, tok, part, a.block, True)
    full = _prepare(chats, tok, work / "again-whole", a.block, True)
    same = (part / "tokens-00000.bin").read_bytes() == (whole / "tokens-00000.bin").read_bytes() and \
        (part / "mask-00000.bin").read_bytes() == (whole / "mask-00000.bin").read_bytes()
    print(f"stopped after {done} of {shards} shards, run again: {again['s']:.1f} s against {full['s']:.1f} s for a whole "
          f"run ({again['s'] / full['s']:.2f}x); the same bytes as one run: {same}", flush=True)
    print(f"(runs in {work})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
