"""The parallelize step: applied to a built single-device model, driven by rules as data.

Tensor parallelism replaces the submodules named in the model's rules (`zoo.parallel.tp_rules`)
with their column-, row- or vocab-parallel twins; with tp == 1 the model is untouched.
Data parallelism changes one kind of layer: BatchNorm, whose batch statistics would
otherwise be each replica's own (and its running statistics drift apart, since DeepSpeed
does not synchronise buffers). With dp > 1 every BatchNorm becomes a `SyncBatchNorm` over
the data-parallel group: statistics of the whole global micro-batch, the same running
statistics on every replica, and the gradient of the shared statistics summed back.
torch's own `nn.SyncBatchNorm` refuses CPU tensors (and gloo), so zoo has this one, which
runs on any backend.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from zoo.parallel.mappings import all_reduce


def parallelize(model: nn.Module, *, rules=None, tp_group=None, dp_group=None, sequence_parallel: bool = False,
                device: torch.device = torch.device("cpu")) -> nn.Module:
    """Apply the tensor-parallel `rules` (a `zoo.parallel.tp_rules.TPRules`, None: the model has
    none) over `tp_group` and, with dp > 1, synchronise its BatchNorms over `dp_group`; in
    place (the model may still be on the meta device)."""
    if dp_group is not None and dist.get_world_size(dp_group) > 1:
        sync_batch_norms(model, dp_group)
    if tp_group is None or dist.get_world_size(tp_group) == 1:
        return model
    from zoo.parallel.tp_rules import apply_tp_rules

    if rules is None:
        raise ValueError("this model has no tensor-parallel rules; use parallel.tp=1")
    return apply_tp_rules(model, tp_group, rules=rules, sequence_parallel=sequence_parallel, device=device)


class _SumOverGroup(torch.autograd.Function):
    """All-reduce (sum) forward and backward: every rank's output is the sum over ranks, so
    each rank's input gets the sum of every rank's output gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return all_reduce(x, group)  # a copy; the functional collective inside a model.compile graph

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return all_reduce(grad, ctx.group), None


class SyncBatchNorm(nn.BatchNorm2d):
    """BatchNorm2d whose training statistics are those of the batch across `group`.

    Two all-reduces, each summed in forward and in backward: the count and sum for the mean,
    then the sum of squared deviations for the variance (the two-pass form, no E[x^2] -
    E[x]^2 cancellation). Evaluation uses the running statistics and communicates nothing.
    Computed in float32 whatever the input's dtype.
    """

    def __init__(self, num_features: int, group, *, eps: float = 1e-5, momentum: float = 0.1, device=None):
        super().__init__(num_features, eps=eps, momentum=momentum, device=device)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return F.batch_norm(x.float(), self.running_mean, self.running_var, self.weight.float(), self.bias.float(),
                                False, 0.0, self.eps).to(x.dtype)
        dims = (0, 2, 3)
        xf = x.float()  # statistics in fp32 also under bf16/fp16
        local = torch.cat([xf.sum(dims), xf.new_full((1,), x.numel() / x.shape[1])])  # (C + 1,)
        total = _SumOverGroup.apply(local, self.group)
        n = total[-1]
        mean = total[:-1] / n  # (C,)
        centred = xf - mean[None, :, None, None]
        var = _SumOverGroup.apply(centred.square().sum(dims), self.group) / n  # biased, as BatchNorm normalises
        with torch.no_grad():
            self.num_batches_tracked += 1
            running = self.running_mean.dtype
            self.running_mean.lerp_(mean.to(running), self.momentum)
            self.running_var.lerp_((var * n / (n - 1).clamp_min(1)).to(running), self.momentum)
        y = centred * torch.rsqrt(var + self.eps)[None, :, None, None]
        return (y * self.weight.float()[None, :, None, None] + self.bias.float()[None, :, None, None]).to(x.dtype)


def sync_batch_norms(model: nn.Module, group) -> None:
    """Replace every BatchNorm2d of `model` (on any device, also meta) by a SyncBatchNorm
    holding the same parameters and statistics."""
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.BatchNorm2d) and not isinstance(module, SyncBatchNorm):
            parent, _, child = name.rpartition(".")
            sync = SyncBatchNorm(module.num_features, group, eps=module.eps, momentum=module.momentum,
                                 device=module.weight.device)
            sync.load_state_dict(module.state_dict())
            setattr(model.get_submodule(parent) if parent else model, child, sync)
