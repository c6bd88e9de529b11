"""Building one rank's model: the single-device module (or, under pipeline parallelism,
only this stage's layers of it) is built on the meta device, the parallelize step swaps in
this rank's tensor-parallel shards (and data-parallel BatchNorms), then every parameter is
materialised on the device and filled by the layout-free initialisation. A sharded rank
never holds the full model. What differs between families (the model class, the init, the
TP plan, the pipeline's loss) comes from the family's spec (`zoo.families`).
"""
from __future__ import annotations

import functools

import torch
import torch.nn as nn

from zoo.models.init import init_parameters
from zoo.models.meta import on_meta, to_empty
from zoo.parallel.parallelize import parallelize
from zoo.parallel.plans import sum_sequence_parallel_norm_grads, tie_parameters
from zoo.parallel.topology import Layout


def _family(shape):
    from zoo.families import family_of_shape

    return family_of_shape(shape)


def count_parameters(shape) -> int:
    """Parameters of the full (unsharded) model, counted on the meta device."""
    with on_meta():
        model = _family(shape).model(shape)
    return sum(p.numel() for p in model.parameters())


def materialise(module: nn.Module, shape, *, seed: int, device: torch.device, tp_group=None, dp_group=None,
                sequence_parallel: bool = False) -> None:
    """Parallelize a meta-device module in place, allocate it on `device` and initialise it.
    Its parameter names must be the full model's (e.g. `h.3.attn.c_attn.weight`)."""
    spec = _family(shape)
    std_of = spec.init_std(shape, module)
    plan = spec.plan(shape)
    parallelize(module, plan=plan, tp_group=tp_group, dp_group=dp_group,
                sequence_parallel=sequence_parallel, device=device)
    to_empty(module, device)
    if plan is not None:
        tie_parameters(module, plan)  # materialising untied them
    init_parameters(module, seed, std_of)
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()  # buffers: to_empty left them uninitialised
    if sequence_parallel and tp_group is not None:
        sum_sequence_parallel_norm_grads(module, tp_group, norms=plan.sequence_parallel_norms)


def build_model(shape, *, seed: int, device: torch.device, tp_group=None, dp_group=None,
                sequence_parallel: bool = False, activation_checkpointing: bool = False) -> nn.Module:
    """This rank's whole model (no pipeline), of the family `shape` belongs to."""
    with on_meta():
        model = _family(shape).model(shape)
    materialise(model, shape, seed=seed, device=device, tp_group=tp_group, dp_group=dp_group,
                sequence_parallel=sequence_parallel)
    model.activation_checkpointing = activation_checkpointing
    return model


def build_pipeline(shape, layout: Layout, *, seed: int, device: torch.device, tp_group=None, dp_group=None,
                   sequence_parallel: bool = False, partition_method: str, activation_checkpointing: bool,
                   dynamic_shape: bool = False):
    """This stage's DeepSpeed PipelineModule: only its layers, cut from the model built on meta."""
    from zoo.parallel.pipeline import pipeline_module

    spec = _family(shape)
    with on_meta():
        meta_model = spec.model(shape)
    build = functools.partial(materialise, shape=shape, seed=seed, device=device, tp_group=tp_group,
                              dp_group=dp_group, sequence_parallel=sequence_parallel)
    return pipeline_module(meta_model, layout, build, loss_fn=spec.pipeline_loss(tp_group),
                           partition_method=partition_method, activation_checkpointing=activation_checkpointing,
                           dynamic_shape=dynamic_shape)


def build(shape, layout: Layout, **kwargs) -> nn.Module:
    """This rank's model for `layout`: a pipeline stage with pp > 1, else the whole model."""
    if layout.pp > 1:
        return build_pipeline(shape, layout, **kwargs)
    for key in ("partition_method", "dynamic_shape"):
        kwargs.pop(key, None)
    return build_model(shape, **kwargs)

