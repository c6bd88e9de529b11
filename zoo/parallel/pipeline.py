"""Pipeline parallelism: a DeepSpeed `PipelineModule` cut from any model's list of layers.

A model lists its forward as layers (`pipeline_layers()`, `zoo.models.stages`): the
submodules each uses, by path in the full model, and what it computes. Here each layer
becomes a `StageLayer` that holds copies of those submodules, taken from the model built
on the meta device, under their full-model paths (so TP rule patterns, init seeds and
checkpoint names are the plain model's), and runs the model's own code for that layer.
Only the stage that owns a layer materialises it. Layers with a `tie` key become DeepSpeed
tied layers across the first and last stage. Stages are partitioned by parameter counts
read off the meta model: DeepSpeed's own count would build (allocate and initialise)
every layer on every rank.

A tied layer's tied weight is the only parameter DeepSpeed keeps in step between the stages;
each end holds its own other parameters (the first stage the position tables, the last the
output head's bias), which exist on that stage only.
"""
from __future__ import annotations

import copy
import functools
from typing import Callable, List

import torch
import torch.nn as nn
from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec

from zoo.engine.pipe_hooks import LayerListPipelineModule
from zoo.parallel.topology import Layout, build_topology


def _hold(root: nn.Module, path: str, module: nn.Module) -> None:
    """Put `module` at dotted `path` under `root`, creating empty containers on the way."""
    *parents, leaf = path.split(".")
    for name in parents:
        if not hasattr(root, name):
            root.add_module(name, nn.Module())
        root = getattr(root, name)
    root.add_module(leaf, module)


class StageLayer(nn.Module):
    """Layer `index` of `meta_model.pipeline_layers()`: its submodules (copied from the meta
    model, tied pairs kept tied), materialised by `materialise(self)`, run by the model's code."""

    def __init__(self, meta_model: nn.Module, index: int, materialise: Callable[[nn.Module], None]):
        super().__init__()
        self.layer = meta_model.pipeline_layers()[index]
        parts = copy.deepcopy([meta_model.get_submodule(p) for p in self.layer.paths])
        for path, part in zip(self.layer.paths, parts):
            _hold(self, path, part)
        materialise(self)

    def forward(self, x):
        return self.layer(self, x)


class PipelineLoss:
    """The last stage's loss: the family's mean loss while training; while `summing` (the
    trainer's evaluation) each micro-batch's sum over its targets (zoo.models.losses.summed),
    which the trainer turns into the mean over every held-out target however the samples were
    grouped (DeepSpeed's eval_batch only averages the outputs)."""

    def __init__(self, loss: Callable):
        self.loss, self.summing = loss, False

    def __call__(self, logits, targets):
        from zoo.models.losses import summed

        loss = self.loss(logits, targets)
        return summed(loss, targets) if self.summing else loss


def pipeline_module(meta_model: nn.Module, layout: Layout, materialise: Callable[[nn.Module], None], *, loss_fn,
                    partition_method: str, activation_checkpointing: bool,
                    dynamic_shape: bool = False) -> PipelineModule:
    """This stage's PipelineModule of `meta_model` (built on the meta device; never materialised)."""
    specs: List[LayerSpec] = []
    for index, layer in enumerate(meta_model.pipeline_layers()):
        if layer.tie is not None:
            specs.append(TiedLayerSpec(layer.tie, StageLayer, meta_model, index, materialise,
                                       tied_weight_attr=[layer.tied_weight]))
        else:
            specs.append(LayerSpec(StageLayer, meta_model, index, materialise))
    grid_class = None
    if layout.cp > 1:  # the grid that also answers DeepSpeed's sequence-parallel questions
        from zoo.parallel.context_grid import ContextGrid

        grid_class = ContextGrid
    return LayerListPipelineModule(
        grid_class=grid_class,
        layers=specs, topology=build_topology(layout), loss_fn=PipelineLoss(loss_fn), partition_method=partition_method,
        activation_checkpoint_interval=1 if activation_checkpointing else 0,
        activation_checkpoint_func=functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False),
        dynamic_shape=dynamic_shape)
