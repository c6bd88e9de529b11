"""The planner against measurement on this machine: `python -m zoo.plan ... plan.measure=K` on
the cpu cluster preset (this 2-core machine, calibrated in conf/cluster/cpu.yaml) runs the
planner's top K layouts for a few steps each through python -m zoo.train and prints predicted
beside measured; this script prints that table and the two ratios #37 asks for: the planner's
pick against the measured fastest (target within 15%), and its memory estimate against the
measured peak (target within 15%).

    python benchmarks/plan_vs_measured.py [--measure 4] [--steps 6] [-- extra zoo.plan overrides]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--measure", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    cmd = [sys.executable, "-m", "zoo.plan", "model=gpt", "model.size=tiny", "model.n_layer=4", "cluster=cpu",
           "precision=fp32", "trainer.global_batch_size=16", f"plan.measure={a.measure}",
           f"plan.measure_steps={a.steps}", *a.extra]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True).stdout
    table = out[out.index("Measured here"):]
    print("$ " + " ".join(["python"] + cmd[1:]))
    print(table.rstrip())
    rows = [line.split() for line in table.splitlines() if "tp=" in line and line.strip()[:1].isdigit()]
    measured = [float(r[-5]) for r in rows]
    pick_vs_best = measured[0] / min(measured)
    mem_ratio = float(rows[0][-1])
    print(f"planner's pick / measured fastest step time: {pick_vs_best:.2f} (target <= 1.15)")
    print(f"planner's pick: measured peak / estimated memory: {mem_ratio:.2f} (target within 0.85-1.15)")


if __name__ == "__main__":
    main()
