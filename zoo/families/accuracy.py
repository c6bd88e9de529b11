"""Top-1 accuracy counted inside the held-out evaluation, on the distributed model in place:
the loss function of the evaluation's forward (the model's own, or the last pipeline stage's)
also counts the predictions that hit their target, vocab-parallel under tensor parallelism.
No rank builds the plain model or gathers the weights for it (BERT's masked tokens, the CNN's
images)."""
from __future__ import annotations

import contextlib
from typing import Dict, Iterator

import torch
import torch.distributed as dist

from zoo.models.losses import IGNORE
from zoo.parallel.cross_entropy import vocab_parallel_argmax


class TopOneTally:
    """Predictions equal to their target, and the targets counted (those other than -100)."""

    def __init__(self, tp_group=None):
        self.tp_group = tp_group
        self.correct = self.counted = 0

    def observe(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        predicted = vocab_parallel_argmax(logits.detach(), self.tp_group)
        kept = targets != IGNORE
        self.correct += int(((predicted == targets) & kept).sum())
        self.counted += int(kept.sum())

    def totals(self, copies: int, device: torch.device) -> Dict[str, int]:
        """Summed over every rank of the job (collective): each replica's batches are counted by
        its `copies` tensor-parallel ranks (the last stage's, under a pipeline), divided out."""
        both = torch.tensor([self.correct, self.counted], dtype=torch.int64, device=device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(both)
        correct, counted = (int(v) // copies for v in both.tolist())
        return {"correct": correct, "counted": counted}


@contextlib.contextmanager
def tallied(owner, attr: str, tally: TopOneTally) -> Iterator[None]:
    """`owner.attr`, a loss function (logits, targets) -> loss, shows each call to `tally` first."""
    loss = getattr(owner, attr)

    def observed(logits, targets):
        tally.observe(logits, targets)
        return loss(logits, targets)

    setattr(owner, attr, observed)
    try:
        yield
    finally:
        setattr(owner, attr, loss)
