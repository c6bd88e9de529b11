"""zoo.engine.state.fp32_grad_norm, the norm zoo's fp32 ZeRO-0 clipping uses, on gloo ranks
against the norm of the whole model's gradients: under a pipeline every stage's parameters
count (DeepSpeed's clip_grad_norm_ counted the first stage's alone: the tiny GPT's norm 2.17
for 2.70 at pp2), a tied weight's later copy not; under tensor parallelism a replicated
parameter counts once and a sharded one on every rank; with context parallelism the cp ranks'
equal copies count once."""
from __future__ import annotations

import pytest
import torch

from tests.unit.parallel._dist import run_ranks
from zoo.engine.state import fp32_grad_norm
from zoo.parallel.topology import Layout, build_grid


def _param(value: float, size: int, **flags) -> torch.nn.Parameter:
    p = torch.nn.Parameter(torch.zeros(size))
    p.grad = torch.full((size,), value)
    for name, flag in flags.items():
        setattr(p, name, flag)
    return p


def _pipeline(grid) -> None:
    stage = grid.get_stage_id()
    params = [_param(1.0 + stage, 4)]  # stage 0: four 1s, stage 1: four 2s
    if stage == 1:
        params.append(_param(3.0, 2, ds_pipe_replicated=True))  # the tied embedding's copy: stage 0 counts it
    else:
        params.append(_param(3.0, 2))
    expected = (4 * 1.0 + 4 * 4.0 + 2 * 9.0) ** 0.5
    assert fp32_grad_norm(params, grid).item() == pytest.approx(expected)


def _tensor_parallel(grid) -> None:
    tp_rank = grid.get_slice_parallel_rank()
    replicated = _param(2.0, 3)  # whole on both tp ranks
    shard = _param(1.0 + tp_rank, 5, tensor_model_parallel=True)
    expected = (3 * 4.0 + 5 * 1.0 + 5 * 4.0) ** 0.5
    assert fp32_grad_norm([replicated, shard], grid).item() == pytest.approx(expected)


def _every_layout(rank: int, world: int) -> None:
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    _pipeline(build_grid(Layout(tp=1, pp=2, dp=2)))
    _pipeline(build_grid(Layout(tp=1, pp=2, dp=1, cp=2)))
    _tensor_parallel(build_grid(Layout(tp=2, pp=1, dp=2)))


def test_every_stage_counts_once_a_replica_once_and_a_shard_on_every_rank():
    """On 4 ranks: pp2 x dp2, cp2 x pp2 and tp2 x dp2."""
    run_ranks(4, _every_layout)
