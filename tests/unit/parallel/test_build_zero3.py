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


def _held_at_most_one_piece(rank: int, world: int) -> None:
    """tp2 x ZeRO-3 (each rank its own dp group of one, 2 ranks in all): whenever a piece is
    allocated, the rest of the model holds only meta tensors and partitions, so a rank never
    holds more than its partition and one piece (the tensor-parallel shards were allocated on
    the device for the whole model before the loop); each shard equals its slice of the tp=1 model."""
    import deepspeed
    import torch.distributed as dist

    from zoo.engine.state import held as partition_of
    from zoo.engine.state import is_zero3
    from zoo.parallel import build as build_module
    from zoo.parallel.build import ZeroThree, build_model

    shape = _shape("llama")
    own = [dist.new_group([r]) for r in range(world)][rank]  # the data-parallel group: this rank alone
    zero3 = ZeroThree(config={"train_batch_size": world, "zero_optimization": {"stage": 3}}, group=own,
                      dtype=torch.float32)
    model_holder, peaks = {}, []
    real_to_empty = build_module.to_empty

    def watched(unit, device):
        model = model_holder.get("model")
        if model is not None:  # what the whole model holds now, outside the piece about to be allocated
            inside = {id(p) for p in unit.parameters()}
            peaks.append(sum(p.numel() for p in model.parameters()
                             if id(p) not in inside and not p.is_meta and not is_zero3(p)))
        return real_to_empty(unit, device)

    real_parallelize = build_module.parallelize

    def remembered(module, **kwargs):
        model_holder["model"] = module
        return real_parallelize(module, **kwargs)

    build_module.to_empty, build_module.parallelize = watched, remembered
    try:
        parted = build_model(spec_of(shape), shape, seed=7, device=torch.device("cpu"), tp_group=dist.group.WORLD,
                             zero3=zero3)
    finally:
        build_module.to_empty, build_module.parallelize = real_to_empty, real_parallelize
    assert len(peaks) >= 5 and max(peaks) == 0, peaks  # embedding, 2 blocks, norm, head: one at a time
    from zoo.parallel.sharding import shard_rows

    whole = dict(build_model(spec_of(shape), shape, seed=7, device=torch.device("cpu")).named_parameters())  # tp=1
    for name, p in parted.named_parameters():
        spec, want = p.tp_shard if hasattr(p, "tp_shard") else None, whole[name].data
        if spec is not None:  # this rank's slice of the unsharded tensor
            want = torch.cat([want.narrow(spec.dim, a, b - a) for a, b in shard_rows(spec, want.shape[spec.dim])],
                             dim=spec.dim)
        with deepspeed.zero.GatheredParameters([p]):
            assert torch.equal(p.data, want), name
    assert any(hasattr(p, "tp_shard") for p in parted.parameters())  # the shards know where they sit
    assert sum(partition_of(p).numel() for p in parted.parameters()) > 0


def _tp2_zero3(rank: int, world: int) -> None:
    import os

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    from zoo.engine import lean_start

    lean_start.skip_shm_comm_op()
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    _held_at_most_one_piece(rank, world)


def test_zero3_with_tp2_is_built_piece_by_piece():
    run_ranks(2, _tp2_zero3)


def _import_reads_its_partition(rank: int, world: int, imports) -> None:
    """model.init_from under ZeRO-3 over dp=2: each rank reads from the files only its own
    partition of each of Llama's parameters (the bytes the reader takes from disk, counted), and
    the partitioned model gathers to the one-process import (Llama; GPT-2, whose Conv1D weights
    are stored transposed: a partition's rows are column bands of the file's tensor)."""
    import os

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    import deepspeed
    import torch.distributed as dist

    from zoo.checkpoint import sharded
    from zoo.checkpoint.hf_weights import read_hf
    from zoo.engine import lean_start
    from zoo.families.registry import family
    from zoo.parallel.build import ZeroThree, build_model

    lean_start.skip_shm_comm_op()
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    real_pread = sharded.ShardReader._pread
    zero3 = ZeroThree(config={"train_batch_size": world, "zero_optimization": {"stage": 3}}, group=dist.group.WORLD,
                      dtype=torch.float32)
    for name, hf_dir in imports:
        spec = family(name)
        meta, weights = read_hf(hf_dir, spec)
        shape = spec.shape_type(**meta)
        counted = [0]

        def pread(self, offset, nbytes, into=None):
            counted[0] += nbytes
            return real_pread(self, offset, nbytes, into)

        sharded.ShardReader._pread = pread
        try:
            parted = build_model(spec, shape, seed=7, device=torch.device("cpu"), zero3=zero3, weights=weights,
                                 init=False)
        finally:
            sharded.ShardReader._pread = real_pread
        whole = build_model(spec, shape, seed=7, device=torch.device("cpu"), weights=read_hf(hf_dir, spec)[1],
                            init=False)
        total = sum(p.numel() for p in whole.parameters())
        if name == "llama":  # its partition (+ DeepSpeed's padding), fp32 files: not the model
            assert counted[0] <= 4 * (total / world + 64), (counted[0], 4 * total)
        params = dict(parted.named_parameters())
        for pname, want in whole.named_parameters():
            with deepspeed.zero.GatheredParameters([params[pname]]):
                assert torch.equal(params[pname].data, want.data), (name, pname)


def test_zero3_import_reads_only_each_ranks_partition(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                 tie_word_embeddings=False)).save_pretrained(str(tmp_path / "llama"),
                                                                             safe_serialization=True)
    GPT2LMHeadModel(GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=32)).save_pretrained(
        str(tmp_path / "gpt2"), safe_serialization=True)
    run_ranks(2, _import_reads_its_partition, [("llama", str(tmp_path / "llama")), ("gpt", str(tmp_path / "gpt2"))])
