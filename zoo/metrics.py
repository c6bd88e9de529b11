"""The run directory's record: metrics.jsonl (one object per logged step), summary.json at
the end, the console line and the progress bar. Only rank 0 writes; other ranks hold a
`RunLog` that does nothing, so call sites never branch on the rank.
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


class RunLog:
    def __init__(self, run_dir: Path, *, active: bool, total_steps: int, progress: bool, start_step: int = 0):
        self.run_dir = Path(run_dir)
        self.active = active
        self._bar = None
        if active and progress and total_steps > 0:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step, desc="train", dynamic_ncols=True,
                             file=sys.stderr, disable=None)

    def step(self, record: Dict[str, Any]) -> None:
        """Append one logged step to metrics.jsonl and echo it on the console."""
        if not self.active:
            return
        with open(self.run_dir / "metrics.jsonl", "a") as fh:
            fh.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        line = (f"step {record['step']:>6} | loss {record['loss']:.4f} | lr {record['lr']:.2e} | "
                f"{record['tokens_per_s']:,.0f} tok/s | {record['step_time_s'] * 1e3:.0f} ms/step")
        self.write(line)

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

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
