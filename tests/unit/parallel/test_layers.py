"""Tensor-parallel layers, mappings and cross-entropy against their single-device twins.

Every rank builds the same full reference (same seed), loads its shard with `shard_tensor`
and compares the output and every gradient with the matching slice of the reference's.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from tests.unit.parallel._dist import run_ranks
from zoo.parallel import mappings as M
from zoo.parallel.cross_entropy import vocab_parallel_cross_entropy
from zoo.parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from zoo.parallel.sharding import (
    ShardSpec,
    shard_rows,
    shard_shape,
    shard_tensor,
    unshard_tensors,
)

B, T, C, V = 2, 8, 12, 16
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_single", "all_gather_into_tensor",
               "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor")
MAPPINGS = (M.copy_to_tp_region, M.reduce_from_tp_region, M.scatter_to_tp_region,
            M.gather_from_tp_region, M.scatter_to_sequence_parallel_region,
            M.gather_from_sequence_parallel_region, M.reduce_scatter_to_sequence_parallel_region)


def close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def part(full, dim, rank, world, chunks=1):
    return shard_tensor(full, ShardSpec(dim=dim, rank=rank, world=world, chunks=chunks))


def load_shards(par: nn.Module, ref: nn.Module) -> None:
    """Copy the reference's parameters into `par`, sliced where `par` is sharded."""
    full = dict(ref.named_parameters())
    with torch.no_grad():
        for name, p in par.named_parameters():
            spec = getattr(p, "tp_shard", None)
            p.copy_(full[name] if spec is None else shard_tensor(full[name], spec))


def check_grads(par: nn.Module, ref: nn.Module) -> None:
    full = dict(ref.named_parameters())
    for name, p in par.named_parameters():
        spec = getattr(p, "tp_shard", None)
        expected = full[name].grad if spec is None else shard_tensor(full[name].grad, spec)
        close(p.grad, expected)


def forbid_collectives(set_attr) -> None:
    """Make every collective raise; `set_attr` is monkeypatch.setattr or the builtin setattr."""
    def boom(*args, **kwargs):
        raise AssertionError("a group of size 1 must not communicate")
    for name in COLLECTIVES:
        set_attr(dist, name, boom)


# ---------------------------------------------------------------- sharding arithmetic

@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("chunks", [1, 3])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_shard_unshard_round_trip(dim, chunks, world):
    full = torch.randn(24, 36)
    specs = [ShardSpec(dim=dim, rank=r, world=world, chunks=chunks) for r in range(world)]
    shards = [shard_tensor(full, s) for s in specs]
    assert all(s.shape == shard_shape(full.shape, spec) for s, spec in zip(shards, specs))
    assert torch.equal(unshard_tensors(shards, dim, chunks), full)
    for shard, spec in zip(shards, specs):  # shard_rows names exactly the slices held
        rows = [full.narrow(dim, a, b - a) for a, b in shard_rows(spec, full.shape[dim])]
        assert torch.equal(torch.cat(rows, dim), shard)


def test_shard_rows_of_fused_qkv():
    # [q; k; v] of 4 rows each, tp 2: rank 1 holds the second half of each of q, k and v
    assert shard_rows(ShardSpec(dim=0, rank=1, world=2, chunks=3), 12) == [(2, 4), (6, 8), (10, 12)]


def test_sharding_errors_name_the_sizes():
    with pytest.raises(ValueError, match=r"size 10 along dim 0 is not divisible into 3 chunk\(s\) x 2"):
        shard_rows(ShardSpec(dim=0, rank=0, world=2, chunks=3), 10)
    with pytest.raises(ValueError, match="size 6 along dim 1 .* 4 rank"):
        shard_tensor(torch.zeros(2, 6), ShardSpec(dim=1, rank=0, world=4))
    with pytest.raises(ValueError, match=r"rank 2 is outside \[0, world 2\)"):
        ShardSpec(dim=0, rank=2, world=2)
    with pytest.raises(ValueError, match="shard size 4 along dim 0 is not divisible by chunks 3"):
        unshard_tensors([torch.zeros(4), torch.zeros(4)], 0, chunks=3)


# ---------------------------------------------------------------- no group: no communication

def test_no_group_means_no_communication_and_plain_layers(monkeypatch):
    forbid_collectives(monkeypatch.setattr)
    x = torch.randn(B, T, C)
    assert all(fn(x, None) is x for fn in MAPPINGS)
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Embedding(V, C), nn.Linear(C, 3 * C), nn.GELU(), nn.Linear(3 * C, V))
    par = nn.Sequential(VocabParallelEmbedding(V, C, None), ColumnParallelLinear(C, 3 * C, None, chunks=3),
                        nn.GELU(), RowParallelLinear(3 * C, V, None))
    load_shards(par, ref)
    ids, target = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
    target[0, :3] = -100
    expected = F.cross_entropy(ref(ids).flatten(0, 1), target.flatten(), reduction="none").view(B, T)
    loss = vocab_parallel_cross_entropy(par(ids), target, None)
    close(loss, expected)
    expected.sum().backward()
    loss.sum().backward()
    check_grads(par, ref)


def test_deepspeed_sees_exactly_the_sharded_parameters():
    from deepspeed.runtime.utils import is_model_parallel_parameter

    col, row, emb = ColumnParallelLinear(4, 6, None), RowParallelLinear(6, 4, None), VocabParallelEmbedding(8, 4, None)
    for p in (col.weight, col.bias, row.weight, emb.weight):
        assert is_model_parallel_parameter(p) and isinstance(p.tp_shard, ShardSpec)
    assert not is_model_parallel_parameter(row.bias) and not hasattr(row.bias, "tp_shard")


# ---------------------------------------------------------------- tp > 1 (spawned gloo ranks)

def _check_mappings(rank, world, group):
    S = sum(range(1, world + 1))  # sum over ranks of (rank + 1)
    torch.manual_seed(0)
    x, gy = torch.randn(B, T, C), torch.randn(B, T, C)
    cases = [  # (fn, this rank's input, its upstream grad, expected output, expected input grad)
        (M.copy_to_tp_region, x, gy * (rank + 1), x, gy * S),
        (M.reduce_from_tp_region, x * (rank + 1), gy, x * S, gy),
        (M.scatter_to_tp_region, x, part(gy, -1, rank, world), part(x, -1, rank, world), gy),
        (M.gather_from_tp_region, part(x, -1, rank, world), gy, x, part(gy, -1, rank, world)),
        (M.scatter_to_sequence_parallel_region, x, part(gy, 1, rank, world), part(x, 1, rank, world), gy),
        (M.gather_from_sequence_parallel_region, part(x, 1, rank, world), gy * (rank + 1), x,
         part(gy * S, 1, rank, world)),
        (M.reduce_scatter_to_sequence_parallel_region, x * (rank + 1), part(gy, 1, rank, world),
         part(x * S, 1, rank, world), gy),
    ]
    for fn, inp, grad, out, in_grad in cases:
        inp = inp.clone().requires_grad_()
        y = fn(inp, group)
        y.backward(grad)
        close((y, inp.grad), (out, in_grad))


def _check_column(rank, world, group, gather_output, chunks):
    torch.manual_seed(1)
    ref = nn.Linear(C, 3 * 4 * world)  # divisible by chunks * world
    par = ColumnParallelLinear(C, 3 * 4 * world, group, gather_output=gather_output, chunks=chunks)
    load_shards(par, ref)
    x, gy = torch.randn(B, T, C, requires_grad=True), torch.randn(B, T, 3 * 4 * world)
    x_par = x.detach().clone().requires_grad_()
    y = par(x_par)
    ref(x).backward(gy)
    if gather_output:
        close(y, ref(x))
        y.backward(gy)
    else:
        close(y, part(ref(x), -1, rank, world, chunks))
        y.backward(part(gy, -1, rank, world, chunks))
    close(x_par.grad, x.grad)
    check_grads(par, ref)


def _check_mlp(rank, world, group, sequence_parallel):
    """Column -> GELU -> row, as in a transformer block; also counts its all-reduces."""
    torch.manual_seed(2)
    ref = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C))
    par = nn.Sequential(ColumnParallelLinear(C, 4 * C, group, sequence_parallel=sequence_parallel), nn.GELU(),
                        RowParallelLinear(4 * C, C, group, sequence_parallel=sequence_parallel))
    load_shards(par, ref)
    x, gy = torch.randn(B, T, C, requires_grad=True), torch.randn(B, T, C)
    out = ref(x)
    out.backward(gy)
    seq = (lambda t: part(t, 1, rank, world)) if sequence_parallel else (lambda t: t)
    x_par = seq(x.detach()).requires_grad_()

    calls, real_all_reduce = [], dist.all_reduce
    dist.all_reduce = lambda *a, **k: (calls.append(1), real_all_reduce(*a, **k))[1]
    try:
        y = par(x_par)
        n_forward = len(calls)
        y.backward(seq(gy))
        n_backward = len(calls) - n_forward
    finally:
        dist.all_reduce = real_all_reduce
    # tp: g in forward, f in backward. sp: all-gather / reduce-scatter only, but the replicated
    # row bias sees T/tp positions per rank and its gradient is all-reduced in backward.
    assert (n_forward, n_backward) == ((0, 1) if sequence_parallel else (1, 1)), (n_forward, n_backward)
    close(y, seq(out))
    close(x_par.grad, seq(x.grad))
    check_grads(par, ref)


def _check_size_one_groups(rank, world):
    solo = [dist.new_group([r]) for r in range(world)][rank]  # every rank creates every group
    real = {name: getattr(dist, name) for name in COLLECTIVES}
    forbid_collectives(setattr)
    try:
        x = torch.randn(B, T, C)
        assert all(fn(x, solo) is x for fn in MAPPINGS)
        ref, par = nn.Linear(C, C), ColumnParallelLinear(C, C, solo, gather_output=True)
        load_shards(par, ref)
        close(par(x), ref(x))
        logits, target = torch.randn(B, T, V), torch.randint(0, V, (B, T))
        close(vocab_parallel_cross_entropy(logits, target, solo),
              F.cross_entropy(logits.transpose(1, 2), target, reduction="none"))
    finally:
        for name, fn in real.items():
            setattr(dist, name, fn)


def _check_errors(rank, world, group):
    with pytest.raises(ValueError, match=f"ColumnParallelLinear: out_features 9 is not divisible by tp {world}; "
                                         f"choose tp among the divisors of 9"):
        ColumnParallelLinear(C, 9, group)
    with pytest.raises(ValueError, match=f"out_features 9 in 3 chunks of 3 is not divisible by tp {world}"):
        ColumnParallelLinear(C, 9, group, chunks=3)
    with pytest.raises(ValueError, match=f"RowParallelLinear: in_features 9 is not divisible by tp {world}"):
        RowParallelLinear(9, C, group)
    with pytest.raises(ValueError, match=f"VocabParallelEmbedding: num_embeddings 9 is not divisible by tp {world}"):
        VocabParallelEmbedding(9, C, group)


def _check_vocab_parallel(rank, world, group):
    torch.manual_seed(3)
    ref, par = nn.Embedding(V, C), VocabParallelEmbedding(V, C, group)
    load_shards(par, ref)
    ids, gy = torch.randint(0, V, (B, T)), torch.randn(B, T, C)
    y = par(ids)
    close(y, ref(ids))
    y.backward(gy)
    ref(ids).backward(gy)
    check_grads(par, ref)

    for ignore_index in (-100, 5):
        logits, gl = (3 * torch.randn(B, T, V)).requires_grad_(), torch.randn(B, T)
        target = torch.randint(0, V, (B, T))
        target[0, :3], target[1, -1] = ignore_index, ignore_index
        expected = F.cross_entropy(logits.transpose(1, 2), target, reduction="none", ignore_index=ignore_index)
        expected.backward(gl)
        local = part(logits.detach(), -1, rank, world).requires_grad_()
        loss = vocab_parallel_cross_entropy(local, target, group, ignore_index=ignore_index)
        close(loss, expected)
        loss.backward(gl)
        close(local.grad, part(logits.grad, -1, rank, world))
        assert (loss[target == ignore_index] == 0).all() and (local.grad[target == ignore_index] == 0).all()


def _all_checks(rank, world):
    group = dist.group.WORLD
    _check_mappings(rank, world, group)
    for gather_output in (False, True):
        for chunks in (1, 3):
            _check_column(rank, world, group, gather_output, chunks)
    for sequence_parallel in (False, True):
        _check_mlp(rank, world, group, sequence_parallel)
    _check_vocab_parallel(rank, world, group)
    _check_errors(rank, world, group)
    if world == 2:
        _check_size_one_groups(rank, world)


@pytest.mark.parametrize("world", [2, 4])
def test_tensor_parallel_matches_single_device(world):
    """One spawn per world size (spawning dominates the runtime); the traceback names the check."""
    run_ranks(world, _all_checks)
