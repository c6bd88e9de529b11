"""The interface over a built DeepSpeed engine: what checkpoints, the monitor and the trainer
read and write of its state, whatever the ZeRO stage and precision.

DeepSpeed keeps a parameter's fp32 master value and optimizer state in different places by
stage: on the parameter's optimizer state (ZeRO-0, fp32), in flat fp32 partitions linked to
each parameter by a fragment mapping (ZeRO-1/2, the bf16 optimizer: `_hp_mapping`), or
partitioned with the parameter itself (ZeRO-3: `ds_id`, `ds_tensor`, `ds_shape`). The
functions here answer in the plain parameter's terms; every private name they rely on is
listed in zoo.engine.versions and checked against the installed DeepSpeed.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Iterable, Optional, Tuple

import torch
import torch.nn as nn

ADAM_KEYS = ("exp_avg", "exp_avg_sq")
_RELINKED: "weakref.WeakSet" = weakref.WeakSet()  # optimizers whose fragments ensure_optimizer_state linked


# -- where a parameter's state lives --------------------------------------------------------
def is_zero3(p: nn.Parameter) -> bool:
    """Partitioned with its parameter (ZeRO-3): the module's tensor is empty between gathers."""
    return hasattr(p, "ds_id")


def has_fp32_fragment(p: nn.Parameter) -> bool:
    """Its fp32 master value and optimizer state sit in a flat partition of the optimizer
    (ZeRO-1/2, the bf16 optimizer), this rank's fragment of it linked to the parameter."""
    return hasattr(p, "_hp_mapping")


def full_shape(p: nn.Parameter) -> torch.Size:
    """The shape of this rank's (tensor-parallel) parameter, also where ZeRO-3 partitioned it."""
    return p.ds_shape if is_zero3(p) else p.shape


def held(p: nn.Parameter) -> torch.Tensor:
    """What this rank holds of `p`'s values: its ZeRO-3 partition, else the parameter."""
    part = getattr(p, "ds_tensor", None)
    return p if part is None else part


def gathered(params: Iterable[nn.Parameter], modifier_rank: Optional[int] = None):
    """Inside, ZeRO-3-partitioned parameters hold their whole values (collective over the
    data-parallel group; `modifier_rank`: whose changes are kept); a no-op otherwise."""
    params = list(params)
    if any(is_zero3(p) for p in params):
        import deepspeed

        return deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank)
    return contextlib.nullcontext()


# -- the optimizer --------------------------------------------------------------------------
def base_optimizer(engine) -> torch.optim.Optimizer:
    """The torch optimizer inside DeepSpeed's wrapper (itself where there is none)."""
    opt = engine.optimizer
    return opt if isinstance(opt, torch.optim.Optimizer) and not hasattr(opt, "optimizer") else opt.optimizer


def state_keys(engine) -> Tuple[str, ...]:
    """The per-parameter optimizer state a checkpoint keeps: AdamW's two moments, or SGD's
    momentum buffer (none without momentum)."""
    base = base_optimizer(engine)
    if isinstance(base, torch.optim.SGD):
        return ("momentum_buffer",) if any(g.get("momentum", 0) for g in base.param_groups) else ()
    return ADAM_KEYS


def ensure_optimizer_state(engine) -> None:
    """Make the optimizer state readable and writable through the parameters.

    ZeRO optimizers and the bf16 optimizer create their state at the first step; some link each
    parameter to its fragment of it then; they link after the first parameter group's step,
    before the later groups have state, and never again. So: create any missing state and
    link all groups anew."""
    opt, base = engine.optimizer, base_optimizer(engine)
    if base is opt:  # no ZeRO, fp32: state is read per parameter, zeros where missing
        return
    # ZeRO-3 keeps its flat fp32 partitions outside the base optimizer's groups between steps.
    flats = getattr(opt, "fp32_partitioned_groups_flat", None) or [p for g in base.param_groups for p in g["params"]]
    keys, adam = state_keys(engine), not isinstance(base, torch.optim.SGD)
    created = False
    for flat in flats:
        state = base.state[flat]
        if adam and "step" not in state:
            state["step"], created = torch.tensor(0.0), True
        for key in keys:  # SGD's first step from a zero buffer equals its own start (buffer = grad)
            if key not in state:  # (not setdefault: its default, a zeroed copy of the partition, is built anyway)
                state[key], created = torch.zeros_like(flat), True
    # ZeRO-3 reads its flat state directly. The others' links are relinked once (DeepSpeed may
    # have linked before every group had state) and again only where state was just created:
    # relinking costs a third of a second at 60M parameters, every save.
    if hasattr(opt, "_lazy_init_hp_params_optimizer_state") and (created or opt not in _RELINKED):
        opt._hp_optimizer_states_linked = False
        opt._lazy_init_hp_params_optimizer_state()
        _RELINKED.add(opt)


def optimizer_step(engine) -> int:
    """The optimizer's step count (AdamW's bias correction; 0 for SGD or before a step)."""
    for state in base_optimizer(engine).state.values():
        if "step" in state:
            return int(state["step"])
    return 0


def set_optimizer_step(engine, step: int) -> None:
    for s in base_optimizer(engine).state.values():
        if "step" in s:
            s["step"] = torch.full_like(s["step"], step) if torch.is_tensor(s["step"]) else step


def _fp16_master(engine, p: nn.Parameter) -> Optional[torch.Tensor]:
    """The fp32 master of `p` where DeepSpeed's ZeRO-0 half-precision optimizer keeps one per
    parameter (FP16_UnfusedOptimizer, for fp16 and, since DeepSpeed 0.19, for bf16 too: its
    optimizer state is keyed by that master); None elsewhere."""
    masters = getattr(engine, "_zoo_fp16_masters", None)
    if masters is None:
        opt = engine.optimizer
        unfused = not engine.zero_optimization() and hasattr(opt, "fp16_groups") and hasattr(opt, "fp32_groups")
        pairs = zip(opt.fp16_groups, opt.fp32_groups) if unfused else ()
        masters = {id(half): master for halves, fp32s in pairs for half, master in zip(halves, fp32s)}
        engine._zoo_fp16_masters = masters
    return masters.get(id(p))


# -- a parameter's full values --------------------------------------------------------------
@torch.no_grad()
def set_values(engine, p: nn.Parameter, weight: torch.Tensor, moments: dict, step: int) -> None:
    """Set `p`'s fp32 master value (and the model's copy, in its dtype) and its optimizer
    state (`moments`: key -> this rank's tensor-parallel value; `step`: the optimizer step,
    where the state is the parameter's own). Collective under ZeRO-3."""
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

    if is_zero3(p) or has_fp32_fragment(p):
        safe_set_full_fp32_param(p, weight)
        for key, value in moments.items():
            safe_set_full_optimizer_state(p, value, key)
        with gathered([p], modifier_rank=0):
            p.data.copy_(weight.to(p.dtype))
        return
    p.data.copy_(weight.to(p.dtype))
    master = _fp16_master(engine, p)
    if master is not None:
        master.data.copy_(weight)
    base = base_optimizer(engine)
    own_step = {} if isinstance(base, torch.optim.SGD) else {"step": torch.tensor(float(step))}
    base.state[p if master is None else master] = {**own_step, **moments}


# -- this rank's share, in place ---------------------------------------------------------
def held_range(p: nn.Parameter) -> Tuple[int, int, bool]:
    """(start, numel, replicated): the flat range of this rank's (tensor-parallel) `p` whose
    fp32 master value and optimizer state this rank holds: its ZeRO-3 partition, its ZeRO-1/2
    or bf16 fragment (possibly empty), or all of it; `replicated`: every data-parallel rank
    holds that same range (nothing partitions it)."""
    n = full_shape(p).numel()
    if is_zero3(p):
        import torch.distributed as dist

        part = p.ds_tensor.ds_numel
        start = part * dist.get_rank(group=p.ds_process_group)
        return start, max(0, min(n - start, part)), False
    if has_fp32_fragment(p):
        address = None if p._hp_mapping is None else p._hp_mapping.lp_fragment_address
        return (0, 0, False) if address is None else (address.start, address.numel, False)
    return 0, n, True


def fp32_held(engine, p: nn.Parameter) -> torch.Tensor:
    """The fp32 master value of held_range(p), flat: DeepSpeed's own storage (writable)."""
    start, numel, _ = held_range(p)
    if is_zero3(p):
        from deepspeed.utils import safe_get_local_fp32_param

        return safe_get_local_fp32_param(p).reshape(-1).narrow(0, 0, numel)
    if has_fp32_fragment(p):
        return p._hp_mapping.get_hp_fragment() if p._hp_mapping is not None else torch.empty(0)
    master = _fp16_master(engine, p)
    return (p if master is None else master).data.view(-1)


def optimizer_held(engine, p: nn.Parameter, key: str, step: int = 0) -> torch.Tensor:
    """Optimizer state `key` of held_range(p), flat: DeepSpeed's own storage (writable); where
    the optimizer keeps it per parameter and has none yet, zeros are created (with `step`)."""
    start, numel, _ = held_range(p)
    if is_zero3(p):
        from deepspeed.utils import safe_get_local_optimizer_state

        return safe_get_local_optimizer_state(p, key).reshape(-1).narrow(0, 0, numel)
    if has_fp32_fragment(p):
        return p._hp_mapping.get_optim_state_fragment(key) if p._hp_mapping is not None else torch.empty(0)
    base = base_optimizer(engine)
    master = _fp16_master(engine, p)
    state = base.state[p if master is None else master]
    if not isinstance(base, torch.optim.SGD) and "step" not in state:
        state["step"] = torch.tensor(float(step))
    if state.get(key) is None:
        state[key] = torch.zeros_like(p, dtype=torch.float32)
    return state[key].view(-1)


def model_held(p: nn.Parameter) -> Tuple[int, torch.Tensor]:
    """(start, flat tensor): what the model itself holds of `p` (its ZeRO-3 partition, else all
    of it), in the model's dtype: where a load writes the weights the forward uses."""
    if is_zero3(p):
        start, numel, _ = held_range(p)
        return start, p.ds_tensor.data.view(-1).narrow(0, 0, numel)
    return 0, p.data.view(-1)


# -- precision and gradients ----------------------------------------------------------------
def loss_scale(engine) -> Optional[float]:
    """The dynamic loss scale of an fp16 engine (DeepSpeed's optimizers name it differently)."""
    if not engine.fp16_enabled():
        return None
    opt = engine.optimizer
    for attr in ("cur_scale", "loss_scale"):
        value = getattr(opt, attr, None)
        if value is not None:
            return float(value)
    return None


def set_loss_scale(engine, value: Optional[float]) -> None:
    if value is not None and hasattr(engine.optimizer, "cur_scale"):
        engine.optimizer.cur_scale = value


def saved_loss_scale(engine) -> Optional[float]:
    """What a checkpoint records of the loss scale: the optimizer's, where it has one."""
    return getattr(engine.optimizer, "cur_scale", None)


SCALER_FIELDS = ("cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis")


def _scaler(engine):
    """The object holding an fp16 engine's loss-scaler state: the ZeRO optimizers' `loss_scaler`,
    the fp16 optimizers' (ZeRO-0) `loss_scale_config`; None without fp16."""
    if not engine.fp16_enabled():
        return None
    opt = engine.optimizer
    return getattr(opt, "loss_scaler", None) or getattr(opt, "loss_scale_config", None)


def scaler_state(engine) -> Optional[dict]:
    """The dynamic loss scaler's whole state between steps: the scale, the iteration count,
    the last overflow's iteration and the hysteresis left (ZeRO's scaler only); None without fp16."""
    scaler = _scaler(engine)
    if scaler is None:
        return None
    return {f: getattr(scaler, f) for f in SCALER_FIELDS if getattr(scaler, f, None) is not None}


def set_scaler_state(engine, state: dict) -> None:
    """Restore scaler_state's fields this engine's scaler has (a ZeRO-0 fp16 optimizer keeps
    no hysteresis: a checkpoint's is dropped there, and one without it leaves the configured)."""
    scaler = _scaler(engine)
    for field, value in state.items():
        if scaler is not None and field in SCALER_FIELDS and hasattr(scaler, field):
            setattr(scaler, field, value)


def skipped_steps(engine) -> int:
    """Optimizer steps the engine skipped (fp16: a gradient overflowed)."""
    return int(getattr(engine, "skipped_steps", 0))


def set_skipped_steps(engine, count: int) -> None:
    engine.skipped_steps = count


def grad_norm(engine) -> Optional[float]:
    """The last step's global gradient norm (unscaled also where DeepSpeed keeps a scaled one)."""
    from zoo.engine.half import unscaled_grad_norm

    return unscaled_grad_norm(engine, engine.get_global_grad_norm())


def keep_fp32_grad_norm(engine) -> None:
    """DeepSpeed computes the gradient norm when it clips fp32 gradients without ZeRO, but
    keeps it only on its other paths; and its `clip_grad_norm_` counts a parameter that is not
    tensor-parallel on the model-parallel group's first rank only, which under a pipeline is
    the first stage: the later stages' parameters were left out (the tiny GPT at pp2, ZeRO-0:
    a norm of 2.17 where one process has 2.70), and the clipping scaled by it. Here the norm
    is counted as its other paths count it (`fp32_grad_norm`), clipped as it clips, and kept
    for get_global_grad_norm."""
    if engine.fp16_enabled() or engine.bfloat16_enabled() or engine.zero_optimization():
        return

    def clip_fp32_gradients():
        params = [p for p in engine.module.parameters() if p.grad is not None]
        norm = fp32_grad_norm(params, engine.mpu)
        coefficient = torch.clamp(engine.gradient_clipping() / (norm + 1e-6), max=1.0)
        for p in params:
            p.grad.mul_(coefficient)
        engine._global_grad_norm = norm

    engine.clip_fp32_gradients = clip_fp32_gradients


def fp32_grad_norm(params, mpu) -> torch.Tensor:
    """The global L2 norm of the gradients of `params` (all with one): every pipeline stage's
    and tensor-parallel shard's, summed over `mpu`'s model-parallel group; a parameter each
    tensor-parallel rank holds whole counted once (on the first), a tied weight's copy on a
    later stage (DeepSpeed's `ds_pipe_replicated`) not at all."""
    import torch.distributed as dist
    from deepspeed.runtime.utils import is_model_parallel_parameter
    from deepspeed.utils.bwc import bwc_tensor_model_parallel_rank

    first = bwc_tensor_model_parallel_rank(mpu) == 0
    squares = [p.grad.detach().float().pow(2).sum() for p in params
               if not getattr(p, "ds_pipe_replicated", False) and (first or is_model_parallel_parameter(p))]
    device = params[0].grad.device if params else torch.device("cpu")
    total = torch.stack(squares).sum() if squares else torch.zeros((), device=device)
    if mpu is not None:
        dist.all_reduce(total, group=mpu.get_model_parallel_group())
    return total.sqrt()


def before_next_optimizer_step(engine, fn) -> None:
    """Call `fn` right before the optimizer's next step, whoever calls it (the trainer, the
    pipeline engine's schedule, a step of gradient accumulation's boundary): what must finish
    before the fp32 weights and optimizer state change (an asynchronous save's staging copy).
    The optimizer's `step` is wrapped once per optimizer; `fn` runs once."""
    opt = engine.optimizer
    waiting = opt.__dict__.setdefault("_zoo_before_step", [])
    if "step" not in opt.__dict__:  # not yet wrapped (an instance attribute over the class's method)
        original = opt.step

        def step(*args, **kwargs):
            while waiting:
                waiting.pop(0)()
            return original(*args, **kwargs)

        opt.step = step
    waiting.append(fn)


def set_global_steps(engine, step: int) -> None:
    """The engine's own step counter (its logging and pipeline schedule read it)."""
    engine.global_steps = step
