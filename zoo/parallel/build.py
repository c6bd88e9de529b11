"""Building one rank's model: the single-device module (or, under pipeline parallelism,
only this stage's layers of it) is built on the meta device, the parallelize step swaps in
this rank's tensor-parallel shards (and data-parallel BatchNorms), then every parameter is
materialised on the device and filled by the layout-free initialisation. A sharded rank
never holds the full model. What differs between families (the model class, the init, the
TP rules, the pipeline's loss) comes from the family's spec, which the caller passes (the
task has it; `zoo.families.family_of_shape` finds it for a shape): this module never looks a
family up, so the families can build with it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn

from zoo.models.init import init_parameters
from zoo.models.meta import on_meta, to_empty
from zoo.parallel.parallelize import parallelize
from zoo.parallel.topology import Layout
from zoo.parallel.tp_rules import sum_replicated_grads, tie_parameters

META = torch.device("meta")


def count_parameters(spec, shape) -> int:
    """Parameters of the full (unsharded) model of family `spec`, counted on the meta device."""
    with on_meta():
        model = spec.model(shape)
    return sum(p.numel() for p in model.parameters())


def _parallelize_on_meta(module: nn.Module, rules, **groups) -> None:
    """The parallelize step with the tensor-parallel shards left on meta and their nn.init fills
    skipped: the caller allocates and fills each once. Built on the device, they were the whole
    tp shard of the model allocated before a ZeRO-3 build partitioned its first piece (70B at
    tp8 x dp16: 34.5 GB a GPU before 1.1 GB), and allocated twice by a plain build."""
    with on_meta():
        parallelize(module, rules=rules, device=META, **groups)


def materialise(module: nn.Module, spec, shape, *, seed: int, device: torch.device, tp_group=None,
                dp_group=None, sequence_parallel: bool = False, init: bool = True) -> None:
    """Parallelize a meta-device module of family `spec` in place, allocate it on `device` and
    initialise it. Its parameter names must be the full model's (e.g. `h.3.attn.c_attn.weight`).
    `init=False`: the parameters are left as allocated, for a resume that fills every one of
    them from its checkpoint (or fails naming the one it lacks)."""
    std_of = spec.init_std(shape, module)
    rules = spec.tp_rules_for(shape)
    _parallelize_on_meta(module, rules, tp_group=tp_group, dp_group=dp_group, sequence_parallel=sequence_parallel)
    to_empty(module, device)
    if rules is not None:
        tie_parameters(module, rules)  # materialising untied them
    if init:
        init_parameters(module, seed, std_of)
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()  # buffers: to_empty left them uninitialised
    if rules is not None:
        sum_replicated_grads(module, tp_group, rules, sequence_parallel=sequence_parallel)


@dataclass(frozen=True)
class ZeroThree:
    """How a ZeRO-3 rank builds its model partitioned (materialise_partitioned)."""

    config: dict
    """The DeepSpeed config the engine will get (deepspeed.zero.Init reads its ZeRO section)."""
    group: object
    """The data-parallel group the parameters are partitioned over."""
    dtype: torch.dtype
    """The parameters' dtype in the engine (fp32, bf16 or fp16)."""
    mpu: object = None
    """The layout's grid: deepspeed.zero.Init checks the config's batch against its data-parallel
    size (without it, against the whole world: tp > 1 failed DeepSpeed's batch assertion)."""


def _units(module: nn.Module, prefix: str = ""):
    """(path, module) of the pieces a partitioned build takes one at a time: each child, and
    each member of a ModuleList or Sequential (a transformer's blocks) on its own, also inside
    a wrapper without parameters of its own (Llama's `model`, as transformers names it: taken
    whole, it was the entire body at once)."""
    for name, child in module.named_children():
        path = f"{prefix}{name}"
        if isinstance(child, (nn.ModuleList, nn.Sequential)) or _wraps_blocks(child):
            yield from _units(child, path + ".")
        else:
            yield path, child


def _wraps_blocks(module: nn.Module) -> bool:
    """A module that only holds others (no parameter of its own), a list of blocks among them."""
    return (not any(True for _ in module.parameters(recurse=False))
            and any(isinstance(m, (nn.ModuleList, nn.Sequential)) for m in module.modules()))


def materialise_partitioned(module: nn.Module, spec, shape, *, zero3: ZeroThree, seed: int, device: torch.device,
                            tp_group=None, dp_group=None, sequence_parallel: bool = False, weights=None,
                            init: bool = True) -> None:
    """`materialise` for ZeRO-3, piece by piece: each piece (a block, an embedding) is
    allocated, initialised (the same layout-free values) and partitioned over the data-parallel
    group (deepspeed.zero.Init) before the next is allocated, so no rank holds more than its
    partition and one piece. With `weights` (model.init_from, read slice by slice: HFWeights),
    each rank reads only its own partition's range of each parameter from the files, after the
    partitioning (1/dp of the piece; the piece's buffers whole)."""
    import deepspeed

    from zoo.engine.state import is_zero3
    from zoo.parallel.names import plain_name

    std_of = spec.init_std(shape, module)
    rules = spec.tp_rules_for(shape)
    _parallelize_on_meta(module, rules, tp_group=tp_group, dp_group=dp_group, sequence_parallel=sequence_parallel)
    for path, unit in _units(module):
        if rules is not None:
            tie_parameters(module, rules)  # a head takes its embedding's (partitioned) weight before it is built
        done = {id(p) for p in unit.parameters() if is_zero3(p)}
        tied = {name: p for name, p in unit.named_parameters(remove_duplicate=False) if id(p) in done}
        to_empty(unit, device)
        for name, p in tied.items():  # to_empty made new tensors of them: the partitioned ones again
            owner, _, attr = name.rpartition(".")
            setattr(unit.get_submodule(owner) if owner else unit, attr, p)
        if init:
            init_parameters(unit, seed, std_of, prefix=path + ".", skip=is_zero3)
        for m in unit.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.reset_running_stats()
        fresh = [(name, p) for name, p in unit.named_parameters(prefix=path) if not is_zero3(p)]
        if weights is not None:  # the buffers now; the parameters once partitioned
            from zoo.checkpoint.consolidate import assign_full_weights

            assign_full_weights(unit, weights, prefix=path, skip=lambda t: isinstance(t, nn.Parameter))
        for _, p in fresh:
            if p.dtype != zero3.dtype:
                p.data = p.data.to(zero3.dtype)
        if fresh:
            deepspeed.zero.Init(module=unit, config_dict_or_path=zero3.config, data_parallel_group=zero3.group,
                                dtype=zero3.dtype, mpu=zero3.mpu)
        if weights is not None:
            for name, p in fresh:
                _fill_partition(p, weights, plain_name(name))
    if rules is not None:
        sum_replicated_grads(module, tp_group, rules, sequence_parallel=sequence_parallel)


@torch.no_grad()
def _fill_partition(p: nn.Parameter, weights, name: str) -> None:
    """This rank's ZeRO-3 partition of `p` from `weights` (HFWeights.fill_flat): only its range."""
    from zoo.engine.state import full_shape, model_held

    if name not in weights:  # every rank raises, also one whose range is empty
        from zoo.run.errors import CheckpointError

        raise CheckpointError(f"the weights have no tensor {name!r} for this model")
    start, held = model_held(p)
    part = held if held.dtype == torch.float32 else torch.empty(held.numel(), dtype=torch.float32)
    weights.fill_flat(name, getattr(p, "tp_shard", None), tuple(full_shape(p)), start, part)
    if part is not held:
        held.copy_(part)


def build_model(spec, shape, *, seed: int, device: torch.device, tp_group=None, dp_group=None,
                sequence_parallel: bool = False, activation_checkpointing: bool = False,
                zero3: ZeroThree | None = None, weights=None, document_end: Optional[int] = None,
                context=None, init: bool = True) -> nn.Module:
    """This rank's whole model (no pipeline) of family `spec`; with `zero3`, built partitioned
    (materialise_partitioned), filled from `weights` (model.init_from); with `document_end` (a
    causal LM's end-of-text id) attending within documents only (zoo.models.documents); with
    `context` (zoo.parallel.context.ContextShard) running this rank's share of every sequence;
    `init=False`: not initialised (a resume fills it)."""
    with on_meta():
        model = spec.model(shape)
    if document_end is not None:
        model.document_end = document_end
    if context is not None:  # the model and its attention layers
        _hand_context(model.modules(), context)
    if zero3 is None:
        materialise(model, spec, shape, seed=seed, device=device, tp_group=tp_group, dp_group=dp_group,
                    sequence_parallel=sequence_parallel, init=init)
        if weights is not None:
            from zoo.checkpoint.consolidate import assign_full_weights

            assign_full_weights(model, weights)
    else:
        materialise_partitioned(model, spec, shape, zero3=zero3, seed=seed, device=device, tp_group=tp_group,
                                dp_group=dp_group, sequence_parallel=sequence_parallel, weights=weights, init=init)
    model.activation_checkpointing = activation_checkpointing
    return model


def _hand_context(modules, context) -> None:
    """The shard to every module that reads it (zoo.models.documents.ReadsContext)."""
    from zoo.models.documents import ReadsContext

    for m in modules:
        if isinstance(m, ReadsContext):
            m.context = context


def build_pipeline(spec, shape, layout: Layout, *, seed: int, device: torch.device, tp_group=None, dp_group=None,
                   sequence_parallel: bool = False, partition_method: str, activation_checkpointing: bool,
                   dynamic_shape: bool = False, document_end: Optional[int] = None, context=None, init: bool = True):
    """This stage's DeepSpeed PipelineModule: only its layers, cut from the model built on meta
    (with `document_end`, layers that carry each token's document position between them; with
    `context`, layers and a last stage's loss that run this rank's share of every sequence; the
    module's `context` is the shard, for zoo.models.documents.whole_sequences)."""
    from zoo.parallel.pipeline import pipeline_module

    with on_meta():
        meta_model = spec.model(shape)
    if document_end is not None:
        meta_model.document_end = document_end
    loss = spec.pipeline_loss(tp_group)
    if context is not None:
        _hand_context([meta_model], context)  # its layer list's first layer takes the share
        loss.context = context
    build = functools.partial(materialise, spec=spec, shape=shape, seed=seed, device=device, tp_group=tp_group,
                              dp_group=dp_group, sequence_parallel=sequence_parallel, init=init)
    module = pipeline_module(meta_model, layout, build, loss_fn=loss, partition_method=partition_method,
                             activation_checkpointing=activation_checkpointing, dynamic_shape=dynamic_shape)
    if context is not None:
        _hand_context(module.modules(), context)  # the stage's attention layers
        module.context = context
    return module


def build(spec, shape, layout: Layout, **kwargs) -> nn.Module:
    """This rank's model for `layout`: a pipeline stage with pp > 1, else the whole model."""
    if layout.pp > 1:
        weights = kwargs.pop("weights", None)
        kwargs.pop("zero3", None)  # DeepSpeed's pipeline takes ZeRO-1 at most
        model = build_pipeline(spec, shape, layout, **kwargs)
        if weights is not None:
            from zoo.checkpoint.consolidate import assign_full_weights

            assign_full_weights(model, weights)
        return model
    for key in ("partition_method", "dynamic_shape"):
        kwargs.pop(key, None)
    return build_model(spec, shape, **kwargs)

