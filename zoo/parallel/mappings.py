"""Communication primitives of Megatron-style tensor and sequence parallelism.

Each mapping is an autograd Function whose backward is the adjoint of its forward (an
all-reduce forward is an identity backward, a gather forward is a split backward, ...),
built from four primitives shared by both directions. Process groups are passed
explicitly; `group=None` or a group of size 1 means no communication at all, the input is
returned unchanged. Collectives are looked up on `torch.distributed` at call time (so
tests can count them); inside a `model.compile` graph they are the functional collectives,
which dynamo traces (`all_reduce`). Activations are (B, T, C): the sequence dimension is dim 1.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

SEQUENCE_DIM = 1


def group_size(group) -> int:
    """Ranks in `group`; 1 for None (no tensor parallelism)."""
    return 1 if group is None else dist.get_world_size(group)


def group_rank(group) -> int:
    """This process's rank within `group`; 0 for None."""
    return 0 if group is None else dist.get_rank(group)


def _local_size(x: torch.Tensor, dim: int, world: int) -> int:
    if x.shape[dim] % world:
        raise ValueError(f"dimension {dim} of a tensor of shape {tuple(x.shape)} "
                         f"is not divisible by the group size {world}")
    return x.shape[dim] // world


def all_reduce(x: torch.Tensor, group, op: str = "sum") -> torch.Tensor:
    """The sum (or "max") of `x` over the group, as a new tensor: dist.all_reduce works in
    place, so it reduces a copy, never the caller's tensor. Inside a model.compile graph it
    is the functional collective, which dynamo traces (its rewrite of the in-place call fails
    on the ReduceOp argument and sends the whole forward back to eager)."""
    if group_size(group) == 1:
        return x
    if torch.compiler.is_compiling():
        return funcol.all_reduce(x, op, group)
    x = x.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(x, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op], group=group)
    return x


def _split(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """This rank's consecutive slice of `dim`."""
    world = group_size(group)
    if world == 1:
        return x
    n = _local_size(x, dim, world)
    return x.narrow(dim, group_rank(group) * n, n).contiguous()


def _gather(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """Every rank's `x` concatenated along `dim`, in rank order."""
    world = group_size(group)
    if world == 1:
        return x
    dim %= x.dim()
    # The collectives concatenate along dim 0 (gloo accepts only that form, not a stack).
    if torch.compiler.is_compiling():
        out = funcol.all_gather_tensor(x.contiguous(), 0, group)
    else:
        out = x.new_empty((world * x.shape[0], *x.shape[1:]))
        dist.all_gather_single(out, x.contiguous(), group=group)
    return out.unflatten(0, (world, x.shape[0])).movedim(0, dim).flatten(dim, dim + 1)


def _reduce_scatter(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """The sum over the group of `x`, of which this rank keeps its slice of `dim`."""
    world = group_size(group)
    if world == 1:
        return x
    dim %= x.dim()
    n = _local_size(x, dim, world)
    stacked = x.unflatten(dim, (world, n)).movedim(dim, 0).contiguous()  # (world, ..., n, ...)
    if torch.compiler.is_compiling():
        return funcol.reduce_scatter_tensor(stacked.flatten(0, 1), "sum", 0, group)
    out = x.new_empty(stacked.shape[1:])
    # gloo implements reduce_scatter_single on CPU in torch 2.13, so no backend branch.
    dist.reduce_scatter_single(out, stacked.flatten(0, 1), group=group)
    return out


class _CopyToTPRegion(torch.autograd.Function):
    """f: identity forward, all-reduce backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad, ctx.group), None


class _ReduceFromTPRegion(torch.autograd.Function):
    """g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _ScatterToTPRegion(torch.autograd.Function):
    """Split the last dim forward, all-gather it backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split(x, -1, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, -1, ctx.group), None


class _GatherFromTPRegion(torch.autograd.Function):
    """All-gather the last dim forward, split it backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather(x, -1, group)

    @staticmethod
    def backward(ctx, grad):
        return _split(grad, -1, ctx.group), None


class _ScatterToSequenceParallelRegion(torch.autograd.Function):
    """Split the sequence forward, all-gather it backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split(x, SEQUENCE_DIM, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, SEQUENCE_DIM, ctx.group), None


class _GatherFromSequenceParallelRegion(torch.autograd.Function):
    """All-gather the sequence forward; reduce-scatter backward, since the gathered
    activation feeds a column-parallel layer whose ranks each contribute a partial gradient."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather(x, SEQUENCE_DIM, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad, SEQUENCE_DIM, ctx.group), None


class _ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """Reduce-scatter the sequence forward, all-gather it backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter(x, SEQUENCE_DIM, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, SEQUENCE_DIM, ctx.group), None


def _apply(fn, x: torch.Tensor, group) -> torch.Tensor:
    return x if group_size(group) == 1 else fn.apply(x, group)


def copy_to_tp_region(x: torch.Tensor, group) -> torch.Tensor:
    return _apply(_CopyToTPRegion, x, group)


def reduce_from_tp_region(x: torch.Tensor, group) -> torch.Tensor:
    return _apply(_ReduceFromTPRegion, x, group)


def scatter_to_tp_region(x: torch.Tensor, group) -> torch.Tensor:
    return _apply(_ScatterToTPRegion, x, group)


def gather_from_tp_region(x: torch.Tensor, group) -> torch.Tensor:
    return _apply(_GatherFromTPRegion, x, group)


def scatter_to_sequence_parallel_region(x: torch.Tensor, group) -> torch.Tensor:
    return _apply(_ScatterToSequenceParallelRegion, x, group)


def gather_from_sequence_parallel_region(x: torch.Tensor, group) -> torch.Tensor:
    return _apply(_GatherFromSequenceParallelRegion, x, group)


def reduce_scatter_to_sequence_parallel_region(x: torch.Tensor, group) -> torch.Tensor:
    return _apply(_ReduceScatterToSequenceParallelRegion, x, group)
