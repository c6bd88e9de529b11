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
