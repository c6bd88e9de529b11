"""Attention that stays inside a document (`data.document_mask=true`), for the causal LMs.

Packed blocks hold the end of one document, its end-of-text token and the start of the
next. With document masking a token attends only to the earlier tokens of its own document
(block-causal attention) and its position counts from its document's start (GPT's position
table, Llama's rotary angles), as Megatron's `--reset-attention-mask --reset-position-ids`:
the end-of-text token belongs to the document it ends, and the token after it starts at
position 0. Everything comes from the token ids, so the data is unchanged.

The model's layer list (zoo.models.stages) then carries `(hidden, positions)` between its
layers instead of `hidden`: positions are (B, T) integers, whole on every tensor-parallel
rank (attention sees the whole sequence also under sequence parallelism), passed along the
pipeline beside the hidden states (DeepSpeed sends a tuple's integer tensors and no gradient
for them). The first attention of a stage builds the (B, 1, T, T) mask from them and keeps
it on the positions tensor for the stage's other layers (`attention_mask`): cheaper to
rebuild in each stage than to send between stages. Under context parallelism the positions
are this rank's share, and with documents the whole block's positions travel beside them
(`_Carry`): a rank's keys come from every rank's share.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import List, Optional, Sequence

import torch
import torch.nn as nn

from zoo.models.stages import PipeLayer


def document_positions(idx: torch.Tensor, end_id: int) -> torch.Tensor:
    """(B, T) int64: each token's position within its document, 0 after every `end_id`."""
    T = idx.shape[1]
    arange = torch.arange(T, device=idx.device).expand_as(idx)
    starts = torch.zeros_like(idx, dtype=torch.bool)
    starts[:, 1:] = idx[:, :-1] == end_id
    starts[:, 0] = True
    start_of_own = torch.where(starts, arange, torch.zeros_like(arange)).cummax(dim=1).values
    return arange - start_of_own


def document_mask(positions: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T) bool: query i may attend key j (same document, j <= i), from document_positions."""
    doc = (positions == 0).cumsum(dim=1)  # a document's number within the block
    T = positions.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=positions.device).tril()
    return ((doc[:, :, None] == doc[:, None, :]) & causal)[:, None]


def attention_mask(positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`document_mask(positions)` as SDPA's additive mask in the attention's dtype (0 where a
    query attends, -inf elsewhere), built once for a `positions` tensor and kept on it, so
    every attention layer of a stage is given the same tensor. SDPA turns a boolean mask into
    a float one on every call and keeps that for the backward: one (B, 1, T, T) mask a layer
    (at 8,192 tokens, 268 MB each in fp32) where one a micro-batch is enough. The same
    numbers either way; under torch.compile it is built per call (the compiler sees through
    it). Its lifetime is the positions' own: they are freed with the step's graph."""
    if torch.compiler.is_compiling():
        return _additive(document_mask(positions), dtype)
    kept = getattr(positions, "_zoo_attention_mask", None)
    if kept is None or kept.dtype != dtype:
        kept = _additive(document_mask(positions), dtype)
        positions._zoo_attention_mask = kept
    return kept


class ReadsContext:
    """A module that runs differently under context parallelism (the causal LM, its attention
    layers): the parallelize step sets `context` (zoo.parallel.context.ContextShard) on each;
    the model code imports nothing of the parallel package."""

    context = None

    def sharded(self):
        """The shard this forward runs under (None without context parallelism, or when
        `whole_sequences` turned it off)."""
        context = self.context
        return context if context is not None and context.enabled else None


@contextlib.contextmanager
def whole_sequences(model: nn.Module):
    """Inside, `model` (a ReadsContext) runs every sequence whole on each rank (decoding, in-loop
    tasks of any length): the weights are the same on every cp rank, so only time is spent, not
    correctness. Nothing changes without context parallelism (or a model that has none)."""
    context = getattr(model, "context", None)
    if context is None or not context.enabled:
        yield
        return
    context.enabled = False
    try:
        yield
    finally:
        context.enabled = True


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))


class _Embed:
    """The first layer: token ids -> (hidden, positions). Under context parallelism
    (`context`, zoo.parallel.context) the ids are the whole block's and the hidden states and
    positions this rank's share of it (the positions global, or the documents' own)."""

    def __init__(self, layer: PipeLayer, end_id: Optional[int], takes_positions: bool, context=None):
        self.layer, self.end_id, self.takes_positions, self.context = layer, end_id, takes_positions, context

    def __call__(self, root: nn.Module, idx: torch.Tensor):
        positions = None if self.end_id is None else document_positions(idx, self.end_id)
        block, context = positions, _on(self.context)
        if context is not None:
            idx, positions = context.share(idx, positions)
        if self.takes_positions:  # a learned position table (GPT)
            hidden = root.get_submodule(self.layer.paths[0])(idx, positions=positions)
        else:
            hidden = self.layer(root, idx)
        if context is not None and block is not None:  # the block's documents, for every stage's masks
            return hidden, positions, block
        if positions is None:  # whole sequences of a sharded model without documents (decoding, the tasks)
            return hidden
        return hidden, positions


def _on(context):
    """`context` where it shards this forward (None without, or inside `whole_sequences`)."""
    return context if context is not None and context.enabled else None


class _Carry:
    """A block: (hidden, positions) -> (block(hidden, positions=positions), positions). Under
    context parallelism with documents, (hidden, positions, block): `block` the whole block's
    document positions, which this rank's attention masks need (its keys are every rank's),
    carried beside the share from the first stage to the last and entered into the shard
    before each block runs: a pipeline stage runs other micro-batches' forwards between one
    micro-batch's forward and its recomputation in the backward."""

    def __init__(self, path: str, context=None):
        self.path, self.context = path, context

    def __call__(self, root: nn.Module, x):
        if isinstance(x, torch.Tensor):  # no positions (`_Embed`: whole sequences without documents)
            return root.get_submodule(self.path)(x)
        hidden, positions, *block = x
        if block:
            self.context.enter(block[0])
        return (root.get_submodule(self.path)(hidden, positions=positions), positions, *block)


class _Drop:
    """The first layer after the blocks: drops the positions, then runs as before."""

    def __init__(self, layer: PipeLayer):
        self.layer = layer

    def __call__(self, root: nn.Module, x):
        return self.layer(root, x if isinstance(x, torch.Tensor) else x[0])


def with_documents(layers: Sequence[PipeLayer], end_id: Optional[int], *,
                   embedding_takes_positions: bool, context=None) -> List[PipeLayer]:
    """`layers` (embedding, checkpointable blocks, the rest) carrying positions from the
    embedding through the blocks; unchanged where `end_id` is None (no document masking) and
    there is no `context` (zoo.parallel.context.ContextShard: context parallelism)."""
    if end_id is None and context is None:
        return list(layers)
    first, *rest = layers
    out = [dataclasses.replace(first, run=_Embed(first, end_id, embedding_takes_positions, context))]
    carrying = True
    for layer in rest:
        if layer.checkpointable and carrying:
            out.append(dataclasses.replace(layer, run=_Carry(layer.paths[0], context)))
        elif carrying:
            out.append(dataclasses.replace(layer, run=_Drop(layer)))
            carrying = False
        else:
            out.append(layer)
    return out
