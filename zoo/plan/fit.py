"""Will a chosen layout fit? The planner's memory estimate, for training to call at start.

    fits, mem = predict_fit(cfg.model, layout, micro_batch=8, dtype="bf16", device_mem_bytes=80e9)
    message = fit_warning(cfg, layout, device_memory_bytes(ranks_on_this_host))  # None when it fits
"""
from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Dict, Optional, Tuple

from zoo.config.schema import Config, ModelConfig
from zoo.plan.describe import describe_model
from zoo.plan.layout import PlanLayout
from zoo.plan.memory import ADAM_MOMENT_BYTES, layout_memory, moment_bytes

if TYPE_CHECKING:
    from zoo.parallel.topology import Layout

GPT2_VOCAB = 50257


def machine_costs(cpu_allocator: str = "auto", world: Optional[int] = None) -> Tuple[float, bool, list]:
    """(a rank's runtime bytes, resident_on_write, engine_bytes_per_param) of this machine's
    cluster preset (zoo.plan.settings.machine_preset), the ones parallel=auto plans with. A named
    layout's estimate (the dry run, the over-memory refusal, the out-of-memory line) counts them
    too: without them it charged a CPU rank DeepSpeed's whole 2 GB reduce bucket and left out
    the 0.32 GB runtime, where parallel=auto did neither. `cpu_allocator` (run.cpu_allocator)
    and the `world` of ranks: the malloc they will run on (zoo.run.allocator.planned)."""
    import torch

    from zoo.plan.settings import machine_preset
    from zoo.run.allocator import planned

    cuda = torch.cuda.is_available()
    preset = machine_preset(cuda, planned(cpu_allocator, cuda, world))
    return preset.runtime_gb * 1e9, preset.resident_on_write, preset.engine_bytes_per_param


def predict_fit(model_cfg: ModelConfig, layout: Layout, micro_batch: int, dtype: str, device_mem_bytes: float, *,
                grad_accum: int = 1, sequence_parallel: bool = False, vocab_size: int = GPT2_VOCAB,
                mem_fraction: float = 0.8, bucket_elems: int = 500_000_000,
                document_mask: bool = False, runtime_bytes: float = 0.0,
                resident_on_write: bool = False, engine_bytes_per_param=(),
                moments: int = ADAM_MOMENT_BYTES, builds_causal_masks: bool = False,
                cp_recompute: bool = True) -> Tuple[bool, Dict[str, int]]:
    """(fits, bytes per device) of training `model_cfg` with `layout` and this micro-batch.

    `fits` is total <= mem_fraction * device_mem_bytes. The dict has params, grads, optimizer,
    activations, buffers, total and limit (the usable bytes), and num_params (the model's count). `grad_accum` is the pipeline's
    micro-batches (how many are in flight); `vocab_size` the tokenizer's, padded as training pads it;
    `document_mask`: data.document_mask's attention mask counted (one per micro-batch in flight);
    `runtime_bytes`, `resident_on_write` and `engine_bytes_per_param`: the machine's (machine_costs());
    `moments`: the optimizer's state bytes a parameter (zoo.plan.memory.moment_bytes; AdamW's 8);
    `builds_causal_masks`: context parallelism's causal masks are built (not on CUDA);
    `cp_recompute`: parallel.cp_recompute.
    """
    if device_mem_bytes <= 0:
        raise ValueError(f"device_mem_bytes={device_mem_bytes} must be positive: the memory of one device")
    if micro_batch < 1 or grad_accum < 1:
        raise ValueError(f"micro_batch={micro_batch} and grad_accum={grad_accum} must be >= 1")
    desc = describe_model(model_cfg, vocab_size)
    lay = PlanLayout(tp=layout.tp, pp=layout.pp, dp=layout.dp, zero_stage=layout.zero_stage,
                     micro_batch_size=micro_batch, grad_accum=grad_accum,
                     activation_checkpointing=model_cfg.activation_checkpointing, cp=layout.cp)
    mem = layout_memory(desc, lay, dtype=dtype, sequence_parallel=sequence_parallel, bucket_elems=bucket_elems,
                        document_mask=document_mask, runtime_bytes=runtime_bytes, resident_on_write=resident_on_write,
                        engine_bytes_per_param=engine_bytes_per_param, moments=moments,
                        builds_causal_masks=builds_causal_masks, cp_recompute=cp_recompute)
    limit = mem_fraction * device_mem_bytes
    return mem.total <= limit, {**mem.as_dict(), "limit": int(limit), "num_params": desc.num_params}


def run_memory(cfg: Config, layout: Layout, device_mem_bytes: float, *, vocab_size: int = GPT2_VOCAB,
               mem_fraction: float = 0.8) -> Tuple[bool, Dict[str, int], int, int]:
    """(fits, bytes per device as predict_fit gives them, micro-batch, micro-batches in flight) of
    training `cfg` with `layout` as the engine will run it."""
    from zoo.engine import micro_batching

    if cfg.trainer.micro_batch_size == "auto":  # the finder picks it: warn when even 1 does not fit
        micro, accum = 1, 1
    else:
        micro, accum = micro_batching(cfg.trainer, cfg.parallel, layout)  # as the engine will run it (pp > 1: 3 x pp micro-batches)
    model = cfg.model
    if model.init_from:  # the imported model's dimensions (validation has read its config.json)
        from zoo.checkpoint.hf_weights import hf_meta
        from zoo.families.registry import family

        meta = hf_meta(model.init_from, family(model.family), model.vocab_pad_multiple)  # padded as imported
        keys = {f.name for f in dataclasses.fields(model)}
        model, vocab_size = dataclasses.replace(model, **{k: v for k, v in meta.items() if k in keys}), meta["vocab_size"]
    runtime, resident_on_write, engine = machine_costs(cfg.run.cpu_allocator, layout.world_size)
    fits, mem = predict_fit(model, layout, max(1, micro), cfg.precision.dtype, device_mem_bytes,
                            grad_accum=max(1, accum), sequence_parallel=cfg.parallel.sequence_parallel,
                            vocab_size=vocab_size, mem_fraction=mem_fraction,
                            document_mask=cfg.data.document_mask, runtime_bytes=runtime,
                            resident_on_write=resident_on_write, engine_bytes_per_param=engine,
                            moments=moment_bytes(cfg.optim.name, cfg.optim.momentum),
                            builds_causal_masks=not _cuda(), cp_recompute=cfg.parallel.cp_recompute)
    return fits, mem, micro, accum


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def fit_warning(cfg: Config, layout: Layout, device_mem_bytes: float, *, vocab_size: int = GPT2_VOCAB,
                mem_fraction: float = 0.8) -> Optional[str]:
    """A warning when training `cfg` with `layout` is predicted not to fit a device; None when it fits."""
    fits, mem, micro, accum = run_memory(cfg, layout, device_mem_bytes, vocab_size=vocab_size,
                                         mem_fraction=mem_fraction)
    if fits:
        return None
    parts = ", ".join(f"{k} {mem[k] / 1e9:.1f}" for k in ("params", "grads", "optimizer", "activations", "buffers",
                                                         "engine", "runtime"))
    return (f"predicted {mem['total'] / 1e9:.1f} GB per device ({parts}) is more than {mem_fraction:.0%} of the "
            f"{device_mem_bytes / 1e9:.1f} GB device ({mem['limit'] / 1e9:.1f} GB) for layout {layout.name} with "
            f"micro-batch {micro} x {accum}, precision={cfg.precision.dtype}, "
            f"model.activation_checkpointing={cfg.model.activation_checkpointing}; lower the micro-batch, turn on "
            f"activation checkpointing, raise parallel.zero_stage, or run `python -m zoo.plan` for a layout that fits")


def device_memory_bytes(ranks_on_host: int = 1) -> float:
    """Memory of one device: CUDA device 0's, or this host's RAM shared by its ranks on CPU."""
    import torch

    if torch.cuda.is_available():
        return float(torch.cuda.get_device_properties(0).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / max(1, ranks_on_host)
