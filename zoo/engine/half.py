"""fp16 on a CPU: DeepSpeed's real fp16 paths (its FP16 optimizer at ZeRO-0, the ZeRO-1/2/3
fp16 paths, the pipeline engine's), with dynamic loss scaling, on gloo.

DeepSpeed's CPU accelerator reports fp16 as supported only where oneDNN has native fp16
kernels (`torch.ops.mkldnn._is_mkldnn_fp16_supported()`: AVX512-FP16), and its engine then
refuses fp16. Yet torch computes float16 on any CPU (its kernels convert through float32).
So a one-time probe checks that torch computes fp16 here (a matmul, a backward and an
overflow to inf, as the scaler needs) and, where it does, the accelerator is told fp16 is
supported. On CUDA nothing changes.
"""
from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def cpu_computes_fp16() -> bool:
    """torch computes float16 on this CPU: a matmul close to its float32 value, its backward,
    and an overflow that gives inf (what the dynamic loss scaler detects)."""
    try:
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)
        half = a.half().requires_grad_()
        out = half @ b.half()
        out.sum().backward()
        big = torch.full((2,), 60000.0, dtype=torch.float16) * 2
        return (out.dtype == torch.float16 and half.grad is not None and half.grad.dtype == torch.float16
                and torch.allclose(out.float(), a @ b, rtol=2e-2, atol=5e-2) and bool(torch.isinf(big).all()))
    except (RuntimeError, NotImplementedError):
        return False


def enable_on_cpu() -> bool:
    """Tell DeepSpeed's CPU accelerator that fp16 is supported, where the probe shows torch
    computes it here; True where fp16 can run (on CUDA, always)."""
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    if accelerator.device_name() != "cpu":
        return True
    if not cpu_computes_fp16():
        return False
    if not accelerator.is_fp16_supported():
        accelerator.is_fp16_supported = lambda: True
        accelerator.supported_dtypes = lambda: [torch.float, torch.bfloat16, torch.float16]
    return True


def undo_unfused_init_step(engine) -> bool:
    """DeepSpeed's fp16 optimizer for an unfused torch optimizer (ZeRO-0 with zoo's AdamW or
    SGD; on a GPU too) takes one real optimizer step with zero gradients when it is built
    (`initialize_optimizer_states`): AdamW's decoupled weight decay shrinks every fp32 master
    weight once and its step count starts at 1, so every later bias correction is one step
    off (the first real update ~0.7x the learning rate; measured: the tiny GPT's loss 4.4%
    above fp32's after 20 steps). Undone here: each fp32 master is restored from its fp16
    parameter (of which it was a copy) and the optimizer's state is cleared, so the first real
    step is the optimizer's first. True where it undid it."""
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    opt = engine.optimizer
    if not isinstance(opt, FP16_UnfusedOptimizer):
        return False
    with torch.no_grad():
        for masters, halves in zip(opt.fp32_groups, opt.fp16_groups):
            for master, half_param in zip(masters, halves):
                master.copy_(half_param.float())
                opt.optimizer.state.pop(master, None)
    return True


def scale_zero0_loss(engine) -> bool:
    """DeepSpeed 0.19.8's `engine.backward` scales the loss only for its ZeRO optimizers
    (`scale_if_loss`) and torch autocast's GradScaler; its ZeRO-0 fp16 optimizers
    (FP16_UnfusedOptimizer, FP16_Optimizer) still divide the gradients by the loss scale at
    their step and read the gradient norm as a scaled one. Left so, the gradients reach the
    optimizer 2**initial_scale_power too small (AdamW's eps then damps the updates), clipping
    never fires, and small gradients underflow unscaled. Here the loss is scaled by the
    optimizer's current scale before that backward, as those optimizers' own `backward` does;
    the scale the gradients carry is kept for grad_norm. The pipeline engine calls the
    class's backward itself: validation refuses fp16 with pp at ZeRO-0. True where scaled."""
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    opt = engine.optimizer
    if not isinstance(opt, (FP16_UnfusedOptimizer, FP16_Optimizer)):
        return False
    original = engine.backward

    def backward(loss, *args, **kwargs):
        opt.zoo_gradient_scale = float(opt.loss_scale)
        return original(loss.float() * opt.zoo_gradient_scale, *args, **kwargs)

    engine.backward = backward
    return True


def unscaled_grad_norm(engine, norm):
    """The gradient norm DeepSpeed keeps, unscaled where it is a scaled one (scale_zero0_loss)."""
    scale = getattr(engine.optimizer, "zoo_gradient_scale", None)
    return norm / scale if norm is not None and scale else norm
