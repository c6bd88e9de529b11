"""Naming the kernel's out-of-memory killer: a rank that died of SIGKILL while the kernel's
count of out-of-memory kills (/proc/vmstat `oom_kill`, which counts the host's and every
cgroup's kills) rose since the launch was killed for memory, and the user gets one line with
the last measured peak, the planner's estimate, the checkpoint a resume takes and the fix,
not "exit code -9"."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

VMSTAT = "/proc/vmstat"
COUNTER_ENV = "ZOO_TEST_OOM_COUNTER"  # tests: a file holding the count instead of /proc/vmstat


def oom_kills() -> Optional[int]:
    """The kernel's out-of-memory kills so far (None where it does not say)."""
    fake = os.environ.get(COUNTER_ENV)
    try:
        if fake:
            return int(Path(fake).read_text().strip() or 0)
        for line in Path(VMSTAT).read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _last_peak(run_dir: Path) -> Optional[dict]:
    """The last logged step's peak memory (the largest rank's) from metrics.jsonl."""
    last = None
    try:
        with open(run_dir / "metrics.jsonl") as fh:
            for line in fh:
                record = json.loads(line)
                if "peak_mem_bytes" in record:
                    last = record
    except (OSError, ValueError):
        pass
    return last


def oom_line(rank: int, run_dir: Path, estimate_bytes: Optional[float]) -> str:
    """The one line for a rank the out-of-memory killer took."""
    from zoo.checkpoint.verify import newest_step

    peak = _last_peak(run_dir)
    measured = (f"the last measured peak was {peak['peak_mem_bytes'] / 2**30:.2f} GiB a rank (rank "
                f"{peak.get('peak_mem_rank', '?')}, step {peak['step']})" if peak else "no step was measured before it")
    planned = (f"the planner estimated {estimate_bytes / 2**30:.2f} GiB a rank" if estimate_bytes
               else "the planner has no estimate for this model")
    found = newest_step(run_dir / "checkpoints")
    resume = (f"resume=auto takes checkpoint {found[0].name} (step {found[1]})" if found
              else "no checkpoint was written (checkpoint.every=N keeps one)")
    return (f"rank {rank} was killed by the kernel's out-of-memory killer (SIGKILL; the host ran out of memory): "
            f"{measured}; {planned}; {resume}. Fix: fewer ranks on this host, a smaller trainer.micro_batch_size, "
            f"model.activation_checkpointing=true or a higher parallel.zero_stage (python -m zoo.plan, or "
            f"parallel=auto, picks one that fits)")
