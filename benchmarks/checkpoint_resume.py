"""Resume time on the layout that wrote a checkpoint: DeepSpeed's per-rank files (the native
path) against the layout-free files (every rank reads full tensors and slices its share).

For each layout, one run writes a checkpoint after one step; then the same checkpoint is
resumed twice on that layout, once as usual (native files) and once with
checkpoint.native=false, with no further steps. The time each resume spent reading is the
one the trainer prints ("read from its ... files in X s"); the ratio is layout-free / native.

    python benchmarks/checkpoint_resume.py [--layouts zero1,tp,zero3] [--n-embd 512 --n-layer 8]
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(run_dir: Path, *overrides: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "-m", "zoo.train", f"hydra.run.dir={run_dir}", *overrides], cwd=REPO,
                          env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{' '.join(overrides)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc.stdout


def read_seconds(stdout: str, how: str) -> float:
    found = re.search(rf"read from its {how} files in ([0-9.]+) s", stdout)
    if not found:
        sys.exit(f"no '{how}' resume in the output:\n{stdout[-2000:]}")
    return float(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layouts", default="zero1,tp,zero3")
    ap.add_argument("--n-embd", type=int, default=512)
    ap.add_argument("--n-layer", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2, help="resumes per path; the fastest counts")
    args = ap.parse_args()
    common = ["debug=fast", "trainer.sample_tokens=0", "trainer.eval_batches=1", "checkpoint.save_final=false",
              f"model.n_embd={args.n_embd}", f"model.n_layer={args.n_layer}", "model.n_head=8"]
    print(f"GPT n_embd {args.n_embd}, n_layer {args.n_layer}; resume read time, best of {args.repeats}")
    print(f"{'layout':8} {'native s':>9} {'layout-free s':>14} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for layout in args.layouts.split(","):
            written = Path(tmp) / layout
            run(written, *common, f"parallel={layout}", "trainer.max_steps=1", "checkpoint.every=1",
                "checkpoint.native=true")
            ckpt = written / "checkpoints" / "step_0000001"
            times = {}
            for how, extra in (("native", ["checkpoint.native=true"]), ("layout-free", ["checkpoint.native=false"])):
                times[how] = min(read_seconds(run(Path(tmp) / f"{layout}-{how}-{i}", *common, f"parallel={layout}",
                                                  "trainer.max_steps=1", f"resume={ckpt}", *extra), how)
                                 for i in range(args.repeats))
            print(f"{layout:8} {times['native']:9.2f} {times['layout-free']:14.2f} "
                  f"{times['layout-free'] / times['native']:6.1f}x", flush=True)


if __name__ == "__main__":
    main()
