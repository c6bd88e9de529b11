"""The DeepSpeed config, generated in one place from the zoo config.

DeepSpeed supplies data parallelism and ZeRO 0-3, gradient accumulation and clipping,
AdamW (plain torch AdamW: `torch_adam`), warmup + cosine, bf16 and fp16 with dynamic loss
scaling. Raw keys under the config's `deepspeed:` node are merged over the result verbatim.
"""
from __future__ import annotations

import copy
from typing import Any, Dict

import torch

from zoo.config.schema import Config, OptimConfig, ParallelConfig, TrainerConfig
from zoo.parallel.topology import Layout

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}  # precision.dtype -> torch


def micro_batch_count(parallel, layout: Layout):
    """The micro-batches a step runs per rank when it is fixed by the layout: parallel.num_microbatches,
    by default 3 x pp under pipeline parallelism; None where trainer.micro_batch_size sets it."""
    return parallel.num_microbatches or (3 * layout.pp if layout.pp > 1 else None)


def micro_batching(t: TrainerConfig, parallel: ParallelConfig, layout: Layout) -> tuple[int, int]:
    """(micro-batch size, micro-batches per rank per step). The global batch is what the
    user fixes; changing the layout changes the accumulation, never the maths.

    Without pipeline parallelism the micro-batch is `trainer.micro_batch_size`. With pp > 1
    the pipeline needs several micro-batches in flight: `parallel.num_microbatches`, by
    default 3 x pp, and the micro-batch is global / (dp x that)."""
    count = micro_batch_count(parallel, layout)
    if count is None:
        return t.micro_batch_size, t.global_batch_size // (t.micro_batch_size * layout.dp)
    return t.global_batch_size // (count * layout.dp), count


def _deep_merge(base: Dict[str, Any], over: Dict[str, Any]) -> Dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def deepspeed_config(cfg: Config, layout: Layout) -> Dict[str, Any]:
    o, t, prec = cfg.optim, cfg.trainer, cfg.precision
    micro, accum = micro_batching(cfg.trainer, cfg.parallel, layout)
    ds: Dict[str, Any] = {
        "train_batch_size": t.global_batch_size,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "gradient_clipping": o.grad_clip,
        "optimizer": optimizer_config(cfg.optim),
        "zero_optimization": {"stage": layout.zero_stage},
        "bf16": {"enabled": prec.dtype == "bf16"},
        "fp16": {"enabled": prec.dtype == "fp16", "loss_scale": prec.loss_scale,
                 "initial_scale_power": prec.initial_scale_power, "loss_scale_window": prec.loss_scale_window,
                 "hysteresis": prec.hysteresis, "min_loss_scale": prec.min_loss_scale},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        # DeepSpeed's throughput timer (on by default) synchronizes the device at every forward
        # and step: CPU and GPU in lockstep. zoo times its windows itself (zoo.observe.monitor:
        # one synchronize per logged step on CUDA).
        "timers": {"throughput": {"enabled": False, "synchronized": False}},
    }
    if cfg.optim.name == "sgd":  # ZeRO partitions any torch optimizer; DeepSpeed asks to be told (its tests cover Adam)
        ds["zero_allow_untested_optimizer"] = True
    if layout.cp > 1 and layout.zero_stage == 3:
        # Gradients are summed over the cp group and averaged over dp (zoo.parallel.context_grid).
        # DeepSpeed 0.19's ZeRO-3 reduce-scatter path averages over dp x cp, ignoring the sequence-
        # parallel size its all-reduce path divides out (the gradient came out 1/cp of one
        # process's, measured): the all-reduce path (2x the reduce-scatter's bytes).
        ds["zero_optimization"]["reduce_scatter"] = False
    if layout.pp > 1:
        ds["pipeline"] = {"activation_checkpoint_interval": 1 if cfg.model.activation_checkpointing else 0}
        if cfg.parallel.sequence_parallel and layout.tp > 1:
            # DeepSpeed splits the activations a stage sends over the tp group and gathers them on
            # the next stage as if every tp rank held the same tensor; under sequence parallelism each
            # holds its own shard of the sequence (already 1/tp of it), which that would mix up.
            ds["pipeline"].update(pipe_partitioned=False, grad_partitioned=False)
    return _deep_merge(ds, dict(cfg.deepspeed))


def optimizer_config(o: OptimConfig) -> Dict[str, Any]:
    """DeepSpeed's optimizer block: torch's AdamW (`torch_adam`), or torch's SGD (DeepSpeed
    builds any torch.optim class its config names)."""
    if o.name == "sgd":
        return {"type": "SGD", "params": {"lr": o.lr, "momentum": o.momentum, "nesterov": o.nesterov,
                                          "weight_decay": o.weight_decay}}
    return {"type": "AdamW", "params": {"lr": o.lr, "betas": list(o.betas), "eps": o.eps,
                                        "weight_decay": o.weight_decay, "torch_adam": True}}


def schedule_steps(o: OptimConfig, max_steps: int) -> int:
    """The schedule's length: optim.decay_steps, else trainer.max_steps (at least past the warmup)."""
    return max(o.decay_steps or max_steps, o.warmup_steps + 1, 2)
