"""What the checkpoint tests share: every run there uses one 20-step LR schedule
(optim.decay_steps), whatever its max_steps, so all of them must reproduce one uninterrupted
20-step run (the `checkpoint_reference` fixture, tests/e2e/conftest.py) step by step."""
from __future__ import annotations

STEPS = 20
FAST = ["debug=fast", "trainer.sample_tokens=0", "trainer.eval_batches=1", "optim.warmup_steps=2",
        f"optim.decay_steps={STEPS}", "trainer.global_batch_size=8", "trainer.micro_batch_size=2"]


def losses_by_step(run) -> dict:
    return {m["step"]: m["loss"] for m in run.metrics if "loss" in m}


def after(losses: dict, step: int) -> dict:
    return {s: l for s, l in losses.items() if s > step}
