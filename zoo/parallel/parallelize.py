"""The parallelize step: applied to a built single-device model, driven by plans as data.

Tensor parallelism replaces the submodules named in the family's plan (`zoo.parallel.plans`)
with their column-, row- or vocab-parallel twins; with tp == 1 the model is untouched.
"""
from __future__ import annotations

import torch
import torch.nn as nn


def parallelize(model: nn.Module, *, tp_group=None, sequence_parallel: bool = False,
                device: torch.device = torch.device("cpu")) -> nn.Module:
    if tp_group is None or torch.distributed.get_world_size(tp_group) == 1:
        return model
    from zoo.parallel.plans import apply_tp_plan

    return apply_tp_plan(model, tp_group, sequence_parallel=sequence_parallel, device=device)
