"""What in-loop downstream tasks (trainer.eval_tasks) cost a run.

    python benchmarks/eval_tasks_cost.py [--steps 200] [--eval-every 0] [--tasks python_keywords] [--layout ddp]

Runs the default command (`python -m zoo.train`: the tiny GPT on the built-in corpus, the
default batch, `trainer.max_steps` steps, logger off) twice in this one invocation: with
trainer.eval_tasks and without. Prints the tasks' scoring time (each evaluation's
`tasks_time_s` in metrics.jsonl, summed) as a share of the training time (steps x tokens a
step / tokens per second), and the runs' peak memory per rank with the tasks against without.
Targets (issue #55): under 5% of the training time at the defaults (trainer.eval_every=0: one
evaluation, at the end), and no more memory than an evaluation batch of the loss (the peak
with the tasks no higher than without: a scoring micro-batch holds as many tokens as a
training one, forward only)."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(root: Path, name: str, overrides: list) -> dict:
    run_dir = root / name
    env = {**os.environ, "WANDB_MODE": "disabled"}
    subprocess.run([sys.executable, "-m", "zoo.train", f"hydra.run.dir={run_dir}", "logger=none",
                    "trainer.progress=false", *overrides], cwd=REPO, env=env, check=True, capture_output=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"summary": summary, "tasks_s": sum(r.get("tasks_time_s", 0.0) for r in records),
            "evaluations": sum("tasks_time_s" in r for r in records)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200, help="trainer.max_steps (default 200, the default's)")
    p.add_argument("--eval-every", type=int, default=0, help="trainer.eval_every (default 0: at the end only)")
    p.add_argument("--tasks", default="python_keywords", help="trainer.eval_tasks, comma-separated")
    p.add_argument("--layout", default="ddp", help="parallel= preset (default ddp: one rank)")
    a = p.parse_args()
    if a.steps < 1 or a.eval_every < 0:
        p.error(f"--steps {a.steps} must be >= 1 and --eval-every {a.eval_every} >= 0")
    common = [f"trainer.max_steps={a.steps}", f"trainer.eval_every={a.eval_every}", f"parallel={a.layout}"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with_tasks = run(root, "tasks", [*common, f"trainer.eval_tasks=[{a.tasks}]"])
        without = run(root, "plain", common)
    s = with_tasks["summary"]
    train_s = s["steps_run"] * s["global_batch_size"] / s["samples_per_s"]  # the monitor's training time
    metrics = {k: v for k, v in s.items() if "/" in k and not k.startswith("best")}
    print(f"layout {a.layout}: {s['steps_run']} steps of global batch {s['global_batch_size']} "
          f"(micro {s['micro_batch_size']}), trainer.eval_every={a.eval_every}, trainer.eval_tasks=[{a.tasks}]")
    print(f"training {train_s:.1f} s; tasks scored {with_tasks['evaluations']} time(s) in {with_tasks['tasks_s']:.2f} s: "
          f"{with_tasks['tasks_s'] / train_s:.1%} of the training time")
    peak, plain_peak = s["peak_mem_bytes"], without["summary"]["peak_mem_bytes"]
    print(f"peak memory per rank: {peak / 2**30:.3f} GiB with the tasks, {plain_peak / 2**30:.3f} GiB without "
          f"({peak / plain_peak:.3f}x)")
    print("metrics: " + ", ".join(f"{k} {v:.3f}" for k, v in metrics.items()))


if __name__ == "__main__":
    main()
