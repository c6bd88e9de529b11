"""Cross-entropy over vocab-parallel logits, without ever gathering the full vocabulary.

Rank r holds the logits of ids [r*V/tp, (r+1)*V/tp). The loss log(sum_j exp(z_j)) - z_target
needs three scalars per token from the whole vocabulary, each one all-reduce over the group:
the max logit (for stability), the target's logit (held by exactly one rank) and the sum of
exponentials. The backward is local: softmax - onehot on this rank's shard. Tokens whose
target is `ignore_index` get loss 0 and zero gradient. The maths runs in float32.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch

from zoo.models.losses import cross_entropy_per_token, masked_mean
from zoo.parallel.mappings import all_reduce, group_rank


class _VocabParallelCrossEntropy(torch.autograd.Function):

    @staticmethod
    def forward(ctx, logits, target, group, ignore_index):
        ctx.input_dtype = logits.dtype
        logits = logits.float()  # (..., V/tp)
        vocab_per_rank = logits.shape[-1]
        vocab_start = group_rank(group) * vocab_per_rank

        # 1. The max logit over the full vocabulary, subtracted for numerical stability.
        logits_max = all_reduce(logits.max(dim=-1).values, group, "max")  # (...)
        logits = logits - logits_max.unsqueeze(-1)

        # 2. The target's logit: the rank owning the target id contributes it, the others 0.
        foreign = (target < vocab_start) | (target >= vocab_start + vocab_per_rank)
        local_target = (target - vocab_start).masked_fill(foreign, 0)
        predicted = logits.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(foreign, 0.0)
        predicted = all_reduce(predicted, group)

        # 3. The sum of exponentials over the full vocabulary.
        exp_logits = logits.exp()
        sum_exp = all_reduce(exp_logits.sum(dim=-1), group)

        ignored = target == ignore_index
        loss = (sum_exp.log() - predicted).masked_fill(ignored, 0.0)
        softmax = exp_logits.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, local_target, foreign, ignored)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, local_target, foreign, ignored = ctx.saved_tensors
        # d loss / d z = softmax - onehot(target), the onehot only on the rank owning the target.
        scale = grad_loss.float().masked_fill(ignored, 0.0).unsqueeze(-1)  # (..., 1)
        grad = softmax * scale
        grad.scatter_add_(-1, local_target.unsqueeze(-1), -scale.masked_fill(foreign.unsqueeze(-1), 0.0))
        return grad.to(ctx.input_dtype), None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, tp_group,
                                 ignore_index: int = -100) -> torch.Tensor:
    """Per-token loss (shape of `target`, float32) of this rank's vocab shard `logits` (..., V/tp).

    With a group of size 1 it equals F.cross_entropy(..., reduction="none").
    """
    if logits.shape[:-1] != target.shape:
        raise ValueError(f"vocab_parallel_cross_entropy: logits {tuple(logits.shape)} must be "
                         f"target {tuple(target.shape)} plus a vocab dimension")
    return _VocabParallelCrossEntropy.apply(logits, target, tp_group, ignore_index)


@torch.no_grad()
def vocab_parallel_argmax(logits: torch.Tensor, tp_group) -> torch.Tensor:
    """The full vocabulary's argmax (shape of `logits` without its last dimension) of this
    rank's shard (..., V/tp), the lowest id among equal maxima as torch.argmax gives it: two
    all-reduces of one value per token, no vocabulary gathered."""
    if tp_group is None:
        return logits.argmax(-1)
    local_max, local_arg = logits.float().max(dim=-1)
    best = all_reduce(local_max, tp_group, "max")
    start = group_rank(tp_group) * logits.shape[-1]
    candidate = torch.where(local_max == best, local_arg + start, torch.iinfo(torch.int64).max)
    return -all_reduce(-candidate, tp_group, "max")  # the lowest candidate


class TokenLoss:
    """Mean per-token loss of (possibly vocab-sharded) logits; -100 targets are ignored. The
    targets may come as (targets, weight): the mean times the micro-batch's weight
    (zoo.parallel.token_weights). With `context` (a pipeline's last stage under context
    parallelism, zoo.parallel.context.ContextShard) the logits are this rank's share of the
    block and the targets the whole block's: the block's mean, the same on every cp rank."""

    def __init__(self, tp_group=None, context=None):
        self.per_token: Callable = (functools.partial(vocab_parallel_cross_entropy, tp_group=tp_group)
                                    if tp_group is not None else cross_entropy_per_token)
        self.context = context

    def __call__(self, logits: torch.Tensor, targets) -> torch.Tensor:
        weight = None
        if isinstance(targets, (tuple, list)):
            targets, weight = targets
        shard = self.context if self.context is not None and self.context.enabled else None
        if shard is not None:
            loss = shard.mean_loss(self.per_token(logits, shard.take(targets)), targets)
        else:
            loss = masked_mean(self.per_token(logits, targets), targets)
        return loss if weight is None else loss * weight
