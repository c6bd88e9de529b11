"""The block a finished run ends with on the console: its result (the family's metric against
its baseline), speed and memory, where the run directory is and what is in it, the sample as
text, and the next commands. Built from summary.json's values, so the console and the file
say the same."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List

EXPORT = "python -m zoo.export {run} {run}/hf"
COMPARE = "python -m zoo.compare {run} [OTHER_RUN ...]"
# Printed only where the run ends with a checkpoint of its last step: the resume takes the
# run's own config.yaml (zoo.config.continuation), so these keys are all it needs.
CONTINUE = "python -m zoo.train hydra.run.dir={run} resume=auto trainer.max_steps=N  (continue, on any layout)"


def _number(value: Any) -> float | None:
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def _metric(s: Dict[str, Any]) -> str:
    """The family's held-out result in words."""
    loss = _number(s.get("eval_loss"))
    if loss is None:
        return "no evaluation (trainer.eval_batches=0)"
    parts = [f"eval loss {loss:.4f}"]
    if "eval_perplexity" in s:
        ppl = _number(s["eval_perplexity"])
        parts.append(f"perplexity {ppl:,.1f}" if ppl is not None else "perplexity overflows (loss >= 50)")
        if _number(s.get("unigram_perplexity")):
            parts[-1] += f" (unigram {s['unigram_perplexity']:,.1f})"
    if "eval_accuracy" in s:
        base = s.get("baseline_accuracy", s.get("majority_class_accuracy"))
        what = "masked-token accuracy" if "eval_masked_tokens" in s else "top-1 accuracy"
        parts.append(f"{what} {s['eval_accuracy']:.1%}" + (f" (baseline {base:.1%})" if _number(base) is not None else ""))
    for key in (k for k in s if k.endswith("/acc")):  # trainer.eval_tasks
        task = key[:-len("/acc")]
        other = (f"acc_norm {s[task + '/acc_norm']:.1%}" if task + "/acc_norm" in s
                 else f"ppl {s[task + '/ppl']:,.1f}" if task + "/ppl" in s else "")
        parts.append(f"{task} acc {s[key]:.1%}" + (f" ({other})" if other else ""))
    return ", ".join(parts)


def _contents(run_dir: Path) -> str:
    known = [("model.safetensors", "weights"), ("model.safetensors.index.json", "weights, a file per pipeline stage"),
             ("checkpoints", "checkpoints"), ("metrics.jsonl", "metrics"),
             ("summary.json", "summary"), ("config.yaml", "config"), ("topology.txt", "rank grid"),
             ("topology.png", "its picture"), ("profile", "profiler traces"), ("tokenizer", "tokenizer"), ("tasks", "task rows scored"),
             ("wandb", "wandb files")]
    have = [f"{name}{'/' if (run_dir / name).is_dir() else ''} ({what})" for name, what in known
            if (run_dir / name).exists()]
    return ", ".join(have) or "nothing"


def result_lines(s: Dict[str, Any], run_dir: Path, *, export: bool = True, resumable: bool = False) -> List[str]:
    """`export`: the family has a Hugging Face form; `resumable`: a checkpoint of the last step exists."""
    speed = (f"{s['tokens_per_s']:,.0f} tokens/s" if s.get("tokens_per_s") and s.get("tokens_per_s") !=
             s.get("samples_per_s") else f"{s.get('samples_per_s', 0):,.1f} samples/s")
    ran, at = s.get("steps_run", s.get("steps", 0)), s.get("steps", 0)  # a resumed run: this start's steps
    steps = f"{ran} steps" + (f" (steps {at - ran + 1}-{at})" if ran != at else "")
    facts = [f"{steps}, {s.get('wall_time_s', 0):.1f} s from the first step to the end", speed]
    if _number(s.get("mfu")) is not None:
        facts.append(f"MFU {s['mfu']:.1%}")
    if s.get("peak_mem_bytes"):
        ranks = len(s.get("peak_mem_bytes_per_rank") or [])
        facts.append(f"peak memory {s['peak_mem_bytes'] / 2**30:.2f} GiB"
                     + (f" (rank {s['peak_mem_rank']}, the largest of {ranks})" if ranks > 1 else ""))
    lines = ["zoo: result: " + _metric(s), "zoo: run: " + ", ".join(facts)]
    metric = s.get("best_eval_metric", "eval_loss")
    label = "eval loss" if metric == "eval_loss" else metric
    best = _number(s.get("best_eval_loss" if metric == "eval_loss" else "best_eval_value"))
    if s.get("stopped_early_at_step"):
        lines.append(f"zoo: stopped early at step {s['stopped_early_at_step']} (trainer.early_stop): the best {label} "
                     f"was {best:.4f} at step {s['best_eval_step']}")
    elif best is not None and s.get("best_eval_step") != s.get("steps"):
        lines.append(f"zoo: best {label} {best:.4f} at step {s['best_eval_step']} (the final one is "
                     f"{'above' if metric == 'eval_loss' or metric.endswith('/ppl') else 'below'} it)")
    if s.get("sample"):
        lines.append(f"zoo: sample (prompt {s.get('sample_prompt', '')!r}):")
        lines += ["    " + line for line in str(s["sample"]).splitlines() or [""]]
    lines.append(f"zoo: run directory {run_dir}: {_contents(run_dir)}")
    commands = [cmd.format(run=run_dir) for cmd in ([EXPORT] if export else []) + [COMPARE]
                + ([CONTINUE] if resumable else [])]
    lines.append("zoo: next: " + commands[0])
    lines += ["           " + cmd for cmd in commands[1:]]
    return lines
