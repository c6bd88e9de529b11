"""Evaluation scores the same held-out samples on every layout (#33 item 4): each rank's
micro-batches cover the first `eval_samples()` samples exactly once, the last round padded
with samples whose targets count for nothing, and the loss over them does not depend on how
they were grouped."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from zoo.families.base_task import Task
from zoo.models.losses import IGNORE, masked_mean, summed
from zoo.parallel.topology import Layout


class Numbered(Task):
    """Held-out sample i is (i, targets [i, i+1, ...]); sample 3's first target is ignored."""

    def __init__(self, held: int, eval_batches, global_batch: int):
        cfg = SimpleNamespace(trainer=SimpleNamespace(eval_batches=eval_batches, global_batch_size=global_batch))
        super().__init__(None, cfg, torch.device("cpu"), Layout(tp=1, pp=1, dp=1))
        self.held = held

    def num_eval(self) -> int:
        return self.held

    def collate(self, split, indices):
        idx = torch.as_tensor(np.asarray(indices), dtype=torch.long)
        y = idx[:, None] * 10 + torch.arange(3)
        y[idx == 3, 0] = IGNORE
        return idx.float(), y


@pytest.mark.parametrize("micro, dp", [(1, 1), (2, 1), (4, 1), (2, 2), (3, 2), (4, 4)])
def test_every_layout_scores_the_first_samples_once(micro, dp):
    task = Numbered(held=43, eval_batches=None, global_batch=8)
    assert task.eval_samples() == 43
    per_rank = [task.eval_batches(micro_batch=micro, dp_rank=r, dp_size=dp) for r in range(dp)]
    assert len({len(b) for b in per_rank}) == 1  # every rank runs as many micro-batches (collectives)
    scored = []
    for batches in per_rank:
        for x, y in batches:
            assert x.shape == (micro,)  # full micro-batches: padded, not short
            scored += [int(i) for i, row in zip(x, y) if (row != IGNORE).any()]
    assert sorted(scored) == list(range(43))


def test_eval_batches_counts_global_batches_and_the_split_caps_it():
    assert Numbered(held=43, eval_batches=2, global_batch=8).eval_samples() == 16
    assert Numbered(held=10, eval_batches=2, global_batch=8).eval_samples() == 10
    assert Numbered(held=43, eval_batches=0, global_batch=8).eval_samples() == 0


def test_the_mean_over_targets_does_not_depend_on_the_grouping():
    """Per-target losses; batch means weighted back by their targets give the global mean for
    any grouping, a padded (all-ignored) batch adding nothing, not even its NaN."""
    torch.manual_seed(0)
    per_target = torch.rand(43, 3)
    targets = torch.ones(43, 3, dtype=torch.long)
    targets[3, 0] = IGNORE
    want = per_target[targets != IGNORE].mean()
    for micro in (1, 2, 4, 5):
        total = counted = 0
        for start in range(0, 43, micro):
            rows = slice(start, start + micro)
            total = total + summed(masked_mean(per_target[rows], targets[rows]), targets[rows])
            counted += int((targets[rows] != IGNORE).sum())
        torch.testing.assert_close(total / counted, want, rtol=1e-6, atol=0)
    nan_of_nothing = summed(torch.tensor(float("nan")), torch.full((2, 3), IGNORE))
    assert nan_of_nothing.item() == 0.0
