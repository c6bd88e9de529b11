"""Building one rank's model: the single-device module is built on the meta device, the
parallelize step swaps in this rank's tensor-parallel shards, then every parameter is
materialised on the device and filled by the layout-free initialisation. The full model is
never held in memory by a sharded rank.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from zoo.models.gpt import GPT, GPTShape, gpt_init_std
from zoo.models.init import init_parameters
from zoo.parallel.parallelize import parallelize
from zoo.parallel.plans import sum_sequence_parallel_norm_grads


def count_parameters(shape: GPTShape) -> int:
    """Parameters of the full (unsharded) model, counted on the meta device."""
    with torch.device("meta"):
        model = GPT(shape)
    return sum(p.numel() for p in model.parameters())


def build_gpt(shape: GPTShape, *, seed: int, device: torch.device, tp_group=None,
              sequence_parallel: bool = False, activation_checkpointing: bool = False) -> GPT:
    with torch.device("meta"):
        model = GPT(shape)
    parallelize(model, tp_group=tp_group, sequence_parallel=sequence_parallel, device=device)
    model.to_empty(device=device)
    model.lm_head.weight = model.embed.wte.weight  # materialising may have untied them
    init_parameters(model, seed, lambda name: gpt_init_std(name, shape))
    if sequence_parallel and tp_group is not None:
        sum_sequence_parallel_norm_grads(model, tp_group)
    model.activation_checkpointing = activation_checkpointing
    return model
