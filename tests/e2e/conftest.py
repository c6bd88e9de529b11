"""Fixtures the end-to-end tests share: reference runs computed once per session."""
from __future__ import annotations

import pytest

from tests.e2e.checkpoint_runs import FAST, STEPS, losses_by_step


@pytest.fixture(scope="session")
def checkpoint_reference(run_zoo) -> dict:
    """The uninterrupted 20-step run every checkpoint test must reproduce: losses by step. It
    evaluates every 5 steps and the runs it is compared with do not: evaluation changes no loss."""
    return losses_by_step(run_zoo(*FAST, f"trainer.max_steps={STEPS}", "trainer.eval_every=5"))


HF_FAST = ["debug=fast", "trainer.sample_tokens=0", "trainer.eval_batches=2", "trainer.global_batch_size=8",
           "trainer.micro_batch_size=2", "optim.warmup_steps=2"]


@pytest.fixture(scope="session")
def trained_3d(run_zoo, tmp_path_factory):
    """A 3-step GPT run under tp2 x pp2 (4 ranks), checkpointed at the end: the export tests'
    source and the console test's sample of a multi-rank run's output."""
    run_dir = tmp_path_factory.mktemp("hf") / "run3d"
    return run_zoo(*HF_FAST, "parallel=3d", "parallel.num_microbatches=2", "parallel.dp=1", "trainer.max_steps=3",
                   "checkpoint.every=3", run_dir=run_dir)
