"""`python -m data_pipelines.prepare` against a plain tokenizing loop, and its memory against
the corpus size (#38's numbers).

    python benchmarks/prepare_throughput.py [--mb 200] [--small-mb 50] [--workers 1 2 4]

The corpus is real text assembled on this machine: every .py, .rst and .txt file of the
Python standard library and /usr/share/doc's plain-text files, one jsonl document per file,
repeated until it holds --mb megabytes. A byte-level BPE tokenizer (8,192 tokens) is trained
on a sample of it. The plain loop reads the jsonl line by line and gives batches of 1,000
documents to the tokenizers library's encode_batch (its own threads, every core), writing
uint16 with numpy; zoo's prepare runs with its default workers (one per core) and with each
of --workers. For each: wall time, MB/s, tokens/s, CPU% (user + system over wall, the whole
process tree) and the peak memory of the process tree (proportional set size, so that the pages
forked workers share with the main process count once; sampled every 0.1 s).
Then prepare's peak on a corpus of --small-mb against --mb (target: within 10%, under 500 MB).

Last, the first training run on each corpus (`python -m zoo.train data=files data.path=CORPUS
data.tokenizer=TOK trainer.max_steps=1`, an empty cache): its time to the end of the first
step and the data phase inside it (the streamed preparation into the cache), the preparation's
throughput there, and the run's peak memory on --small-mb against --mb: the PSS of its process
tree sampled every 0.1 s, and the exact high-water mark (wait4's max RSS) of its largest process,
the training rank (the preparation runs in a process of its own that the rank waits for).
A second run on the same corpus finds the cache (its data phase is printed too).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLAIN = r"""
import json, sys
import numpy as np
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
eos = tok.token_to_id("<|endoftext|>")
n = 0
with open(sys.argv[3], "wb") as out:
    for f in sorted(__import__("glob").glob(sys.argv[2] + "/*.jsonl")):
        batch = []
        def flush():
            global n
            ids = [e.ids + [eos] for e in tok.encode_batch(batch, add_special_tokens=False)]
            arr = np.fromiter((t for d in ids for t in d), dtype=np.uint16)
            out.write(arr.tobytes())
            n += len(arr)
            batch.clear()
        with open(f) as fh:
            for line in fh:
                batch.append(json.loads(line)["text"])
                if len(batch) >= 1000:
                    flush()
        if batch:
            flush()
print(n)
"""


def corpus(dest: Path, mb: float) -> int:
    """jsonl files of real text under `dest`, at least `mb` megabytes; returns its bytes."""
    roots = [Path(sysconfig.get_paths()["stdlib"]), Path("/usr/share/doc")]
    texts = []
    for root in roots:
        for f in sorted(root.rglob("*")):
            if f.is_file() and (f.suffix in (".py", ".rst", ".txt") or (root.name == "doc" and not f.suffix)):
                try:
                    t = f.read_text(encoding="utf-8")
                except (UnicodeDecodeError, OSError):
                    continue
                if t.strip():
                    texts.append(t)
    dest.mkdir(parents=True, exist_ok=True)
    size, part, fh, written = 0, 0, None, 0
    target = int(mb * 1e6)
    while size < target:
        for t in texts:
            if fh is None or written > 20e6:
                if fh:
                    fh.close()
                fh, written, part = open(dest / f"part{part:04d}.jsonl", "w"), 0, part + 1
            line = json.dumps({"text": t}) + "\n"
            fh.write(line)
            size += len(t.encode())
            written += len(line)
            if size >= target:
                break
    fh.close()
    return size


def measured(cmd, env=None) -> dict:
    """Wall seconds, CPU% and the process tree's peak RSS (bytes) of running `cmd`."""
    import psutil

    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    peak, stop = [0], [False]

    def sample():
        root = psutil.Process(proc.pid)
        while not stop[0]:
            try:  # proportional set size: pages a forked worker shares with its parent counted once
                tree = [root, *root.children(recursive=True)]
                peak[0] = max(peak[0], sum(p.memory_full_info().pss for p in tree if p.is_running()))
            except psutil.Error:
                pass
            time.sleep(0.1)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    streams = {}
    readers = [threading.Thread(target=lambda k=k, f=f: streams.__setitem__(k, f.read()))
               for k, f in (("out", proc.stdout), ("err", proc.stderr))]
    for r in readers:
        r.start()
    # wait4: the kernel's high-water mark of the largest single process of the tree (the
    # command, or a descendant it waited for), exact where the 0.1 s samples can miss a spike
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    for r in readers:
        r.join()
    out, err = streams["out"], streams["err"]
    wall = time.perf_counter() - t0
    stop[0] = True
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} exited {proc.returncode}: {err[-2000:]}")
    cpu = usage.ru_utime + usage.ru_stime
    return {"wall": wall, "cpu": 100 * cpu / wall, "peak": peak[0], "maxrss": usage.ru_maxrss * 1024, "out": out,
            "err": err}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=200)
    ap.add_argument("--small-mb", type=float, default=50)
    ap.add_argument("--workers", type=int, nargs="*", default=[1, 2, 4])
    ap.add_argument("--no-first-run", dest="first_run", action="store_false",
                    help="leave out the first zoo.train data=files runs")
    a = ap.parse_args()
    if a.mb <= 0 or a.small_mb <= 0 or any(w < 1 for w in a.workers):
        ap.error("--mb and --small-mb must be positive and every --workers at least 1")
    from data_pipelines.tokenizer import train_gpt_tokenizer

    work = Path(tempfile.mkdtemp(prefix="zoo-prepare-bench-"))
    big, small = work / "big", work / "small"
    big_bytes, small_bytes = corpus(big, a.mb), corpus(small, a.small_mb)
    sample = [json.loads(line)["text"] for line in open(sorted(big.glob("*.jsonl"))[0])][:2000]
    tok_dir = train_gpt_tokenizer(sample, 8192, source_key=f"prepare-bench-{len(sample)}", cache_dir=str(work))
    print(f"corpus: {big_bytes / 1e6:.1f} MB of text ({len(list(big.glob('*.jsonl')))} jsonl files; stdlib sources "
          f"and /usr/share/doc, repeated), tokenizer: byte-level BPE 8,192; {os.cpu_count()} core(s)")
    rows = []
    plain = measured([sys.executable, "-c", PLAIN, str(Path(tok_dir) / "tokenizer.json"), str(big),
                      str(work / "plain.bin")])
    tokens = int(plain["out"].strip())
    rows.append(("plain encode_batch loop", plain))
    runs = [("prepare (default workers)", [])] + [(f"prepare --workers {w}", ["--workers", str(w)]) for w in a.workers]
    prepared = {}
    for name, extra in runs:
        out = work / f"prep-{len(prepared)}"
        r = measured([sys.executable, "-m", "data_pipelines.prepare", "--path", str(big), "--tokenizer", tok_dir,
                      "--out", str(out), *extra])
        meta = json.loads((out / "meta.json").read_text())
        assert meta["tokens"] == tokens, (meta["tokens"], tokens)  # the same tokens as the plain loop
        prepared[name] = r
        rows.append((name, r))
    print(f"{'':28} {'wall s':>7} {'MB/s':>6} {'tokens/s':>11} {'CPU%':>6} {'peak PSS MB':>12}")
    for name, r in rows:
        print(f"{name:28} {r['wall']:>7.1f} {big_bytes / 1e6 / r['wall']:>6.2f} {tokens / r['wall']:>11,.0f} "
              f"{r['cpu']:>6.0f} {r['peak'] / 1e6:>12.0f}")
    ratio = plain["wall"] / prepared["prepare (default workers)"]["wall"]
    print(f"prepare (default workers) / plain loop throughput: {ratio:.2f} (target >= 0.9)")
    small_run = measured([sys.executable, "-m", "data_pipelines.prepare", "--path", str(small), "--tokenizer", tok_dir,
                          "--out", str(work / "prep-small")])
    big_peak = prepared["prepare (default workers)"]["peak"]
    print(f"prepare's peak PSS (process tree): {small_bytes / 1e6:.0f} MB corpus {small_run['peak'] / 1e6:.0f} MB, "
          f"{big_bytes / 1e6:.0f} MB corpus {big_peak / 1e6:.0f} MB: ratio {big_peak / small_run['peak']:.2f} "
          f"(target within 10%, under 500 MB)")
    if a.first_run:
        first_runs(work, tok_dir, {"small": (small, small_bytes), "big": (big, big_bytes)})
    import shutil

    shutil.rmtree(work)


def _start_line(err: str) -> str:
    return next((line for line in err.splitlines() if line.startswith("zoo: start:")), "(no start line)")


def _phase(line: str, name: str) -> float:
    import re

    m = re.search(rf"\b{name} ([0-9.]+)", line)
    return float(m.group(1)) if m else float("nan")


def first_runs(work: Path, tok_dir, corpora: dict) -> None:
    """The first `zoo.train data=files` run on each corpus with an empty cache, then a second one."""
    print(f"{'first training run':28} {'to step 1 s':>11} {'data s':>7} {'MB/s':>6} {'peak PSS MB':>12} "
          f"{'max RSS MB':>11}")
    peaks, maxrss = {}, {}
    for name, (path, size) in corpora.items():
        for attempt in ("first", "again"):
            cmd = [sys.executable, "-m", "zoo.train", "data=files", f"data.path={path}", f"data.tokenizer={tok_dir}",
                   "trainer.max_steps=1", "trainer.sample_tokens=0", "trainer.eval_batches=1", "logger=none",
                   f"hydra.run.dir={work / f'run-{name}-{attempt}'}"]
            r = measured(cmd, env={"ZOO_CACHE": str(work / f"cache-{name}"), "WANDB_MODE": "disabled"})
            line = _start_line(r["err"] + r["out"])
            data = _phase(line, "data")
            to_first = float(line.split("zoo: start: ")[1].split(" s")[0]) if "zoo: start: " in line else float("nan")
            print(f"{f'{size / 1e6:.0f} MB corpus, {attempt} run':28} {to_first:>11.1f} {data:>7.1f} "
                  f"{size / 1e6 / data if attempt == 'first' else float('nan'):>6.2f} {r['peak'] / 1e6:>12.0f} "
                  f"{r['maxrss'] / 1e6:>11.0f}")
            if attempt == "first":
                peaks[name], maxrss[name] = r["peak"], r["maxrss"]
    print(f"first run's peak PSS (process tree, sampled): {peaks['small'] / 1e6:.0f} MB on the small corpus, "
          f"{peaks['big'] / 1e6:.0f} MB on the big one: ratio {peaks['big'] / peaks['small']:.2f}; its largest "
          f"process's max RSS (exact): {maxrss['small'] / 1e6:.0f} / {maxrss['big'] / 1e6:.0f} MB, ratio "
          f"{maxrss['big'] / maxrss['small']:.2f} (target within 10%, under 500 MB)")


if __name__ == "__main__":
    main()
