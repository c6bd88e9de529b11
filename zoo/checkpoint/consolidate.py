"""Layout-free weights: gather a rank's (tensor-parallel, ZeRO-3-partitioned) parameters
into the full single-device state dict, named as in the plain model.

Tests read a small model's full weights with `full_parameters`; tied parameters appear once,
under their first name. No run path gathers a whole model onto one rank: the end-of-run sample
and the accuracies run on the distributed model in place (zoo.parallel.generate,
zoo.families.accuracy), the final weights are streamed tensor by tensor (zoo.checkpoint.final).
"""
from __future__ import annotations

from typing import Dict

import torch
import torch.nn as nn

from zoo.engine.state import gathered
from zoo.parallel.names import plain_name
from zoo.parallel.sharding import gather_full, local_shard
from zoo.run.errors import CheckpointError


@torch.no_grad()
def full_parameters(module: nn.Module, tp_group=None, prefix: str = "") -> Dict[str, torch.Tensor]:
    """Full fp32 CPU copies of every parameter of `module`, plus its persistent buffers as
    they are (collective over the tp group and, with ZeRO-3, the data-parallel group: every
    such rank must call it)."""
    named = list(module.named_parameters(prefix=prefix.rstrip(".")))
    out: Dict[str, torch.Tensor] = {}
    with gathered([p for _, p in named]):
        for name, p in named:
            out[name] = gather_full(p.detach(), getattr(p, "tp_shard", None), tp_group).float().cpu().clone()
    persistent = {n for n, _ in module.named_buffers(prefix=prefix.rstrip("."))}
    for name, b in module.state_dict(prefix=prefix).items():
        if name in persistent and name not in out:  # buffers (e.g. BatchNorm running statistics)
            out[name] = b.detach().cpu().clone()
    return out


@torch.no_grad()
def assign_full_weights(module: nn.Module, state, prefix: str = "", skip=lambda t: False) -> None:
    """Copy full (plain-model) tensors into `module`'s parameters and state buffers, each its
    tensor-parallel shard; names may carry pipeline prefixes (`prefix`: `module`'s path in the
    full model). `state` is a dict of full tensors, or weights read slice by slice
    (zoo.checkpoint.hf_weights.HFWeights: each parameter reads only its shard); `skip(t)`: tensors
    assigned already. Call before the engine is created."""
    prefix = prefix.rstrip(".")
    persistent = {plain_name(f"{prefix}.{n}" if prefix else n) for n in module.state_dict()}
    for name, t in list(module.named_parameters(prefix=prefix)) + list(module.named_buffers(prefix=prefix)):
        if skip(t):
            continue
        key = plain_name(name)
        if key not in state:
            if key in persistent and t.dtype.is_floating_point and "running_" not in key:
                raise CheckpointError(f"the weights have no tensor {key!r} for this model")
            continue
        if isinstance(state, dict):
            t.copy_(local_shard(state[key], t))
        else:
            state.fill(key, t)
