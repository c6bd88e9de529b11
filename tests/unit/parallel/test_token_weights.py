"""zoo.parallel.token_weights: micro-batch means weighted so that their mean over the
micro-batches and the data-parallel ranks is the global batch's mean over its counted targets;
exactly 1 where every micro-batch counts alike."""
from __future__ import annotations

import torch
import torch.distributed as dist

from tests.unit.parallel._dist import run_ranks
from zoo.models.losses import IGNORE, masked_mean
from zoo.parallel.token_weights import token_weights


def _batches(seed: int, kept):
    """Micro-batches of per-token losses as 'targets' stand-ins: row i keeps kept[i] targets."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in kept:
        y = torch.full((1, 16), IGNORE)
        y[0, :n] = torch.randint(0, 100, (n,), generator=g)
        out.append((torch.rand(1, 16, generator=g), y))
    return out


def _mean_of_weighted(batches, weights):
    return sum(masked_mean(loss, y) * w for (loss, y), w in zip(batches, weights)) / len(batches)


def test_one_rank_weighted_micro_batches_give_the_global_token_mean():
    batches = _batches(0, [16, 3, 9, 0])
    weights = token_weights(batches, grad_accum=4, dp=1)
    whole = torch.cat([loss for loss, _ in batches], 1), torch.cat([y for _, y in batches], 1)
    torch.testing.assert_close(_mean_of_weighted(batches, weights), masked_mean(*whole))
    assert float(weights[3]) == 0.0
    plain = sum(masked_mean(loss, y) for loss, y in batches) / 4  # the unweighted mean differs
    assert abs(float(plain) - float(masked_mean(*whole))) > 1e-2


def test_even_counts_weigh_exactly_one():
    assert all(float(w) == 1.0 for w in token_weights(_batches(1, [7, 7, 7]), grad_accum=3, dp=1))


def _two_ranks(rank, world):
    kept = [[16, 2], [5, 11]][rank]
    batches = _batches(rank, kept)
    weights = token_weights(batches, grad_accum=2, dp=2, dp_group=dist.group.WORLD)
    mine = _mean_of_weighted(batches, weights).reshape(1)
    dist.all_reduce(mine)  # the engine's mean over dp
    every = [_batches(r, [[16, 2], [5, 11]][r]) for r in range(2)]
    loss = torch.cat([b[0] for r in every for b in r], 1)
    y = torch.cat([b[1] for r in every for b in r], 1)
    torch.testing.assert_close(mine[0] / 2, masked_mean(loss, y))


def test_over_data_parallel_ranks_the_weights_count_every_rank():
    run_ranks(2, _two_ranks)
