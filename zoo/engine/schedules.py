"""The learning-rate schedules (`optim.schedule`): a linear warmup, then

- `cosine` (default): a cosine decay to optim.min_lr at the end of the schedule;
- `linear`: a straight line down to optim.min_lr;
- `constant`: the peak until the end;
- `wsd` (warmup-stable-decay, as in MiniCPM and DeepSeek): the peak, then a linear decay to
  optim.min_lr over the last `optim.decay_fraction` of the steps.

One scheduler class for all of them, DeepSpeed's WarmupCosineLR with the ratio after warmup
chosen by the schedule: its warmup, its step counting and its state (`last_batch_iteration`,
what a layout-free checkpoint keeps) are DeepSpeed's, so the cosine is DeepSpeed's own and a
run resumed on any layout, or from a checkpoint of an older zoo, continues exactly.
`lr_ratio` is the same curve as a plain function (tests, the figure in docs/monitoring.md).
"""
from __future__ import annotations

import math

SCHEDULES = ("cosine", "linear", "constant", "wsd")


def lr_ratio(iteration: int, *, schedule: str, warmup: int, total: int, min_ratio: float,
             decay_fraction: float = 0.1) -> float:
    """The learning rate over the peak after `iteration` scheduler steps (0: the first
    optimizer step), as DeepSpeed's WarmupCosineLR counts: linear warmup over max(2, warmup)
    steps from 0, then the schedule's curve, reaching min_ratio at `total`."""
    warmup = max(2, warmup)
    if iteration < 0:
        return 0.0
    if iteration < warmup:
        return iteration / warmup
    if schedule == "constant":
        return 1.0
    if schedule == "wsd":
        decay_start = max(warmup, total - max(1, round(decay_fraction * total)))
        if iteration < decay_start:
            return 1.0
        progress = min(1.0, (iteration - decay_start + 1) / max(1, total - decay_start))
        return 1.0 - (1.0 - min_ratio) * progress
    progress = min(1.0, (iteration - warmup + 1) / max(1, total - warmup))
    if schedule == "linear":
        return 1.0 - (1.0 - min_ratio) * progress
    return max(0.0, min_ratio + (1.0 - min_ratio) * (1 + math.cos(math.pi * progress)) / 2)


def make_scheduler(schedule: str, *, warmup: int, total: int, min_ratio: float, decay_fraction: float):
    """A callable DeepSpeed's initialize takes as lr_scheduler: optimizer -> the scheduler."""
    from deepspeed.runtime.lr_schedules import WarmupCosineLR

    class ScheduleLR(WarmupCosineLR):
        def get_lr_ratio(self):
            if schedule == "cosine":
                return super().get_lr_ratio()  # DeepSpeed's own, as every earlier zoo run used
            return lr_ratio(self.last_batch_iteration, schedule=schedule, warmup=warmup, total=total,
                            min_ratio=min_ratio, decay_fraction=decay_fraction)

    def build(optimizer):
        return ScheduleLR(optimizer, total_num_steps=total, warmup_min_ratio=0.0, warmup_num_steps=max(warmup, 1),
                          cos_min_ratio=min_ratio, warmup_type="linear")

    return build
