"""What trainer.profile costs: the step time of the same 2-rank run (a) with the code before
the profiler existed (a git worktree of BASELINE), (b) this code with the profiler off,
(c) this code with a profiled window; interleaved rounds, the median step time over the
steps outside the first two (warm-up) and outside the window, and the window's own steps.

    python benchmarks/profile_overhead.py [--rounds 6] [--baseline REV] [--layout parallel=zero1]

BASELINE defaults to the commit before zoo/observe/profiler.py was added. Run on an idle machine.
"""
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
STEPS, START, WINDOW = 14, 5, 3  # rounds: a multiple of 3 (the order rotates)
COMMON = ["debug=fast", "logger=none", "trainer.sample_tokens=0", f"trainer.max_steps={STEPS}", "trainer.log_every=1",
          "optim.warmup_steps=1", "trainer.global_batch_size=8", "trainer.eval_batches=1"]


def baseline_rev() -> str:
    added = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--", "zoo/observe/profiler.py"],
                           cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    return f"{added[-1]}~1"


def step_times(code: Path, layout: str, extra: list, root: Path, cache: str) -> dict:
    run_dir = root / f"run-{time.time_ns()}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "ZOO_CACHE": cache,
           "PYTHONPATH": str(code)}
    subprocess.run([sys.executable, "-m", "zoo.train", f"hydra.run.dir={run_dir}", layout, *COMMON, *extra],
                   cwd=code, env=env, check=True, capture_output=True)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["step_time_s"] for r in rows if "step_time_s" in r}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--baseline", default=None)
    ap.add_argument("--layout", default="parallel=zero1")
    a = ap.parse_args()
    rev = a.baseline or baseline_rev()
    window = range(START, START + WINDOW)
    with tempfile.TemporaryDirectory() as tmp:
        root, cache = Path(tmp), str(Path(tmp) / "cache")
        before = root / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(before), rev], cwd=REPO, check=True,
                       capture_output=True)
        try:
            runs = {"before the profiler": (before, []), "profiler off": (REPO, []),
                    "profiler on": (REPO, [f"trainer.profile.start={START}", f"trainer.profile.steps={WINDOW}"])}
            plain = {name: [] for name in runs}
            profiled = []
            step_times(REPO, a.layout, [], root, cache)  # warm the data cache
            names = list(runs)
            for r in range(a.rounds):
                for name in names[r % 3:] + names[:r % 3]:  # each takes each place in a round as often
                    code, extra = runs[name]
                    t = step_times(code, a.layout, extra, root, cache)
                    plain[name] += [s for k, s in t.items() if k > 2 and k not in window]
                    if extra:
                        profiled += [t[k] for k in window]
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=REPO, capture_output=True)
    med = {name: statistics.median(v) for name, v in plain.items()}
    print(f"{a.layout}, {STEPS} steps x {a.rounds} interleaved rounds; baseline {rev}; median step time of steps "
          f"3..{STEPS} outside the window {START}-{START + WINDOW - 1}")
    for name, m in med.items():
        print(f"  {name:20s} {1e3 * m:7.1f} ms/step  ratio to before {m / med['before the profiler']:.3f}")
    w = statistics.median(profiled)
    print(f"  the window's own steps {1e3 * w:7.1f} ms/step: {w / med['profiler on']:.2f}x the run's other steps")


if __name__ == "__main__":
    main()
