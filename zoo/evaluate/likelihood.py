"""Per-row log-likelihoods counted inside a forward on the distributed model in place: the
loss function of the forward (the model's own, or the last pipeline stage's) also records,
for each row of the micro-batch, the summed log-probability of its targets (those other than
-100), their count, and whether every one is the model's greedy choice. Vocab-parallel under
tensor parallelism: nothing of the vocabulary is gathered. The in-loop task scores
(zoo.evaluate.in_loop) are made of these."""
from __future__ import annotations

from typing import List

import torch

from zoo.models.losses import IGNORE, cross_entropy_per_token
from zoo.parallel.cross_entropy import vocab_parallel_argmax, vocab_parallel_cross_entropy

FIELDS = ("loglikelihood", "tokens", "greedy")
CHUNKS = 4


class LikelihoodTally:
    """`rows`: one (B, 3) float64 tensor per observed micro-batch, in the order observed."""

    def __init__(self, tp_group=None):
        self.tp_group = tp_group
        self.rows: List[torch.Tensor] = []

    @torch.no_grad()
    def observe(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        """A few rows at a time (CHUNKS a micro-batch): the softmax's temporaries beside the
        loss function's own are a fraction of the logits, not another copy."""
        logits, rows = logits.detach(), []
        step = max(1, -(-len(logits) // CHUNKS))
        for at in range(0, len(logits), step):
            part, target = logits[at:at + step], targets[at:at + step]
            per_token = (cross_entropy_per_token(part, target) if self.tp_group is None
                         else vocab_parallel_cross_entropy(part, target, self.tp_group))
            kept = target != IGNORE
            hits = (vocab_parallel_argmax(part, self.tp_group) == target) | ~kept
            rows.append(torch.stack([-(per_token.double() * kept).sum(-1), kept.sum(-1).double(),
                                     hits.all(-1).double()], -1))
        self.rows.append(torch.cat(rows).cpu())
