"""ZeRO stages against ZeRO-0 at dp=2, and DeepSpeed's settings that might close the gap.

    python benchmarks/zero_overhead.py [--rounds 2] [--steps 20]

Each variant is `python -m zoo.train` (GPT 4 layers d256, block 256, 2 ranks, micro-batch 4,
global 16: 2 micro-batches per rank per step) for --steps steps; tokens/s is the run's own
(summary.json, start-up excluded) and the peak memory its rank 0's. Variants run in rounds,
the order reversed every other round; the table gives each variant's median, its ratio to
ZeRO-0's median, and the ratio to ZeRO-0 within each round (the same minute of the machine):
their median and the rounds within 5%. Settings tried: `overlap_comm` (off by default for
stages 1-2), a reduce bucket of 5e6 elements instead of 5e8, `round_robin_gradients`,
`reduce_scatter` off (an all-reduce of the bucket instead of one reduce per rank's
partition), `contiguous_gradients` off. Target: ZeRO-1/2 within 5% of ZeRO-0.

--micro 8 gives one micro-batch per rank per step: ZeRO-2 reduces its gradients after every
micro-batch's backward (DeepSpeed's stage_1_and_2.py `reduce_ready_partitions_and_remove_grads`:
`partition_gradients or is_gradient_accumulation_boundary()`), ZeRO-0 and ZeRO-1 once per step,
so with accumulation ZeRO-2 communicates once per micro-batch and without it as often as they do.
(Measured on 2 cores, 3 rounds each: ZeRO-2 0.964 of ZeRO-0 with --micro 8, 0.981 with 4: the
extra reductions cost less than the rounds' spread at this size.)
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
ZO = "+deepspeed.zero_optimization"
VARIANTS = {
    "zero0 (ddp)": ["parallel=ddp", "parallel.dp=2"],
    "zero1": ["parallel=zero1"],
    "zero2": ["parallel=zero2"],
    "zero2 overlap_comm": ["parallel=zero2", f"{ZO}.overlap_comm=true"],
    "zero2 bucket 5e6": ["parallel=zero2", f"{ZO}.reduce_bucket_size=5000000",
                         f"{ZO}.allgather_bucket_size=5000000"],
    "zero1 round_robin": ["parallel=zero1", f"{ZO}.round_robin_gradients=true"],
    "zero2 reduce_scatter off": ["parallel=zero2", f"{ZO}.reduce_scatter=false"],
    "zero2 contiguous off": ["parallel=zero2", f"{ZO}.contiguous_gradients=false"],
    "zero1 reduce_scatter off": ["parallel=zero1", f"{ZO}.reduce_scatter=false"],
    "zero3": ["parallel=zero3"],
}
MODEL = ["model.n_layer=4", "model.n_embd=256", "model.n_head=4", "model.block_size=256",
         "trainer.global_batch_size=16", "trainer.sample_tokens=0", "trainer.eval_batches=1", "logger=none",
         "optim.warmup_steps=1", "trainer.progress=false"]


def one(args: list, steps: int, root: Path, micro: int = 4) -> dict:
    run_dir = root / f"run-{time.time_ns()}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    cmd = [sys.executable, "-m", "zoo.train", f"hydra.run.dir={run_dir}", *MODEL, *args,
           f"trainer.max_steps={steps}", f"trainer.log_every={steps}", f"trainer.micro_batch_size={micro}"]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-8:])
        raise SystemExit(f"zero_overhead.py: {' '.join(args)} exited {done.returncode}:\n{tail}")
    return json.loads((run_dir / "summary.json").read_text())


def main() -> None:
    from gpt_vs_hf import positive  # this folder is the script's sys.path[0]

    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=positive, default=2)
    p.add_argument("--steps", type=positive, default=20)
    p.add_argument("--only", nargs="*", help="variant names to run (default: all)")
    p.add_argument("--micro", type=int, default=4,
                   help="micro-batch size (global 16 at dp=2: 4 gives 2 micro-batches per rank per step, 8 gives 1)")
    a = p.parse_args()
    unknown = [n for n in a.only or () if n not in VARIANTS]
    if unknown:
        p.error(f"--only {' '.join(map(repr, unknown))}: no such variant; the variants: "
                f"{', '.join(map(repr, VARIANTS))}")
    if a.micro < 1 or 16 % (2 * a.micro):
        p.error(f"--micro {a.micro} does not divide the global batch 16 over dp=2; use 1, 2, 4 or 8")
    variants = {k: v for k, v in VARIANTS.items() if not a.only or k in a.only or k == "zero0 (ddp)"}
    tps = {k: [] for k in variants}
    peak = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for name in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
                s = one(variants[name], a.steps, Path(tmp), a.micro)
                tps[name].append(s["tokens_per_s"])
                peak[name] = s["peak_mem_bytes"]
    base = statistics.median(tps["zero0 (ddp)"])
    print(f"GPT L=4 C=256 T=256, dp=2, micro {a.micro} x accum {16 // (2 * a.micro)}, {a.steps} steps, "
          f"{a.rounds} alternating rounds, 1 thread per rank")
    print(f"{'variant':<22} {'tokens/s':>9} {'/zero0':>7} {'per round':>10} {'<=5%':>5} {'rank-0 peak MiB':>16}")
    for name in variants:
        med = statistics.median(tps[name])
        paired = [t / b for t, b in zip(tps[name], tps["zero0 (ddp)"])]
        within = sum(r >= 0.95 for r in paired)
        print(f"{name:<22} {med:9,.0f} {med / base:7.3f} {statistics.median(paired):10.3f} {within:>2}/{len(paired):<2} "
              f"{peak[name] / 2**20:16,.0f}   (rounds: {', '.join(f'{t:,.0f}' for t in tps[name])})")


if __name__ == "__main__":
    main()
