"""Wall time of short local runs with the ranks started by spawn (each rank imports torch,
DeepSpeed, transformers on its own) and by the forkserver (one server imports them once and
forks each rank), interleaved, same command otherwise; prints the ratio per layout.

    python benchmarks/startup.py [--rounds 2] [--steps 2]

Run on an idle machine; the losses of both are compared too (they must be identical)."""
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


def main() -> None:
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
