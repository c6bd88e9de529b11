"""GPT under tensor parallelism against the same GPT at tp=1 (same seed, same batch):
initial shards, logits, every gradient, the collectives per layer, per-rank memory, and
the per-step loss of real 10-step runs with and without sequence parallelism."""
from __future__ import annotations

import pytest
import torch

CPU = torch.device("cpu")


STEPS = ["trainer.max_steps=10", "trainer.global_batch_size=8", "trainer.micro_batch_size=4", "trainer.log_every=1",
         "trainer.sample_tokens=0", "optim.warmup_steps=2", "model.dropout=0.0",
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
    # the evaluations at steps 4, 8 and 10 (the vocab-parallel loss over all 43 held-out blocks)
    assert list(run.evals()) == list(ref.evals()) == [4, 8, 10]
    torch.testing.assert_close(torch.tensor(list(run.evals().values())), torch.tensor(list(ref.evals().values())),
                               rtol=1e-5, atol=0)


def test_two_data_parallel_ranks_evaluate_what_one_does(run_zoo, reference):
    """dp=2 scores the 43 held-out blocks in rounds of 2 x 4 (the last one padded), one
    process in rounds of 4: the same samples, the same loss (#33 item 4: 112 against 120 of
    them before, 4.7949 against 4.8532)."""
    run = run_zoo("parallel=ddp", "parallel.dp=2", *STEPS)
    assert run.summary["dp"] == 2 and run.summary["eval_samples"] == reference.summary["eval_samples"] == 43
    torch.testing.assert_close(torch.tensor(run.losses()), torch.tensor(reference.losses()), rtol=1e-5, atol=0)
    assert list(run.evals()) == [4, 8, 10]
    torch.testing.assert_close(torch.tensor(list(run.evals().values())),
                               torch.tensor(list(reference.evals().values())), rtol=1e-5, atol=0)
