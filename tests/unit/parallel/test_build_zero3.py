"""ZeRO-3 built partitioned (zoo.parallel.build.materialise_partitioned): piece by piece, each piece
partitioned over the data-parallel group before the next is allocated; the weights are the
layout-free initialisation's, equal to one process's whole model, for every family."""
from __future__ import annotations

import torch

from tests.unit.parallel._dist import run_ranks
from zoo.families.registry import family_of_shape as spec_of


def _shape(kind: str):
    from zoo.models.bert import bert_shape
    from zoo.models.cnn import cnn_shape
    from zoo.models.gpt import gpt_shape
    from zoo.models.llama import llama_shape

    return {"gpt": lambda: gpt_shape("tiny", 256, n_layer=2, block_size=16),
            "llama": lambda: llama_shape("tiny", 256, n_layer=2, block_size=16),
            "bert": lambda: bert_shape("tiny", 256, n_layer=2, block_size=16),
            "cnn": lambda: cnn_shape("tiny")}[kind]()


def _equal_to_one_process(rank: int, world: int, kinds) -> None:
    import os

    import deepspeed


    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    from zoo.engine import lean_start

    lean_start.skip_shm_comm_op()
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    for kind in kinds:
        _check(kind, world)


def _check(kind: str, world: int) -> None:
    import deepspeed
    import torch.distributed as dist

    from zoo.engine.state import is_zero3
    from zoo.parallel.build import ZeroThree, build_model

    shape = _shape(kind)
    config = {"train_batch_size": world, "zero_optimization": {"stage": 3}}
    zero3 = ZeroThree(config=config, group=dist.group.WORLD, dtype=torch.float32)
    parted = build_model(spec_of(shape), shape, seed=7, device=torch.device("cpu"), zero3=zero3)
    whole = build_model(spec_of(shape), shape, seed=7, device=torch.device("cpu"))
    params = dict(parted.named_parameters())
    assert params and all(is_zero3(p) for p in params.values())
    assert sum(p.ds_tensor.numel() for p in params.values()) <= sum(p.numel() for p in whole.parameters()) / world + 64
    for name, want in whole.named_parameters():
        with deepspeed.zero.GatheredParameters([params[name]]):
            assert torch.equal(params[name].data, want.data), name
    for (name, b), (_, want) in zip(parted.named_buffers(), whole.named_buffers()):
        assert torch.equal(b, want), name


def test_zero3_built_partitioned_equals_one_process():
    run_ranks(2, _equal_to_one_process, ["gpt", "llama", "bert", "cnn"])
