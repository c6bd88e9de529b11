"""How fast a run starts.

    python benchmarks/startup.py --phases [--rounds 3]   # the default command's time to its first step
    python benchmarks/startup.py [--rounds 2] [--steps 2]  # spawn against the forkserver

--phases: `python -m zoo.train logger=none` (the tiny GPT on pydoc, one rank) to the end of
its first step, phase by phase as the run's summary.json records them (`startup`,
zoo/observe/startup.py): cold (an empty data cache: the tokenizer is trained, the corpus
packed, the CPU's matmul peak measured) and warm (the cache of the cold run), median of the
rounds. Targets: <= 10 s cold, <= 5 s warm, on 2 cores.

Without --phases: wall time of short local runs with the ranks started by spawn (each rank
imports torch, DeepSpeed, transformers on its own) and by the forkserver (one server imports
them once and forks each rank), interleaved, same command otherwise; prints the ratio per
layout. Run on an idle machine; the losses of both are compared too (they must be identical)."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAYOUTS = {"zero1 (2 ranks)": ["parallel=zero1"],
           "3d (8 ranks)": ["parallel=3d", "trainer.global_batch_size=12"]}


def one(method: str, layout: list, steps: int, root: Path) -> tuple[float, list]:
    run_dir = root / f"{method}-{time.time_ns()}"
    env = {**os.environ, "ZOO_START_METHOD": method, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "zoo.train", f"hydra.run.dir={run_dir}", *layout, "debug=fast",
                    "logger=none", f"trainer.max_steps={steps}", "trainer.sample_tokens=0", "optim.warmup_steps=1"],
                   cwd=REPO, env=env, check=True, capture_output=True)
    took = time.perf_counter() - t0
    losses = [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return took, losses


def phases_of(cache: Path, root: Path) -> dict:
    run_dir = root / f"phases-{time.time_ns()}"
    env = {**os.environ, "ZOO_CACHE": str(cache), "WANDB_MODE": "disabled"}
    env.pop("OMP_NUM_THREADS", None)  # the default command as a user types it
    subprocess.run([sys.executable, "-m", "zoo.train", f"hydra.run.dir={run_dir}", "logger=none",
                    "trainer.max_steps=1", "trainer.sample_tokens=0", "trainer.progress=false"],
                   cwd=REPO, env=env, check=True, capture_output=True)
    return json.loads((run_dir / "summary.json").read_text())["startup"]


def main_phases(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cold, warm = [], []
        for i in range(rounds):
            cache = root / f"cache{i}"
            cold.append(phases_of(cache, root))
            warm.append(phases_of(cache, root))
        keys = list(cold[0])
        print(f"cpus {os.cpu_count()}, {rounds} rounds, `python -m zoo.train logger=none` to the end of its first "
              f"step (seconds, median)")
        print(f"{'phase':16s} {'cold':>6s} {'warm':>6s}")
        for k in keys:
            c, w = statistics.median(r[k] for r in cold), statistics.median(r[k] for r in warm)
            print(f"{k:16s} {c:6.2f} {w:6.2f}")
        c, w = statistics.median(r["total"] for r in cold), statistics.median(r["total"] for r in warm)
        print(f"targets: cold {c:.1f} s <= 10: {c <= 10}; warm {w:.1f} s <= 5: {w <= 5}")


def main() -> None:
    if "--phases" in sys.argv:
        ap = argparse.ArgumentParser()
        ap.add_argument("--phases", action="store_true")
        ap.add_argument("--rounds", type=int, default=3)
        main_phases(ap.parse_args().rounds)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        one("spawn", LAYOUTS["zero1 (2 ranks)"], 1, root)  # warm the data cache
        print(f"cpus {os.cpu_count()}, {a.rounds} rounds, {a.steps} steps, interleaved")
        for name, layout in LAYOUTS.items():
            times = {"spawn": [], "forkserver": []}
            losses = {}
            for _ in range(a.rounds):
                for method in times:
                    took, losses[method] = one(method, layout, a.steps, root)
                    times[method].append(took)
            s, f = statistics.median(times["spawn"]), statistics.median(times["forkserver"])
            print(f"{name:16s} spawn {s:6.1f} s  forkserver {f:6.1f} s  spawn/forkserver {s / f:4.2f}x  "
                  f"losses identical: {losses['spawn'] == losses['forkserver']}")


if __name__ == "__main__":
    main()
