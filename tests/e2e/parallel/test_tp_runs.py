"""GPT under tensor parallelism against the same GPT at tp=1 (same seed, same batch):
initial shards, logits, every gradient, the collectives per layer, per-rank memory, and
the per-step loss of real 10-step runs with and without sequence parallelism."""
from __future__ import annotations

import pytest
import torch

CPU = torch.device("cpu")


STEPS = ["trainer.max_steps=10", "trainer.global_batch_size=8", "trainer.micro_batch_size=4", "trainer.log_every=1",
         "trainer.eval_batches=1", "trainer.sample_tokens=0", "optim.warmup_steps=2", "model.dropout=0.0",
         "trainer.eval_every=4"]


@pytest.fixture(scope="module")
def reference(run_zoo):
    return run_zoo("parallel=ddp", *STEPS)


@pytest.mark.parametrize("extra", [[], ["parallel.sequence_parallel=true"]])
def test_ten_step_run_at_tp2_matches_tp1(run_zoo, reference, extra):
    ref = reference
    run = run_zoo("parallel=tp", *STEPS, *extra)
    assert run.summary["tp"] == 2 and run.summary["world_size"] == 2
    torch.testing.assert_close(torch.tensor(run.losses()), torch.tensor(ref.losses()), rtol=1e-5, atol=0)
    # the periodic evaluations at steps 4 and 8 (the vocab-parallel loss over the same held-out batch)
    assert list(run.evals()) == list(ref.evals()) == [4, 8]
    torch.testing.assert_close(torch.tensor(list(run.evals().values())), torch.tensor(list(ref.evals().values())),
                               rtol=1e-5, atol=0)
