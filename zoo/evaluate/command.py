"""Score downstream tasks on a run, a checkpoint or a transformers directory with
lm-evaluation-harness (offline, on this machine's task files).

    python -m zoo.evaluate RUN_DIR_OR_CHECKPOINT_OR_HF_DIR --tasks python_keywords,tasks/arc.jsonl [--batch-size 8]

The tasks are trainer.eval_tasks' (zoo.evaluate.tasks: JSON Lines of {context, choices, gold}
or {context, continuation}, `python -m zoo.evaluate.tasks convert` makes them from HellaSwag,
ARC, PIQA and LAMBADA; or a built-in name). A run or a checkpoint is first exported
(zoo.export, tensor by tensor) to a temporary directory beside it; the harness's `HFLM` then
computes every (context, choice)'s log-likelihood and greedy match on the transformers model,
and the metrics are the in-loop scorer's (TASK/acc, TASK/acc_norm or TASK/ppl: the same
numbers as trainer.eval_tasks gives on the same weights, tested). The table is printed and
written as JSON to RUN_DIR/eval/harness.json (a transformers directory: DIR/zoo_eval.json, or
--out), which `zoo.compare` shows beside the run's own metrics. Needs `pip install 'lm_eval[hf]'`.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from zoo.run.errors import ConfigError, ZooError


def _hf_directory(src: Path, scratch: Path) -> Path:
    """`src` if it is a transformers directory, else its export into `scratch`."""
    if (src / "config.json").is_file():
        return src
    from zoo.export import export

    print(f"zoo.evaluate: exporting {src} to score it", flush=True)
    return export(src, scratch / "hf")


def _check_causal(src: Path, config: dict) -> None:
    """A model that continues text: not one of zoo's other families (BERT's masked LM), and
    where the config names its classes, a causal LM's."""
    from zoo.families.registry import FAMILIES

    kind = config.get("model_type")
    masked = [s.name for s in FAMILIES.values() if s.hf is not None and kind in s.hf.model_types and not s.generates_text]
    named = config.get("architectures") or []
    if masked or (named and not any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in named)):
        raise ConfigError(f"{src} holds a {kind} model ({', '.join(named) or masked[0]}), which continues no text: "
                          f"downstream tasks score a causal language model (a GPT or Llama run)")


def _results_path(src: Path, out: Path | None) -> Path:
    if out is not None:
        return out
    if (src / "config.json").is_file():
        return src / "zoo_eval.json"
    run = src if (src / "config.yaml").is_file() else src.parent.parent  # a checkpoint: RUN/checkpoints/NAME
    return run / "eval" / "harness.json"


def evaluate(src: Path, task_names: list, batch_size: int, out: Path | None, shots: int = 0, seed: int = 0) -> dict:
    from zoo.evaluate.harness import harness_metrics, harness_model, harness_rows
    from zoo.evaluate.tasks import shot_tasks

    if not src.exists():
        raise ConfigError(f"{src} does not exist: give a run directory, a checkpoint or a transformers directory")
    tasks = shot_tasks(task_names, shots, seed, key="--tasks")  # every file checked before the model loads
    with tempfile.TemporaryDirectory(dir=src if src.is_dir() else None, prefix=".zoo_eval_") as scratch:
        hf = _hf_directory(src, Path(scratch))
        _check_causal(src, json.loads((hf / "config.json").read_text()))
        rows = harness_rows(harness_model(hf, batch_size, None), tasks)
    metrics = harness_metrics(tasks, rows)
    path = _results_path(src, out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"source": str(src), "tasks": task_names, "shots": shots, "metrics": metrics},
                               indent=1) + "\n")
    return {"metrics": metrics, "path": path}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m zoo.evaluate", description=__doc__.split("\n")[0])
    parser.add_argument("src", type=Path, help="a run directory, a checkpoint or a transformers directory")
    parser.add_argument("--tasks", required=True, help="comma-separated task files or built-in names")
    parser.add_argument("--batch-size", type=int, default=8, help="the harness's batch size (default 8)")
    parser.add_argument("--shots", type=int, default=0,
                        help="few-shot examples from each task's train split (trainer.eval_task_shots'; default 0)")
    parser.add_argument("--seed", type=int, default=0, help="the shots' seed (a run's: its trainer.seed)")
    parser.add_argument("--out", type=Path, default=None, help="where the JSON goes (default: see above)")
    args = parser.parse_args(argv)
    names = [t for t in args.tasks.split(",") if t]
    try:
        if args.batch_size < 1 or args.shots < 0 or not names:
            raise ConfigError(f"--batch-size {args.batch_size} must be >= 1, --shots {args.shots} >= 0 and --tasks "
                              f"{args.tasks!r} name at least one task (e.g. --tasks python_keywords)")
        done = evaluate(args.src, names, args.batch_size, args.out, args.shots, args.seed)
    except (ZooError, OSError) as err:
        print(f"zoo.evaluate: error: {err}", file=sys.stderr)
        sys.exit(2)
    width = max(len(k) for k in done["metrics"])
    for key, value in done["metrics"].items():
        print(f"{key.ljust(width)}  {value:,.2f}" if key.endswith("/ppl") else f"{key.ljust(width)}  {value:.1%}")
    print(f"zoo.evaluate: wrote {done['path']}")


if __name__ == "__main__":
    main()
