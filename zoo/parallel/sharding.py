"""How a tensor-parallel parameter shard relates to its full (tp=1) tensor.

The full tensor is cut along `dim` into `chunks` equal consecutive chunks (chunks=3 is a
fused [q; k; v] projection), each chunk into `world` equal parts, and rank r holds part r
of every chunk, concatenated in chunk order. This file owns that arithmetic; layers tag
their parameters with a `ShardSpec` and everything else (init, checkpoints, tests) reads it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class ShardSpec:
    """Where one rank's shard sits in the full tensor."""

    dim: int
    """The dimension the full tensor is split along."""
    rank: int
    """This shard's rank within the tensor-parallel group."""
    world: int
    """The tensor-parallel group size."""
    chunks: int = 1
    """Consecutive equal chunks along `dim`, each split separately (3 for fused QKV)."""

    def __post_init__(self):
        if self.world < 1 or self.chunks < 1:
            raise ValueError(f"ShardSpec: world {self.world} and chunks {self.chunks} must be >= 1")
        if not 0 <= self.rank < self.world:
            raise ValueError(f"ShardSpec: rank {self.rank} is outside [0, world {self.world})")


def shard_rows(spec: ShardSpec, full_size: int) -> list[tuple[int, int]]:
    """The (start, stop) ranges along `spec.dim` of the full tensor that the shard holds, in order."""
    if full_size % (spec.chunks * spec.world):
        raise ValueError(f"size {full_size} along dim {spec.dim} is not divisible into {spec.chunks} "
                         f"chunk(s) x {spec.world} rank(s) = {spec.chunks * spec.world} equal parts")
    chunk = full_size // spec.chunks
    part = chunk // spec.world
    return [(c * chunk + spec.rank * part, c * chunk + (spec.rank + 1) * part) for c in range(spec.chunks)]


def shard_shape(full_shape: Sequence[int], spec: ShardSpec) -> tuple[int, ...]:
    """The shape of the shard of a tensor of shape `full_shape`."""
    shape = list(full_shape)
    shard_rows(spec, shape[spec.dim])  # validates divisibility
    shape[spec.dim] //= spec.world
    return tuple(shape)


def shard_tensor(full: torch.Tensor, spec: ShardSpec) -> torch.Tensor:
    """This rank's shard of `full` (a new tensor)."""
    pieces = [full.narrow(spec.dim, a, b - a) for a, b in shard_rows(spec, full.shape[spec.dim])]
    return torch.cat(pieces, dim=spec.dim)


def unshard_tensors(shards: Sequence[torch.Tensor], dim: int, chunks: int = 1) -> torch.Tensor:
    """The full tensor from every rank's shard, given in rank order (inverse of `shard_tensor`)."""
    shapes = {tuple(s.shape) for s in shards}
    if len(shapes) != 1:
        raise ValueError(f"unshard_tensors: shards must all have one shape, got {sorted(shapes)}")
    size = shards[0].shape[dim]
    if size % chunks:
        raise ValueError(f"unshard_tensors: shard size {size} along dim {dim} is not divisible by chunks {chunks}")
    per_rank = [s.chunk(chunks, dim=dim) for s in shards]  # [rank][chunk]
    return torch.cat([piece[c] for c in range(chunks) for piece in per_rank], dim=dim)


def gather_full(t: torch.Tensor, spec: "ShardSpec | None", tp_group) -> torch.Tensor:
    """The full tensor of which `t` is this rank's shard `spec` (collective over `tp_group`);
    `t` itself when it is not sharded or there is no group."""
    if spec is None or tp_group is None:
        return t
    import torch.distributed as dist

    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(tp_group))]
    dist.all_gather(parts, t.contiguous(), group=tp_group)
    return unshard_tensors(parts, spec.dim, spec.chunks)


def local_shard(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """The part of the full tensor `full` that `param` (tagged `tp_shard` if sharded) holds."""
    spec = getattr(param, "tp_shard", None)
    return shard_tensor(full, spec) if spec is not None else full
