"""FLOPs and peaks for MFU: model FLOPs per token of a transformer (PaLM appendix B,
nanoGPT's estimate_mfu: 6N + 12*L*H*Q*T), of any model by one counted forward pass
(torch's FlopCounterMode, x3 for forward and backward), and the device's peak: NVIDIA's data
sheets for CUDA (dense), on CPU a matmul timed once per machine and cached."""
from __future__ import annotations

import json
import math
import os
import platform
import time
from pathlib import Path
from typing import Optional

import torch

# Dense peak TFLOP/s per GPU: (bf16/fp16, tf32, fp32), from NVIDIA's data sheets (sparsity halved away).
PEAK_TFLOPS = {
    "A100": (312.0, 156.0, 19.5),
    "H100 PCIe": (756.0, 378.0, 51.0),
    "H100 NVL": (835.0, 418.0, 60.0),
    "H100": (989.0, 495.0, 67.0),  # SXM
    "H200 NVL": (835.0, 418.0, 60.0),
    "H200": (989.0, 495.0, 67.0),  # SXM
}


def transformer_flops_per_token(params: int, n_layer: int, n_embd: int, block_size: int, seq_len: int) -> float:
    """6N + 12*L*H*Q*T (H*Q = n_embd); N excludes the position table, which does no matmul."""
    return 6 * (params - block_size * n_embd) + 12 * n_layer * n_embd * seq_len


def forward_flops(model: torch.nn.Module, sample: torch.Tensor) -> float:
    """FLOPs of one forward pass over `sample`, counted on the meta device (no memory, no time)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(sample)
    return float(counter.get_total_flops())


def model_flops_per_sample(task) -> tuple[Optional[float], str]:
    """(training FLOPs, forward + backward, of one sample; how they were counted), as the
    task's family counts them (`FamilySpec.flops_per_sample`)."""
    return task.spec.flops_per_sample(task)


def counted_flops_per_sample(task) -> tuple[Optional[float], str]:
    """3 x one forward pass of the plain model over one training sample, counted on the meta device."""
    import numpy as np

    x, _ = task.collate("train", np.zeros(1, dtype=np.int64))
    from zoo.models.meta import on_meta

    with on_meta():
        model = task.plain_model()
    return 3 * forward_flops(model, x.to("meta")), "3 x one forward pass, counted"


def measured_matmul_flops(dtype: torch.dtype) -> float:
    """FLOP/s of a square matmul with this process's threads: grown until one takes >= 20 ms,
    then the best of five (so that a moment of contention does not lower the peak)."""
    n = 256
    own = torch.Generator().manual_seed(0)  # never the global one: it seeds the run's dropout
    while True:
        a, b = (torch.randn(n, n, generator=own).to(dtype) for _ in range(2))
        a @ b  # warm-up
        t0 = time.perf_counter()
        a @ b
        if time.perf_counter() - t0 >= 0.02 or n >= 4096:
            break
        n *= 2
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cached_cpu_peak_flops(dtype: str, cache_dir: Optional[str] = None) -> tuple[float, str]:
    """The CPU matmul peak for `dtype` at this process's threads, measured once per machine
    (CPU model, threads, dtype, torch version) and kept in CACHE/cpu_peak_flops.json: timed at
    every start it moved up to 2x between runs, and cost ~1 s. Delete the file to measure again."""
    from data_pipelines.cache import cache_root

    threads = torch.get_num_threads()
    path = cache_root(cache_dir) / "cpu_peak_flops.json"
    key = f"{_cpu_model()} | {threads} thread(s) | {dtype} | torch {torch.__version__}"
    try:
        table = json.loads(path.read_text())
        if not isinstance(table, dict):
            table = {}
    except (OSError, ValueError):
        table = {}
    how = f"measured {dtype} matmul, {threads} thread(s)"
    if isinstance(table.get(key), (int, float)) and table[key] > 0:
        return float(table[key]), f"{how}, cached in {path}"
    from zoo.engine.config import TORCH_DTYPES

    torch_dtype = TORCH_DTYPES.get(dtype, torch.float32)
    peak = measured_matmul_flops(torch_dtype)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**table, key: peak}, indent=1))
        os.replace(tmp, path)
    except OSError:  # a read-only cache: measured at every start instead
        pass
    return peak, how


def device_peak_flops(device: torch.device, dtype: str, cache_dir: Optional[str] = None) -> tuple[Optional[float], str]:
    """(peak FLOP/s of one device for `dtype`, where the number comes from)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, (half, tf32, fp32) in PEAK_TFLOPS.items():  # the specific variants come first
            if all(part in name for part in key.split()):
                if dtype in ("bf16", "fp16"):
                    return half * 1e12, f"{key} dense {dtype}"
                if torch.backends.cuda.matmul.allow_tf32:
                    return tf32 * 1e12, f"{key} tf32"
                return fp32 * 1e12, f"{key} fp32"
        return None, f"no peak known for {name}"
    peak, how = cached_cpu_peak_flops(dtype, cache_dir)
    if dtype != "fp32":  # a CPU without native bf16/fp16 units emulates them, slower than fp32
        fp32, fp32_how = cached_cpu_peak_flops("fp32", cache_dir)
        if fp32 > peak:
            return fp32, (f"{fp32_how}: a {dtype} matmul measured slower here ({peak / 1e12:.3g} TFLOP/s), "
                          f"so the fp32 rate is the device's peak")
    return peak, how


def cpu_fp16_note(dtype: str, cache_dir: Optional[str] = None) -> Optional[str]:
    """precision=fp16 on a CPU: one line with the measured matmul rates of fp16, fp32 and bf16
    here (cached as the peak is) and the choice to make; None for other precisions. A CPU
    computes fp16 without native units, and DeepSpeed's fp16 path adds loss scaling: a
    30-step run of the default model went at 978 tokens/s against fp32's 5,418."""
    if dtype != "fp16":
        return None
    rate = {d: cached_cpu_peak_flops(d, cache_dir)[0] / 1e12 for d in ("fp16", "fp32", "bf16")}
    fast, other = ("bf16", "fp32") if rate["bf16"] >= rate["fp32"] else ("fp32", "bf16")  # as measured here
    return (f"precision=fp16 on a CPU: an fp16 matmul runs at {rate['fp16']:.3g} TFLOP/s here against fp32's "
            f"{rate['fp32']:.3g} and bf16's {rate['bf16']:.3g}, and fp16 adds loss scaling, so expect several times "
            f"fp32's step time; on a CPU use precision={fast} (or precision={other}); fp16 is for GPUs")
