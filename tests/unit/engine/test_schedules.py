"""optim.schedule against closed-form curves at every step, and the scheduler DeepSpeed
steps agreeing with them (its cosine is DeepSpeed's own WarmupCosineLR, bit for bit)."""
from __future__ import annotations

import math

import pytest
import torch

from zoo.engine.schedules import SCHEDULES, lr_ratio, make_scheduler

WARMUP, TOTAL, MIN = 10, 100, 0.1


def closed_form(schedule: str, i: int, decay_fraction: float = 0.2) -> float:
    if i < 0:  # before the first scheduler step (DeepSpeed's: the first optimizer step runs at 0)
        return 0.0
    if i < WARMUP:
        return i / WARMUP
    p = min(1.0, (i - WARMUP + 1) / (TOTAL - WARMUP))
    if schedule == "cosine":
        return MIN + (1 - MIN) * 0.5 * (1 + math.cos(math.pi * p))
    if schedule == "linear":
        return 1 - (1 - MIN) * p
    if schedule == "constant":
        return 1.0
    start = TOTAL - round(decay_fraction * TOTAL)  # wsd
    return 1.0 if i < start else 1 - (1 - MIN) * min(1.0, (i - start + 1) / (TOTAL - start))


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_each_schedule_is_its_closed_form_at_every_step(schedule):
    for i in range(TOTAL + 20):
        got = lr_ratio(i, schedule=schedule, warmup=WARMUP, total=TOTAL, min_ratio=MIN, decay_fraction=0.2)
        assert got == pytest.approx(closed_form(schedule, i), abs=1e-12), (schedule, i)
    ends = lr_ratio(TOTAL - 1, schedule=schedule, warmup=WARMUP, total=TOTAL, min_ratio=MIN, decay_fraction=0.2)
    assert ends == pytest.approx(1.0 if schedule == "constant" else MIN)


def _stepped(schedule: str, steps: int, start_state=None):
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    sched = make_scheduler(schedule, warmup=WARMUP, total=TOTAL, min_ratio=MIN, decay_fraction=0.2)(opt)
    if start_state:
        sched.load_state_dict(start_state)
        sched.step(sched.last_batch_iteration)  # as zoo's checkpoint load does
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        sched.step()
    return lrs, sched.state_dict()


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_the_scheduler_deepspeed_steps_follows_the_curve_and_resumes_exactly(schedule):
    lrs, _ = _stepped(schedule, TOTAL)
    for i, lr in enumerate(lrs):  # optimizer step i + 1 runs at the ratio of scheduler iteration i - 1
        assert lr == pytest.approx(1e-3 * closed_form(schedule, i - 1), rel=1e-9, abs=1e-15), (schedule, i)
    first, state = _stepped(schedule, 37)
    rest, _ = _stepped(schedule, TOTAL - 37, start_state=state)
    assert first + rest == lrs  # a resumed run continues the schedule exactly


def test_the_cosine_is_deepspeeds_warmup_cosine_bit_for_bit():
    from deepspeed.runtime.lr_schedules import WarmupCosineLR

    ours, _ = _stepped("cosine", TOTAL + 5)
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    ds = WarmupCosineLR(opt, total_num_steps=TOTAL, warmup_min_ratio=0.0, warmup_num_steps=WARMUP,
                        cos_min_ratio=MIN, warmup_type="linear")
    theirs = []
    for _ in range(TOTAL + 5):
        theirs.append(opt.param_groups[0]["lr"])
        ds.step()
    assert ours == theirs
