"""Pipeline and 3D parallelism against a single process; the rank grid; per-rank memory."""
from __future__ import annotations

import pytest
import torch

from zoo.parallel.topology import Layout, build_topology, describe_grid, group_lists

STEPS = ["trainer.log_every=1", "trainer.sample_tokens=0", "optim.warmup_steps=2"]


def test_rank_grid_for_8_ranks():
    groups = group_lists(build_topology(Layout(tp=2, pp=2, dp=2)))
    assert sorted(map(sorted, groups["TP"])) == [[0, 1], [2, 3], [4, 5], [6, 7]]  # adjacent: inside a node
    assert sorted(map(sorted, groups["PP"])) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert sorted(map(sorted, groups["DP"])) == [[0, 4], [1, 5], [2, 6], [3, 7]]  # outermost: across nodes
    text = describe_grid(Layout(tp=2, pp=2, dp=2), [f"node{r // 4}" for r in range(8)])
    assert "TP group: [0, 1]  hosts node0" in text and "DP group: [0, 4]  hosts node[0-1]" in text


# Evaluated at step 5 and at the last, over all 43 held-out blocks on every layout, in rounds of
# micro x dp blocks (ddp: 2 x 1, pp: 4 x 1, 3d: 2 x 2), the last round padded (#33 item 4).
COMMON = ["trainer.max_steps=10", "trainer.global_batch_size=24", "model.n_layer=8", "trainer.eval_every=5", *STEPS]


def evaluations(run) -> torch.Tensor:
    assert list(run.evals()) == [5, 10] and run.summary["eval_loss"] == run.evals()[10]
    assert run.summary["eval_samples"] == 43
    return torch.tensor([run.evals()[5], run.evals()[10]])


@pytest.fixture(scope="module")
def single_process(run_zoo):
    """The reference both layouts below must reproduce: one process, micro-batches of 2."""
    return run_zoo("parallel=ddp", "trainer.micro_batch_size=2", *COMMON)


def test_pp2_matches_pp1_over_10_steps(run_zoo, single_process):
    run = run_zoo("parallel=pp", *COMMON)
    assert (run.summary["pp"], run.summary["micro_batch_size"], run.summary["grad_accum"]) == (2, 4, 6)
    torch.testing.assert_close(torch.tensor(run.losses()), torch.tensor(single_process.losses()), rtol=1e-5, atol=0)
    torch.testing.assert_close(evaluations(run), evaluations(single_process), rtol=1e-5, atol=0)
    assert "topology.txt" in {p.name for p in run.run_dir.iterdir()}


def test_3d_matches_single_process_and_splits_memory(run_zoo, single_process):
    ref = single_process
    run = run_zoo("parallel=3d", *COMMON)
    s = run.summary
    assert (s["tp"], s["pp"], s["dp"], s["world_size"], s["micro_batch_size"]) == (2, 2, 2, 8, 2)
    torch.testing.assert_close(torch.tensor(run.losses()), torch.tensor(ref.losses()), rtol=1e-4, atol=0)
    torch.testing.assert_close(evaluations(run), evaluations(ref), rtol=1e-4, atol=0)
    # Each rank holds about 1/(tp*pp) of the weights. Tolerance: the tied token embedding
    # lives on the first and the last stage (DeepSpeed's tied layers), so the model-wide sum
    # exceeds the total by that copy / tp, and stages differ by up to one block.
    total, per_rank = s["params"], s["params_per_rank"]
    embedding_copy = 4096 * 128  # the tied token embedding on the last stage
    assert sum(per_rank[:4]) == pytest.approx(total + embedding_copy, rel=0.02)
    for n in per_rank:
        assert 0.6 * total / 4 <= n <= 1.6 * total / 4, per_rank
