"""Pipeline parallelism: a DeepSpeed `PipelineModule` built from a model's list of layers.

The model stays a plain module; its pipeline view is a list of `LayerSpec`s (built only
on the stage that owns them) with the input and output embeddings as DeepSpeed tied
layers across the first and last stage. Stages are partitioned by parameter counts taken
on the meta device (DeepSpeed's own count would build every layer on every rank).

A tied layer holds the tied weight and nothing else: DeepSpeed keeps only the tied
attribute in step between the stages, so any other parameter in it (a position table)
would stay at its initial value on the last stage and overwrite the trained one when the
stages' weights are merged.
"""
from __future__ import annotations

import functools
import re
from typing import Callable, List

import torch
from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec

from zoo.build import BertPiece, CNNPiece, GPTPiece
from zoo.models.bert import BertShape
from zoo.models.cnn import CNNShape, classification_loss
from zoo.models.gpt import GPTShape, cross_entropy_per_token, masked_mean
from zoo.parallel.cross_entropy import vocab_parallel_cross_entropy
from zoo.parallel.topology import Layout, build_topology


class ZooPipelineModule(PipelineModule):
    def _count_layer_params(self):
        return [spec.typename.parameter_count(*spec.module_args, **spec.module_kwargs)
                if isinstance(spec, LayerSpec) else 0 for spec in self._layer_specs]


def _head(piece, x: torch.Tensor) -> torch.Tensor:
    return piece.logits(x)


class TokenLoss:
    """Mean per-token loss of (possibly vocab-sharded) logits; -100 targets are ignored."""

    def __init__(self, tp_group=None):
        self.per_token: Callable = (functools.partial(vocab_parallel_cross_entropy, tp_group=tp_group)
                                    if tp_group is not None else cross_entropy_per_token)

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return masked_mean(self.per_token(logits, targets), targets)


def _pipeline_module(specs: List, layout: Layout, loss_fn, *, partition_method: str,
                     activation_checkpointing: bool, dynamic_shape: bool = False) -> PipelineModule:
    return ZooPipelineModule(
        layers=specs, topology=build_topology(layout), loss_fn=loss_fn, partition_method=partition_method,
        activation_checkpoint_interval=1 if activation_checkpointing else 0,
        activation_checkpoint_func=functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False),
        dynamic_shape=dynamic_shape)


def gpt_pipeline(shape: GPTShape, layout: Layout, *, seed: int, device: torch.device, tp_group,
                 sequence_parallel: bool, partition_method: str, activation_checkpointing: bool) -> PipelineModule:
    build = dict(seed=seed, device=device, tp_group=tp_group, sequence_parallel=sequence_parallel)
    specs: List = [TiedLayerSpec("wte", GPTPiece, shape, "embed", tied_weight_attr=["embed.wte.weight"], **build)]
    specs += [LayerSpec(GPTPiece, shape, "block", i, **build) for i in range(shape.n_layer)]
    specs += [LayerSpec(GPTPiece, shape, "ln_f", **build),
              TiedLayerSpec("wte", GPTPiece, shape, "wte", forward_fn=_head,
                            tied_weight_attr=["embed.wte.weight"], **build)]
    return _pipeline_module(specs, layout, TokenLoss(tp_group), partition_method=partition_method,
                            activation_checkpointing=activation_checkpointing)


def bert_pipeline(shape: BertShape, layout: Layout, *, seed: int, device: torch.device, tp_group,
                  partition_method: str, activation_checkpointing: bool, dynamic_shape: bool) -> PipelineModule:
    """Stages pass (hidden, inputs) so each layer sees the padding. With batches padded to
    their longest sample, shapes change between micro-batches: dynamic_shape sends each
    micro-batch's shapes ahead of it."""
    build = dict(seed=seed, device=device, tp_group=tp_group)
    tied = dict(tied_weight_attr=["bert.embeddings.word_embeddings.weight"])
    specs: List = [TiedLayerSpec("word_embeddings", BertPiece, shape, "word_embeddings", **tied, **build),
                   LayerSpec(BertPiece, shape, "embeddings", **build)]
    specs += [LayerSpec(BertPiece, shape, "layer", i, **build) for i in range(shape.n_layer)]
    specs += [LayerSpec(BertPiece, shape, "transform", **build),
              TiedLayerSpec("word_embeddings", BertPiece, shape, "word_embeddings", forward_fn=_head, **tied, **build),
              LayerSpec(BertPiece, shape, "decoder_bias", **build)]
    return _pipeline_module(specs, layout, TokenLoss(tp_group), partition_method=partition_method,
                            activation_checkpointing=activation_checkpointing, dynamic_shape=dynamic_shape)


def cnn_pipeline(shape: CNNShape, layout: Layout, *, seed: int, device: torch.device, dp_group,
                 partition_method: str) -> PipelineModule:
    build = dict(seed=seed, device=device, dp_group=dp_group)
    specs: List = [LayerSpec(CNNPiece, shape, "stem", **build)]
    specs += [LayerSpec(CNNPiece, shape, "block", (s, i), **build) for s, i, *_ in shape.blocks()]
    specs += [LayerSpec(CNNPiece, shape, "head", **build)]
    return _pipeline_module(specs, layout, classification_loss, partition_method=partition_method,
                            activation_checkpointing=False)


_PIPE_PREFIX = re.compile(r"^(\d+\.|tied_modules\.[^.]+\.)")


def plain_name(name: str) -> str:
    """A pipeline parameter's name in the plain model (`3.h.1.attn...` -> `h.1.attn...`)."""
    return _PIPE_PREFIX.sub("", name)
