"""The CNN family: a ResNet image classifier (`zoo.models.cnn`) on the digits, image
folders or Hugging Face image datasets; data parallelism (with synchronised BatchNorm) and
pipeline stages, no tensor parallelism."""
from __future__ import annotations

from typing import List

from zoo.config.schema import Config
from zoo.families import data_keys
from zoo.families.cnn.task import CNNTask
from zoo.families.spec import FamilySpec
from zoo.models.cnn import (
    CNN_SIZES,
    CNNShape,
    ResNet,
    classification_loss,
    cnn_init_std,
    cnn_shape,
)
from zoo.observe.flops import counted_flops_per_sample
from zoo.parallel.topology import Layout
from zoo.run.errors import ConfigError, require


def check(cfg: Config, layout: Layout, warnings: List[str]) -> tuple[int, str]:
    """The ResNet: its size, what it ignores, and no tensor parallelism. Returns the block count."""
    m = cfg.model
    try:
        shape = cnn_shape(m.size)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    require(not m.init_from, f"model.init_from={m.init_from}: importing from transformers is for the families with a "
                              f"transformers counterpart (model=gpt, model=bert); the CNN has no transformers counterpart: leave model.init_from null")
    require(layout.tp == 1,
             f"parallel.tp={layout.tp} with model.family=cnn: tensor parallelism splits each layer's weights "
             f"across ranks and exchanges activations after every layer; a ResNet's convolutions at these sizes "
             f"(at most a few million weights each) gain nothing from that, and data parallelism is the right tool: "
             f"use parallel=ddp or parallel=zero1/zero2/zero3 (plus parallel=pp to split the depth), with parallel.tp=1")
    for key in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"):
        if getattr(m, key) is not None:
            warnings.append(f"model.{key}={getattr(m, key)} is ignored by model.family=cnn: its shape comes from "
                            f"model.size ({m.size}) and the images")
    require(not m.activation_checkpointing,
             "model.activation_checkpointing=true is not supported for model.family=cnn: recomputing a block in "
             "backward would update its BatchNorm running statistics a second time; set it to false")
    if m.dropout:
        warnings.append(f"model.dropout={m.dropout} is ignored by model.family=cnn (a ResNet has no dropout)")
    return shape.num_blocks, f"residual blocks of model.size={m.size}"


def _init_std(shape: CNNShape, module):
    """The init's std depends on each tensor's shape (fan-out), read off the meta module."""
    shapes = {n: tuple(p.shape) for n, p in module.named_parameters()}
    return lambda name: cnn_init_std(name, shape, shapes[name])


SPEC = FamilySpec(
    name="cnn", model=ResNet, shape_type=CNNShape, shape=None, task=CNNTask, init_std=_init_std, check=check,
    data_sources=("digits", "files", "hub"), reads="images", sizes=tuple(CNN_SIZES), data_keys=data_keys.IMAGES,
    pipeline_loss=lambda _tp_group: classification_loss, flops_per_sample=counted_flops_per_sample,
)
