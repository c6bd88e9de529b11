"""Tensor-parallel twins of nn.Linear and nn.Embedding.

Weights keep nn.Linear's (out, in) layout. Every sharded parameter carries
`tp_shard: ShardSpec` (read by initialisation and checkpointing) and
`tensor_model_parallel = True`, the flag DeepSpeed's `is_model_parallel_parameter` reads so
that gradient norms count each shard once per tensor-parallel rank instead of only rank 0's.
Replicated parameters carry neither. The layers allocate with torch.empty and leave the real
initialisation to `zoo.models.init`; `reset_parameters()` only makes them usable standalone.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from zoo.parallel.mappings import (
    copy_to_tp_region,
    gather_from_sequence_parallel_region,
    gather_from_tp_region,
    group_rank,
    group_size,
    reduce_from_tp_region,
    reduce_scatter_to_sequence_parallel_region,
)
from zoo.parallel.sharding import ShardSpec, shard_shape


def _check_divisible(layer: str, what: str, size: int, tp: int) -> None:
    """`what` names the size being split (e.g. "out_features 10")."""
    if size % tp:
        divisors = [d for d in range(1, size + 1) if size % d == 0]
        raise ValueError(f"{layer}: {what} is not divisible by tp {tp}; "
                         f"choose tp among the divisors of {size}: {divisors}")


def _sharded_param(full_shape, spec: ShardSpec, factory) -> nn.Parameter:
    param = nn.Parameter(torch.empty(shard_shape(full_shape, spec), **factory))
    param.tp_shard = spec
    param.tensor_model_parallel = True
    return param


def _column_input(x: torch.Tensor, tp_group, sequence_parallel: bool) -> torch.Tensor:
    """The whole input of a layer that computes a share of the outputs: the replicated input
    (its gradient all-reduced in backward), or with sequence parallelism the sequence shards
    gathered, (B, T/tp, C) -> (B, T, C) (reduce-scattered in backward)."""
    if sequence_parallel:
        return gather_from_sequence_parallel_region(x, tp_group)
    return copy_to_tp_region(x, tp_group)


class _NormalInit(nn.Module):
    """A tensor-parallel layer's default initialisation, for a layer built on its own: weight
    N(0, 0.02), bias zeros (a model's own initialisation, zoo.models.init, replaces it when the model is
    built)."""

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, std=0.02)
        if getattr(self, "bias", None) is not None:
            nn.init.zeros_(self.bias)


class ColumnParallelLinear(_NormalInit):
    """y = x W^T + b with W split along its output rows: each rank computes out/tp features.

    The input is replicated (or, with sequence_parallel, sequence-sharded and gathered here);
    the output stays split along the last dim unless gather_output. With chunks > 1 (fused
    QKV) each of the `chunks` output blocks is split separately, so every rank holds whole
    q, k and v slices, and a gathered output is put back in [q; k; v] order.
    """

    def __init__(self, in_features: int, out_features: int, tp_group, *, bias: bool = True,
                 gather_output: bool = False, sequence_parallel: bool = False, chunks: int = 1,
                 device=None, dtype=None):
        super().__init__()
        self.tp_group, self.tp = tp_group, group_size(tp_group)
        if out_features % chunks:
            raise ValueError(f"ColumnParallelLinear: out_features {out_features} is not divisible "
                             f"by chunks {chunks}")
        per_chunk = out_features // chunks
        what = f"out_features {out_features}" + (f" in {chunks} chunks of {per_chunk}" if chunks > 1 else "")
        _check_divisible("ColumnParallelLinear", what, per_chunk, self.tp)
        self.in_features, self.out_features, self.chunks = in_features, out_features, chunks
        # The first output feature this rank computes (unfused): where its vocabulary shard of a head starts.
        self.output_start = group_rank(tp_group) * (per_chunk // self.tp) if chunks == 1 else None
        self.gather_output, self.sequence_parallel = gather_output, sequence_parallel
        factory = {"device": device, "dtype": dtype}
        spec = ShardSpec(dim=0, rank=group_rank(tp_group), world=self.tp, chunks=chunks)
        self.weight = _sharded_param((out_features, in_features), spec, factory)
        self.register_parameter("bias", _sharded_param((out_features,), spec, factory) if bias else None)
        self.reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _column_input(x, self.tp_group, self.sequence_parallel)
        y = F.linear(x, self.weight, self.bias)  # (..., out/tp)
        if not self.gather_output:
            return y
        y = gather_from_tp_region(y, self.tp_group)  # rank-major: [q0 k0 v0 | q1 k1 v1 | ...]
        if self.chunks > 1:
            y = y.unflatten(-1, (self.tp, self.chunks, -1)).transpose(-3, -2).flatten(-3)
        return y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, tp={self.tp}, "
                f"chunks={self.chunks}, gather_output={self.gather_output}, "
                f"sequence_parallel={self.sequence_parallel}, bias={self.bias is not None}")


class ReplicatedHeadsLinear(_NormalInit):
    """A key or value projection whose heads the tp group cannot split (tp does not divide
    `n_kv_head`): every rank holds the whole weight, the same on every rank, and computes only
    the heads its own query heads use. The input is taken as ColumnParallelLinear takes it
    (replicated, or sequence-sharded and gathered); the weight passes through
    `copy_to_tp_region`, so its gradient, each rank's heads' part, is summed over the group and
    stays the same on every rank. `query_to_kv[i]`: which of this rank's heads local query
    head i attends with (LlamaAttention reads it)."""

    def __init__(self, in_features: int, out_features: int, tp_group, *, n_head: int, n_kv_head: int,
                 sequence_parallel: bool = False, bias: bool = False, device=None, dtype=None):
        super().__init__()
        self.tp_group, self.tp = tp_group, group_size(tp_group)
        _check_divisible("ReplicatedHeadsLinear", f"n_head {n_head}", n_head, self.tp)
        head_dim, per_rank, groups = out_features // n_kv_head, n_head // self.tp, n_head // n_kv_head
        first_query = group_rank(tp_group) * per_rank
        first, last = first_query // groups, (first_query + per_rank - 1) // groups
        self.rows = (first * head_dim, (last + 1) * head_dim)
        self.query_to_kv = tuple((first_query + i) // groups - first for i in range(per_rank))
        self.in_features, self.out_features, self.sequence_parallel = in_features, out_features, sequence_parallel
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        self.register_parameter("bias", nn.Parameter(torch.empty(out_features, device=device, dtype=dtype))
                                if bias else None)  # Qwen2's: replicated and summed like the weight
        self.reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _column_input(x, self.tp_group, self.sequence_parallel)
        start, end = self.rows
        weight = copy_to_tp_region(self.weight, self.tp_group)  # the gradient: summed over the group
        bias = None if self.bias is None else copy_to_tp_region(self.bias, self.tp_group)[start:end]
        return F.linear(x, weight[start:end], bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, tp={self.tp}, "
                f"rows={self.rows}, bias={self.bias is not None}, replicated")


class RowParallelLinear(_NormalInit):
    """y = x W^T + b with W split along its input columns; the input arrives split along its
    last dim (a column-parallel output), the partial products are summed across ranks (or, with
    sequence_parallel, reduce-scattered along the sequence) and the full, replicated bias is
    added after the reduction so it counts once.
    """

    def __init__(self, in_features: int, out_features: int, tp_group, *, bias: bool = True,
                 sequence_parallel: bool = False, device=None, dtype=None):
        super().__init__()
        self.tp_group, self.tp = tp_group, group_size(tp_group)
        _check_divisible("RowParallelLinear", f"in_features {in_features}", in_features, self.tp)
        self.in_features, self.out_features = in_features, out_features
        self.sequence_parallel = sequence_parallel
        factory = {"device": device, "dtype": dtype}
        spec = ShardSpec(dim=1, rank=group_rank(tp_group), world=self.tp)
        self.weight = _sharded_param((out_features, in_features), spec, factory)
        self.register_parameter("bias", nn.Parameter(torch.empty(out_features, **factory)) if bias else None)
        self.reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)  # (..., out), partial sum over this rank's inputs
        if not self.sequence_parallel:
            y = reduce_from_tp_region(y, self.tp_group)
            return y if self.bias is None else y + self.bias
        y = reduce_scatter_to_sequence_parallel_region(y, self.tp_group)  # (B, T/tp, out)
        if self.bias is None:
            return y
        # Each rank now sees only its T/tp positions, so its bias gradient is partial:
        # all-reduce it in backward to keep the replicated bias identical across ranks.
        return y + copy_to_tp_region(self.bias, self.tp_group)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, tp={self.tp}, "
                f"sequence_parallel={self.sequence_parallel}, bias={self.bias is not None}")


class VocabParallelEmbedding(_NormalInit):
    """nn.Embedding with the vocabulary split into contiguous ranges, one per rank: each rank
    looks up the ids it owns, zeroes the others, and the partial lookups are summed."""

    def __init__(self, num_embeddings: int, embedding_dim: int, tp_group, *, device=None, dtype=None):
        super().__init__()
        self.tp_group, self.tp = tp_group, group_size(tp_group)
        _check_divisible("VocabParallelEmbedding", f"num_embeddings {num_embeddings}", num_embeddings, self.tp)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.vocab_start = group_rank(tp_group) * (num_embeddings // self.tp)
        self.vocab_end = self.vocab_start + num_embeddings // self.tp
        spec = ShardSpec(dim=0, rank=group_rank(tp_group), world=self.tp)
        self.weight = _sharded_param((num_embeddings, embedding_dim), spec,
                                     {"device": device, "dtype": dtype})
        self.reset_parameters()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp == 1:
            return F.embedding(ids, self.weight)
        foreign = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = (ids - self.vocab_start).masked_fill(foreign, 0)
        out = F.embedding(local, self.weight).masked_fill(foreign.unsqueeze(-1), 0.0)  # (..., C)
        return reduce_from_tp_region(out, self.tp_group)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, tp={self.tp}"
