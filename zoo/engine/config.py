"""The DeepSpeed config, generated in one place from the zoo config, and the engine.

DeepSpeed supplies data parallelism and ZeRO 0-3, gradient accumulation and clipping,
AdamW (plain torch AdamW: `torch_adam`), warmup + cosine, bf16 and fp16 with dynamic loss
scaling. Raw keys under the config's `deepspeed:` node are merged over the result verbatim.
"""
from __future__ import annotations

import copy
from typing import Any, Dict, List

import torch.nn as nn

from zoo.config.schema import Config
from zoo.parallel.topology import Layout


def micro_batching(cfg: Config, layout: Layout) -> tuple[int, int]:
    """(micro-batch size, micro-batches per rank per step). The global batch is what the
    user fixes; changing the layout changes the accumulation, never the maths.

    Without pipeline parallelism the micro-batch is `trainer.micro_batch_size`. With pp > 1
    the pipeline needs several micro-batches in flight: `parallel.num_microbatches`, by
    default 3 x pp, and the micro-batch is global / (dp x that)."""
    t, p = cfg.trainer, cfg.parallel
    count = p.num_microbatches or (3 * layout.pp if layout.pp > 1 else None)
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
    micro, accum = micro_batching(cfg, layout)
    ds: Dict[str, Any] = {
        "train_batch_size": t.global_batch_size,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "gradient_clipping": o.grad_clip,
        "optimizer": optimizer_config(cfg),
        "zero_optimization": {"stage": layout.zero_stage},
        "bf16": {"enabled": prec.dtype == "bf16"},
        "fp16": {"enabled": prec.dtype == "fp16", "loss_scale": 0,
                 "initial_scale_power": prec.initial_scale_power, "loss_scale_window": prec.loss_scale_window},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if cfg.optim.name == "sgd":  # ZeRO partitions any torch optimizer; DeepSpeed asks to be told (its tests cover Adam)
        ds["zero_allow_untested_optimizer"] = True
    if layout.pp > 1:
        ds["pipeline"] = {"activation_checkpoint_interval": 1 if cfg.model.activation_checkpointing else 0}
    return _deep_merge(ds, dict(cfg.deepspeed))


def optimizer_config(cfg: Config) -> Dict[str, Any]:
    """DeepSpeed's optimizer block: torch's AdamW (`torch_adam`), or torch's SGD (DeepSpeed
    builds any torch.optim class its config names)."""
    o = cfg.optim
    if o.name == "sgd":
        return {"type": "SGD", "params": {"lr": o.lr, "momentum": o.momentum, "nesterov": o.nesterov,
                                          "weight_decay": o.weight_decay}}
    return {"type": "AdamW", "params": {"lr": o.lr, "betas": list(o.betas), "eps": o.eps,
                                        "weight_decay": o.weight_decay, "torch_adam": True}}


def param_groups(model: nn.Module, weight_decay: float) -> List[Dict[str, Any]]:
    """Decay matrices only; biases, norms and position tables are not decayed."""
    decay, no_decay, seen = [], [], set()
    for name, p in model.named_parameters():
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 and "wpe" not in name else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def initialize_engine(model: nn.Module, cfg: Config, layout: Layout, grid):
    """Wrap `model` in a DeepSpeed engine over the grid's data-parallel groups (a
    PipelineModule brings its own grid and gets DeepSpeed's pipeline engine). The optimizer
    DeepSpeed would build from zoo's block is built here as zoo.optimizers' subclass of it,
    which imports no torch._dynamo in an eager run."""
    import deepspeed
    from deepspeed.pipe import PipelineModule

    ds, groups = deepspeed_config(cfg, layout), param_groups(model, cfg.optim.weight_decay)
    optimizer = None
    if ds.get("optimizer") == optimizer_config(cfg):  # zoo's own block (no raw deepspeed.optimizer over it)
        from zoo.optimizers import build

        optimizer, ds = build(ds["optimizer"], groups), {k: v for k, v in ds.items() if k != "optimizer"}
    engine, _, _, _ = deepspeed.initialize(model=model, config=ds, optimizer=optimizer,
                                           model_parameters=groups,
                                           lr_scheduler=lr_scheduler(cfg),
                                           mpu=None if isinstance(model, PipelineModule) else grid)
    skip_single_replica_allreduce(engine, layout.dp)
    return engine


def skip_single_replica_allreduce(engine, dp: int) -> bool:
    """With one data-parallel replica, ZeRO-0 and fp32, DeepSpeed's gradient all-reduce is the
    identity done the long way: every gradient flattened into one buffer, scaled by 1/1,
    all-reduced over one rank and copied back (the tiny Llama's 20 MB each way, every step).
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


def schedule_steps(cfg: Config) -> int:
    """The schedule's length: optim.decay_steps, else trainer.max_steps (at least past the warmup)."""
    o = cfg.optim
    return max(o.decay_steps or cfg.trainer.max_steps, o.warmup_steps + 1, 2)


def lr_scheduler(cfg: Config):
    """optim.schedule's scheduler, for deepspeed.initialize (zoo.schedules)."""
    from zoo.schedules import make_scheduler

    o = cfg.optim
    return make_scheduler(o.schedule, warmup=o.warmup_steps, total=schedule_steps(cfg), min_ratio=o.min_lr / o.lr,
                          decay_fraction=o.decay_fraction)
