"""ZeRO stages 1, 2 and 3 over 2 gloo ranks against a single-process fp32 reference:
per-step loss and the final parameters within rtol 1e-5 over 5 steps."""
from __future__ import annotations

import pytest
import torch

from zoo.checkpoint.final import load_run_weights

STEPS = ["trainer.max_steps=5", "trainer.global_batch_size=8", "trainer.micro_batch_size=2", "trainer.log_every=1",
         "trainer.eval_batches=1", "trainer.sample_tokens=0", "optim.warmup_steps=2"]


@pytest.fixture(scope="module")
def reference(run_zoo):
    return run_zoo("parallel=ddp", *STEPS)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stage_matches_single_process(run_zoo, reference, stage):
    run = run_zoo(f"parallel=zero{stage}", *STEPS)
    assert run.summary["dp"] == 2 and run.summary["zero_stage"] == stage
    torch.testing.assert_close(torch.tensor(run.losses()), torch.tensor(reference.losses()), rtol=1e-5, atol=0)
    ref_w, w = load_run_weights(reference.run_dir), load_run_weights(run.run_dir)
    assert ref_w.keys() == w.keys()
    for name in ref_w:
        torch.testing.assert_close(w[name], ref_w[name], rtol=1e-5, atol=1e-6, msg=name)
