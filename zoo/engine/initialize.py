"""The DeepSpeed engine built over a (parallelized) model: zoo's optimizer, parameter groups
and learning-rate schedule handed to `deepspeed.initialize`."""
from __future__ import annotations

from typing import Any, Dict, List

import torch.nn as nn

from zoo.config.schema import Config, OptimConfig
from zoo.engine.config import deepspeed_config, optimizer_config, schedule_steps
from zoo.engine.state import full_shape
from zoo.parallel.topology import Layout


def param_groups(model: nn.Module, weight_decay: float) -> List[Dict[str, Any]]:
    """Decay matrices only; biases and norms are not decayed, nor the parameters of a module
    the model marks `decayed = False` (GPT's position table)."""
    kept = {id(p) for m in model.modules() if getattr(m, "decayed", True) is False for p in m.parameters()}
    decay, no_decay, seen = [], [], set()
    for p in model.parameters():
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        matrix = len(full_shape(p)) >= 2  # a ZeRO-3 parameter built partitioned is flat: its own shape
        (decay if matrix and id(p) not in kept else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def initialize_engine(model: nn.Module, cfg: Config, layout: Layout, grid):
    """Wrap `model` in a DeepSpeed engine over the grid's data-parallel groups (a
    PipelineModule brings its own grid and gets DeepSpeed's pipeline engine). The optimizer
    DeepSpeed would build from zoo's block is built here as zoo.engine.optimizers' subclass of it,
    which imports no torch._dynamo in an eager run."""
    import deepspeed
    from deepspeed.pipe import PipelineModule

    ds, groups = deepspeed_config(cfg, layout), param_groups(model, cfg.optim.weight_decay)
    optimizer = None
    if ds.get("optimizer") == optimizer_config(cfg.optim):  # zoo's own block (no raw deepspeed.optimizer over it)
        from zoo.engine.optimizers import build

        optimizer, ds = build(ds["optimizer"], groups), {k: v for k, v in ds.items() if k != "optimizer"}
    engine, _, _, _ = deepspeed.initialize(model=model, config=ds, optimizer=optimizer,
                                           model_parameters=groups,
                                           lr_scheduler=lr_scheduler(cfg.optim, cfg.trainer.max_steps),
                                           mpu=None if isinstance(model, PipelineModule) else grid)
    skip_single_replica_allreduce(engine, layout.dp * layout.cp)  # cp ranks sum their gradients too
    if layout.cp > 1 and isinstance(model, PipelineModule):
        pipeline_reduces_over_context(engine)
    if engine.fp16_enabled():  # DeepSpeed's ZeRO-0 fp16 optimizer, as its own docs say it works
        from zoo.engine.half import scale_zero0_loss, undo_unfused_init_step

        undo_unfused_init_step(engine)
        scale_zero0_loss(engine)
    return engine


def skip_single_replica_allreduce(engine, dp: int) -> bool:
    """With one data-parallel replica (`dp`: replicas x cp ranks, which sum theirs), ZeRO-0 and
    fp32, DeepSpeed's gradient all-reduce is the identity done the long way: every gradient
    flattened into one buffer, scaled by 1/1, all-reduced over one rank and copied back (the
    tiny Llama's 20 MB each way, every step).
    Switch it off there; a pipeline's tied-weight all-reduce across stages is a separate call
    and stays. True where it was switched off."""
    from deepspeed.runtime.pipe.engine import PipelineEngine

    if dp != 1 or engine.zero_optimization_stage() != 0 or engine.bfloat16_enabled() or engine.fp16_enabled():
        return False
    if isinstance(engine, PipelineEngine):
        engine.pipeline_enable_backward_allreduce = False
    else:
        engine.enable_backward_allreduce = False
    return True


def pipeline_reduces_over_context(engine) -> None:
    """DeepSpeed's pipeline engine reduces the gradients outside ZeRO's partitioning (fp32 and
    fp16 at ZeRO-0, bf16's optimizer) over its data-parallel group alone; under context
    parallelism each cp rank holds its share of a gradient, which must be summed over cp too:
    here they are reduced over dp x cp and averaged over dp, as DeepSpeed's engine without a
    pipeline does (its sequence-data-parallel branch). ZeRO-1's own reduction already
    partitions over dp x cp (zoo.parallel.context_grid)."""
    from deepspeed.runtime.engine import split_half_float_double_sparse

    grid = engine.grid
    group, replicas = grid.get_sequence_data_parallel_group(), grid.get_data_parallel_world_size()

    def reduce(grads, elements_per_buffer):
        sparse, dense = split_half_float_double_sparse(grads)
        if sparse:  # zoo's models have no sparse gradient (an nn.Embedding(sparse=True) would)
            raise NotImplementedError("sparse gradients under context parallelism with a pipeline")
        for _dtype, bucket in dense:
            engine.allreduce_no_retain(bucket, dp_group=group, numel_per_bucket=elements_per_buffer,
                                       dp_world_size=replicas)

    engine._reduce_non_expert_gradients = reduce


def lr_scheduler(o: OptimConfig, max_steps: int):
    """optim.schedule's scheduler over a run of `max_steps`, for deepspeed.initialize (zoo.engine.schedules)."""
    from zoo.engine.schedules import make_scheduler

    return make_scheduler(o.schedule, warmup=o.warmup_steps, total=schedule_steps(o, max_steps),
                          min_ratio=o.min_lr / o.lr, decay_fraction=o.decay_fraction)
