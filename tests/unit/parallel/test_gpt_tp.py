"""GPT under tensor parallelism against the same GPT at tp=1 (same seed, same batch):
initial shards, logits, every gradient, the collectives per layer, per-rank memory, and
the per-step loss of real 10-step runs with and without sequence parallelism."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.unit.parallel._dist import run_ranks
from zoo.checkpoint.consolidate import full_parameters
from zoo.families.registry import family_of_shape as spec_of
from zoo.models.gpt import gpt_shape
from zoo.parallel.build import build_model
from zoo.parallel.mappings import gather_from_tp_region
from zoo.parallel.sharding import unshard_tensors

CPU = torch.device("cpu")


def _gather_grads(model, group):
    out = {}
    for name, p in model.named_parameters():
        g = p.grad
        spec = getattr(p, "tp_shard", None)
        if spec is not None:
            parts = [torch.empty_like(g) for _ in range(dist.get_world_size(group))]
            dist.all_gather(parts, g.contiguous(), group=group)
            g = unshard_tensors(parts, spec.dim, spec.chunks)
        out[name] = g
    return out


def check_tp_equivalence(shape, sequence_parallel: bool, document_end=None) -> None:
    """On every rank of the world group: the tp-sharded model of `shape` against the same model
    at tp=1 (same seed, same batch): initial shards, logits, loss and every gradient. With
    `document_end`, both models attend within documents (zoo.models.documents) and the batch's
    rows hold that token at a few places."""
    group = dist.group.WORLD
    ref = build_model(spec_of(shape), shape, seed=11, device=CPU, document_end=document_end)
    tp = build_model(spec_of(shape), shape, seed=11, device=CPU, tp_group=group, sequence_parallel=sequence_parallel,
                     document_end=document_end)
    full = full_parameters(tp, group)
    for name, p in ref.named_parameters():
        assert torch.equal(full[name], p.detach()), f"initial shard of {name} is not the slice of tp=1"
    tokens = getattr(shape, "vocab_real", None) or shape.vocab_size  # a padded vocabulary: its own tokens only
    idx = torch.randint(0, tokens, (2, 16), generator=torch.Generator().manual_seed(0))
    if document_end is not None:  # three documents in the first row, two in the second
        idx[idx == document_end] = (document_end + 1) % tokens
        idx[0, [4, 9]] = idx[1, 7] = document_end
    tgt = torch.randint(0, tokens, (2, 16), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(gather_from_tp_region(tp(idx), group), ref(idx), rtol=1e-5, atol=1e-5)
    ref(idx, tgt).backward()
    loss = tp(idx, tgt)
    loss.backward()
    torch.testing.assert_close(loss, ref(idx, tgt), rtol=1e-5, atol=1e-6)
    grads = _gather_grads(tp, group)
    for name, p in ref.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")


def _equivalence(rank, world, sequence_parallel):
    check_tp_equivalence(gpt_shape("tiny", 256, n_layer=2, block_size=16), sequence_parallel)


def _collectives_per_layer(rank, world):
    group = dist.group.WORLD
    counts = {}
    real = dist.all_reduce
    for n_layer in (1, 3):
        shape = gpt_shape("tiny", 256, n_layer=n_layer, block_size=16)
        model = build_model(spec_of(shape), shape, seed=0, device=CPU, tp_group=group)
        idx = torch.randint(0, 256, (2, 16))
        calls = []
        dist.all_reduce = lambda *a, **k: (calls.append(1), real(*a, **k))[1]
        try:
            loss = model(idx, idx)
            fwd = len(calls)
            loss.backward()
            counts[n_layer] = (fwd, len(calls) - fwd)
        finally:
            dist.all_reduce = real
    per_layer = [(counts[3][i] - counts[1][i]) / 2 for i in range(2)]
    assert per_layer == [2, 2], f"all-reduces per layer (forward, backward): {per_layer}; totals {counts}"


def _memory(rank, world):
    group = dist.group.WORLD
    shape = gpt_shape("tiny", 512, n_layer=4, block_size=16)
    total = sum(p.numel() for p in build_model(spec_of(shape), shape, seed=0, device=CPU).parameters())
    local = sum(p.numel() for p in build_model(spec_of(shape), shape, seed=0, device=CPU, tp_group=group).parameters())
    # Replicated: LayerNorms, position table, row-parallel biases (~3% here).
    assert total / world <= local <= 1.05 * total / world, (local, total)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_gpt_tp2_matches_tp1(sequence_parallel):
    run_ranks(2, _equivalence, sequence_parallel)


def test_two_all_reduces_per_layer_forward_and_backward():
    run_ranks(2, _collectives_per_layer)


def test_each_rank_holds_about_1_over_tp_of_the_weights():
    run_ranks(2, _memory)
