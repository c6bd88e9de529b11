"""The run directory's record: metrics.jsonl (one object per logged step), summary.json at
the end, the console line, the progress bar and the tracker (wandb, `zoo.tracking`). Only
rank 0 writes; other ranks hold a `RunLog` that does nothing, so call sites never branch on
the rank.
"""
from __future__ import annotations

import json
import math
import os
import resource
import sys
from pathlib import Path
from typing import Any, Dict, Optional

import torch


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated device memory on CUDA; on CPU the process's peak resident set."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _clean(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def _percent(value: float) -> str:
    return f"{value:.1%}"  # one precision for every reading: 1.0% and 35.0%, never 1% next to 0.2%


def _eval_parts(r: Dict[str, Any]) -> list:
    parts = [f"eval loss {r['eval_loss']:.4f}"]
    if "eval_perplexity" in r:
        parts.append(f"eval ppl {r['eval_perplexity']:,.1f}")
    if "eval_accuracy" in r:
        parts.append(f"eval acc {_percent(r['eval_accuracy'])}")
    parts += [f"{key[:-len('/acc')]} {_percent(r[key])}" for key in r if key.endswith("/acc")]  # trainer.eval_tasks
    return parts + [f"eval {r['eval_time_s']:.1f} s"]


def console_line(r: Dict[str, Any]) -> str:
    """One logged step on the console: what is there of the monitor's readings (and of a
    periodic evaluation at that step)."""
    if "loss" not in r:  # an evaluation at a step that logs nothing else
        return " | ".join([f"step {r['step']:>6}"] + _eval_parts(r))
    parts = [f"step {r['step']:>6}", f"loss {r['loss']:.4f}", f"lr {r['lr']:.2e}"]
    if r.get("grad_norm") is not None:
        parts.append(f"gnorm {float(r['grad_norm']):#.3g}")  # three digits, trailing zeros kept: 1.00, 0.797
    if "loss_scale" in r:
        parts.append(f"scale {r['loss_scale']:g}")
    speed = (f"{r['tokens_per_s']:,.0f} tok/s" if r["tokens_per_s"] != r["samples_per_s"]
             else f"{r['samples_per_s']:,.1f} samples/s")  # images count as one token each
    parts += [speed, f"{r['step_time_s'] * 1e3:.0f} ms/step"]
    if "mfu" in r:
        parts.append(f"MFU {_percent(r['mfu'])}")
    if "peak_mem_share" in r:
        parts.append(f"mem {r['peak_mem_bytes'] / 2**30:.2f} GiB ({_percent(r['peak_mem_share'])})")
    if "gpu_util" in r:
        parts.append(f"util {_percent(r['gpu_util'])}")
    for key, label in (("comm_share", "comm"), ("data_wait_share", "data wait")):
        if key in r:
            parts.append(f"{label} {_percent(r[key])}")
    if "eval_loss" in r:
        parts += _eval_parts(r)
    return " | ".join(parts)


class RunLog:
    def __init__(self, run_dir: Path, *, active: bool, total_steps: int, progress: bool, start_step: int = 0,
                 tracker=None):
        from zoo.observe.tracking import NullTracker

        self.run_dir = Path(run_dir)
        self.active = active
        self.tracker = tracker or NullTracker()
        self._bar = None
        if active and progress and total_steps > 0:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step, desc="train", dynamic_ncols=True,
                             file=sys.stderr, disable=None)

    def step(self, record: Dict[str, Any]) -> None:
        """Append one logged step to metrics.jsonl, echo it on the console, send it to the tracker."""
        if not self.active:
            return
        plain = {k: v.item() if isinstance(v, torch.Tensor) else v for k, v in record.items()}
        self._append(plain)
        self.write(console_line(plain))
        self.tracker.log({k: v for k, v in plain.items() if k != "diagnosis"}, step=plain["step"])

    def event(self, record: Dict[str, Any]) -> None:
        """Append a record that is no logged step (a restart's) to metrics.jsonl and the tracker's
        summary (a tracker's step history only grows: a restart goes back to its checkpoint's step)."""
        if not self.active:
            return
        self._append(record)
        self.tracker.summary({k: _clean(v) for k, v in record.items() if k != "step"})

    def _append(self, record: Dict[str, Any]) -> None:
        with open(self.run_dir / "metrics.jsonl", "a") as fh:
            fh.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")

    def advance(self, n: int, loss: Optional[float] = None) -> None:
        if self._bar is not None:
            self._bar.update(n)
            if loss is not None:
                self._bar.set_postfix(loss=f"{loss:.4f}", refresh=False)

    def write(self, line: str) -> None:
        if not self.active:
            return
        if self._bar is not None:
            self._bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def summary(self, values: Dict[str, Any]) -> None:
        if not self.active:
            return
        tmp = self.run_dir / "summary.json.tmp"
        tmp.write_text(json.dumps({k: _clean(v) for k, v in values.items()}, indent=1) + "\n")
        os.replace(tmp, self.run_dir / "summary.json")
        self.tracker.summary({k: _clean(v) for k, v in values.items() if k != "params_per_rank"})

    def close(self) -> None:
        """Close the progress bar (the tracker stays open for the summary)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def finish(self, exit_code: int = 0) -> None:
        self.close()
        self.tracker.finish(exit_code)
