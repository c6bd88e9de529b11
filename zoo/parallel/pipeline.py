"""Pipeline parallelism: a DeepSpeed `PipelineModule` built from a model's list of layers.

The model stays a plain module; its pipeline view is a list of `LayerSpec`s (built only
on the stage that owns them) with the input and output embeddings as DeepSpeed tied
layers across the first and last stage. Stages are partitioned by parameter counts taken
on the meta device (DeepSpeed's own count would build every layer on every rank).
"""
from __future__ import annotations

import functools
import re
from typing import Callable, List

import torch
from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec

from zoo.build import GPTPiece
from zoo.models.gpt import GPTShape, cross_entropy_per_token, masked_mean
from zoo.parallel.cross_entropy import vocab_parallel_cross_entropy
from zoo.parallel.topology import Layout, build_topology


class ZooPipelineModule(PipelineModule):
    def _count_layer_params(self):
        return [spec.typename.parameter_count(*spec.module_args, **spec.module_kwargs)
                if isinstance(spec, LayerSpec) else 0 for spec in self._layer_specs]


def _head(piece: GPTPiece, x: torch.Tensor) -> torch.Tensor:
    return piece.logits(x)


class TokenLoss:
    """Mean per-token loss of (possibly vocab-sharded) logits; -100 targets are ignored."""

    def __init__(self, tp_group=None):
        self.per_token: Callable = (functools.partial(vocab_parallel_cross_entropy, tp_group=tp_group)
                                    if tp_group is not None else cross_entropy_per_token)

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return masked_mean(self.per_token(logits, targets), targets)


def gpt_pipeline(shape: GPTShape, layout: Layout, *, seed: int, device: torch.device, tp_group,
                 sequence_parallel: bool, partition_method: str, activation_checkpointing: bool) -> PipelineModule:
    build = dict(seed=seed, device=device, tp_group=tp_group, sequence_parallel=sequence_parallel)
    specs: List = [TiedLayerSpec("embed", GPTPiece, shape, "embed", tied_weight_attr=["embed.wte.weight"], **build)]
    specs += [LayerSpec(GPTPiece, shape, "block", i, **build) for i in range(shape.n_layer)]
    specs += [LayerSpec(GPTPiece, shape, "ln_f", **build),
              TiedLayerSpec("embed", GPTPiece, shape, "embed", forward_fn=_head,
                            tied_weight_attr=["embed.wte.weight"], **build)]
    return ZooPipelineModule(
        layers=specs, topology=build_topology(layout), loss_fn=TokenLoss(tp_group),
        partition_method=partition_method, activation_checkpoint_interval=1 if activation_checkpointing else 0,
        activation_checkpoint_func=functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False))


_PIPE_PREFIX = re.compile(r"^(\d+\.|tied_modules\.[^.]+\.)")


def plain_name(name: str) -> str:
    """A pipeline parameter's name in the plain model (`3.h.1.attn...` -> `h.1.attn...`)."""
    return _PIPE_PREFIX.sub("", name)
