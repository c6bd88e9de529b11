"""Token losses shared by the language models: per-token cross-entropy of full-vocabulary
logits, and the mean over the positions that have a target."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def cross_entropy_per_token(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token loss of full-vocabulary logits, in float32 whatever their dtype (as the
    vocab-parallel loss computes it: a bf16 softmax and mean would round the loss to 8
    significant bits, 8.3229 for 8.3336); -100 targets give 0."""
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten(), reduction="none",
                           ignore_index=-100).view_as(targets)


def masked_mean(per_token: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean loss over the positions whose target is not -100."""
    mask = (targets != -100).to(per_token.dtype)
    return (per_token * mask).sum() / mask.sum().clamp_min(1.0)


IGNORE = -100
"""The target that counts for no loss (a token BERT does not predict, a padded sample)."""


def summed(mean_loss: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """A batch's mean loss (over its targets other than -100) back to their sum, float32; 0 for
    a batch with none (a padded one, whose mean may be NaN): evaluation adds these sums and
    divides by the targets counted, the same whatever batches the samples were grouped in."""
    n = (targets != IGNORE).sum()
    return torch.where(n > 0, mean_loss.float() * n, torch.zeros((), dtype=torch.float32, device=mean_loss.device))
