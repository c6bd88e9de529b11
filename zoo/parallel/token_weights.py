"""The loss as the mean over the global batch's targets, whatever the micro-batching and the
data-parallel degree: each micro-batch's loss (a mean over its own counted targets) gets the
weight n_i x grad_accum x dp / N, N the targets counted over every micro-batch of the step on
every data-parallel rank (one all-reduce of one number a step). The engines average the
micro-batches' losses over grad_accum and the gradients over dp, so the step's gradient is that
of sum(token losses) / N: the rule evaluation follows (Trainer.evaluate). Where every
micro-batch counts as many targets (packed blocks without masking) each weight is exactly 1.

Used where a task's targets are masked unevenly (data.eod_mask_loss; chat data's prompts):
without it, a micro-batch with few supervised tokens weighed as much as one with many, and the
loss depended on how the global batch was cut."""
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch
import torch.distributed as dist

from zoo.models.losses import IGNORE


def counted(targets) -> torch.Tensor:
    """The targets that count (not IGNORE), float64."""
    return (targets != IGNORE).sum().double()


def token_weights(batches: Sequence[Tuple[object, torch.Tensor]], *, grad_accum: int, dp: int,
                  dp_group=None) -> List[torch.Tensor]:
    """Each micro-batch's weight (float32, 0-dim, on its targets' device), in order."""
    counts = [counted(y) for _, y in batches]
    total = torch.stack(counts).sum() if counts else torch.zeros((), dtype=torch.float64)
    if dp > 1:
        dist.all_reduce(total, group=dp_group)
    scale = grad_accum * dp / total.clamp_min(1.0)
    return [(n * scale).float() for n in counts]


def weighted(batches, weights) -> list:
    """The pipeline engine's micro-batches with each weight riding beside its targets (the last
    stage's loss function, zoo.parallel.cross_entropy.TokenLoss, applies it)."""
    return [(x, (y, w)) for (x, y), w in zip(batches, weights)]
