"""The planner's model-state bytes per rank against a real DeepSpeed engine, ZeRO stages 0-3.

Two gloo ranks on this CPU build zoo's tiny GPT with `zoo.parallel.build.build_model`, wrap it with
zoo's own engine config (fp32, torch AdamW and then torch SGD with momentum, dp=2, two
micro-batches per step) and take one step. Each rank measures the memory the engine holds, as the union of tensor storage
ranges so that a buffer shared by two roles counts once:
- params: the module's parameters (ZeRO-3: each parameter's `ds_tensor` partition);
- grads: the largest gradient storage after either micro-batch: `param.grad`, ZeRO-1/2's
  `averaged_gradients` partition, ZeRO-3's `grad_partitions_flat_buffer` (ZeRO-1 holds
  full gradients between micro-batches and reduces them at the step; ZeRO-2 reduces every
  micro-batch into its partition);
- optimizer: the fp32 master partition (a clone, even of fp32 parameters, at every ZeRO
  stage) and every state tensor of the torch optimizer except AdamW's scalar `step` (one
  0-d tensor per parameter tensor, not per element): AdamW's two moments, SGD's momentum buffer.

They equal the planner's bytes exactly once each Psi/dp partition is replaced by the padded
partition DeepSpeed really makes: ZeRO-1/2 pad each parameter group's flat buffer to a
multiple of 2*dp elements (nccl_start_alignment_factor 2 x dp); ZeRO-3 pads every
parameter to a multiple of dp. The model has an odd width so that both paddings occur.

Then four ranks check the per-rank parameter count Psi under model parallelism, with
ZeRO-1 over dp=2: tp=2 (zoo's tensor-parallel GPT: sharded weights / tp + replicated ones)
and pp=2 (zoo's DeepSpeed pipeline: each stage's layers, the embedding on the first, the
final norm and a tied copy of the embedding piece on the last).
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from zoo.config.schema import ModelConfig
from zoo.families.registry import family_of_shape as spec_of
from zoo.plan.describe import describe_model
from zoo.plan.memory import model_state_bytes, moment_bytes
from zoo.worker import leave_process_group

DP = 2
VOCAB = 250
OPTIMIZERS = ("adamw", "sgd")
MODEL = dict(family="gpt", size="tiny", n_layer=2, n_head=3, n_embd=33, block_size=16, vocab_size=VOCAB)


def _union_bytes(tensors) -> int:
    """Bytes covered by the tensors' storage ranges, each range once."""
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
                   for t in tensors if t is not None and t.numel() > 0)
    total, end = 0, -1
    for lo, hi in spans:
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total


def _grad_tensors(engine) -> list:
    opt = engine.optimizer
    out = [p.grad for p in engine.module.parameters()]
    averaged = getattr(opt, "averaged_gradients", None) or {}
    for group in averaged.values():
        out.extend(group or [])
    out.append(getattr(opt, "grad_partitions_flat_buffer", None))
    return out


def _measure(engine, stage: int, grads: int) -> dict:
    opt = engine.optimizer
    params = [p.ds_tensor if stage == 3 else p.data for p in engine.module.parameters()]
    base = opt.optimizer if stage > 0 else opt
    states = [t for s in base.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
    masters = list(getattr(opt, "single_partition_of_fp32_groups", [])) + list(
        getattr(opt, "fp32_partitioned_groups_flat", []))
    return {"params": _union_bytes(params), "grads": grads,
            "optimizer": _union_bytes(params + masters + states) - _union_bytes(params)}


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(DP), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    import deepspeed

    from zoo.config.schema import Config
    from zoo.engine import initialize_engine, lean_start
    from zoo.families.registry import model_dims
    from zoo.parallel.build import build_model
    from zoo.parallel.topology import Layout, build_grid

    lean_start.skip_shm_comm_op()  # as zoo's ranks start: no gcc build of DeepSpeed's shm op (~47 s fresh)
    lean_start.skip_muon_import({})
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    model_cfg = ModelConfig(**MODEL)
    shape = model_dims(model_cfg, VOCAB)
    cfg = Config(model=model_cfg)
    cfg.trainer.micro_batch_size, cfg.trainer.global_batch_size = 1, 2 * DP  # two micro-batches per step
    x = torch.randint(0, VOCAB, (1, shape.block_size), generator=torch.Generator().manual_seed(rank))
    for optimizer, stage in ((o, s) for o in OPTIMIZERS for s in range(4)):
        cfg.optim.name = optimizer
        layout = Layout(tp=1, pp=1, dp=DP, zero_stage=stage)
        engine = initialize_engine(build_model(spec_of(shape), shape, seed=0, device=torch.device("cpu")), cfg, layout, build_grid(layout))
        grads = 0
        for _ in range(2):
            engine.backward(engine(x, x))
            grads = max(grads, _union_bytes(_grad_tensors(engine)))
            engine.step()
        Path(out_dir, f"rank{rank}_{optimizer}_zero{stage}.json").write_text(json.dumps(_measure(engine, stage, grads)))
        del engine
    leave_process_group()


TP_PP_MODEL = dict(family="gpt", size="tiny", n_layer=2, n_head=2, n_embd=34, block_size=16, vocab_size=VOCAB)
TP_PP_LAYOUTS = ((2, 1), (1, 2))  # (tp, pp), each with dp=2 and ZeRO-1


def _worker_tp_pp(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="4", OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    import deepspeed

    from zoo.config.schema import Config
    from zoo.engine import initialize_engine, lean_start, param_groups
    from zoo.families.registry import model_dims
    from zoo.parallel.build import build, build_model
    from zoo.parallel.topology import Layout, build_grid, tp_group

    lean_start.skip_shm_comm_op()  # as zoo's ranks start: no gcc build of DeepSpeed's shm op (~47 s fresh)
    lean_start.skip_muon_import({})
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    model_cfg = ModelConfig(**TP_PP_MODEL)
    shape = model_dims(model_cfg, VOCAB)
    cfg = Config(model=model_cfg)
    cfg.trainer.micro_batch_size, cfg.trainer.global_batch_size = 1, 12  # pp=2: 3 x pp micro-batches of 1
    x = torch.randint(0, VOCAB, (1, shape.block_size), generator=torch.Generator().manual_seed(0))
    for tp, pp in TP_PP_LAYOUTS:
        layout = Layout(tp=tp, pp=pp, dp=2, zero_stage=1)
        grid = build_grid(layout)
        options = dict(seed=0, device=torch.device("cpu"), tp_group=tp_group(grid), sequence_parallel=False)
        if pp > 1:
            model = build(spec_of(shape), shape, layout, partition_method="parameters", activation_checkpointing=False, **options)
        else:
            model = build_model(spec_of(shape), shape, **options)
        groups = [[p.numel() for p in g["params"]] for g in param_groups(model, 0.1)]
        engine = initialize_engine(model, cfg, layout, grid)
        if pp > 1:
            engine.train_batch(iter([(x, x)] * 6))
        else:
            for _ in range(6):
                engine.backward(engine(x, x))
                engine.step()
        got = _measure(engine, 1, grads=0)
        got.update(stage=grid.get_stage_id(), groups=groups)
        Path(out_dir, f"rank{rank}_tp{tp}_pp{pp}.json").write_text(json.dumps(got))
        del engine
    leave_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("zero_states")
    mp.spawn(_worker, args=(_free_port(), str(out)), nprocs=DP, join=True)
    return {(r, o, s): json.loads((out / f"rank{r}_{o}_zero{s}.json").read_text())
            for r in range(DP) for o in OPTIMIZERS for s in range(4)}


def _group_numels():
    """Parameter numels of zoo's two AdamW groups (decayed matrices, the rest), tied weight once."""
    from zoo.engine import param_groups
    from zoo.families.registry import model_dims
    from zoo.models.gpt import GPT

    with torch.device("meta"):
        model = GPT(model_dims(ModelConfig(**MODEL), VOCAB))
    return [[p.numel() for p in g["params"]] for g in param_groups(model, 0.1)]


def padded_partition(groups, dp: int, stage: int) -> int:
    """Elements of one rank's partition as DeepSpeed pads it."""
    if stage == 3:
        return sum(-(-n // dp) for g in groups for n in g)
    align = 2 * dp
    return sum(-(-sum(g) // align) * align // dp for g in groups)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_model_state_bytes_equal_deepspeed_engine(measured, stage, optimizer):
    desc = describe_model(ModelConfig(**MODEL), VOCAB)
    groups = _group_numels()
    n = desc.num_params
    assert n == sum(map(sum, groups))
    planned = model_state_bytes(n, DP, stage, "fp32", moment_bytes(optimizer, 0.9))
    pad = padded_partition(groups, DP, stage)
    if stage >= 1:  # the model exercises the padding, which is under one element per tensor (Z3) or group (Z1/2)
        assert 0 < pad - n / DP < (sum(map(len, groups)) if stage == 3 else len(groups))
    partitioned = {"params": stage >= 3, "grads": stage >= 2, "optimizer": stage >= 1}
    for rank in range(DP):
        got = measured[(rank, optimizer, stage)]
        for key, split in partitioned.items():
            want = getattr(planned, key)
            if split:  # Psi/dp elements -> the padded partition
                want = want * pad / (n / DP)
            assert got[key] == pytest.approx(want, abs=0.5), (
                f"{optimizer} ZeRO-{stage} rank {rank} {key}: measured {got[key]} bytes, planner {getattr(planned, key):.1f} "
                f"(padded {want:.1f})")


@pytest.fixture(scope="module")
def measured_tp_pp(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp_pp_states")
    mp.spawn(_worker_tp_pp, args=(_free_port(), str(out)), nprocs=4, join=True)
    return {(r, tp, pp): json.loads((out / f"rank{r}_tp{tp}_pp{pp}.json").read_text())
            for r in range(4) for tp, pp in TP_PP_LAYOUTS}


@pytest.mark.parametrize("tp, pp", TP_PP_LAYOUTS)
def test_model_state_bytes_per_rank_under_tp_and_pp(measured_tp_pp, tp, pp):
    from zoo.plan.memory import stage_params

    desc = describe_model(ModelConfig(**TP_PP_MODEL), VOCAB)
    for rank in range(4):
        got = measured_tp_pp[(rank, tp, pp)]
        n = stage_params(desc, pp, got["stage"], tp)
        assert n == sum(map(sum, got["groups"])), f"rank {rank} (stage {got['stage']}) holds {got['groups']}"
        planned = model_state_bytes(n, 2, 1, "fp32")
        pad = padded_partition(got["groups"], 2, 1)
        assert got["params"] == planned.params
        assert got["optimizer"] == pytest.approx(planned.optimizer * pad / (n / 2), abs=0.5)
