"""`trainer.micro_batch_size=auto`: the largest micro-batch whose measured peak memory stays
within 80% of the device, and the gradient accumulation that reaches the global batch with it.

The candidates are the divisors of global batch / dp, so the accumulation is a whole number
and the global batch (the maths of the run) does not change. A probe is a real training step
of this run's model, layout, ZeRO stage and precision (forward, backward, optimizer step, twice:
the optimizer states appear at the first step), with the peak of CUDA's allocator taken over
all ranks. Activations grow linearly with the micro-batch, so the peaks at the two smallest
candidates give a line; the largest candidate the line puts within budget is then measured
too, and while a measured peak is over the budget the next smaller candidate is measured.
Probes are chosen under the budget by that line, so none is expected to run out of memory:
an out-of-memory error on one rank would leave the others waiting in a collective.
"""
from __future__ import annotations

import dataclasses
import gc
from dataclasses import dataclass
from typing import Callable, List, Tuple

import torch
import torch.distributed as dist

from zoo.run.errors import BatchFinderError

HEADROOM = 0.8  # the share of device memory a run may plan to use


@dataclass
class Trial:
    micro_batch: int
    peak_bytes: int


def candidates(global_batch: int, dp: int) -> List[int]:
    """Micro-batch sizes that divide the per-rank share of the global batch."""
    per_rank = global_batch // dp
    return [b for b in range(1, per_rank + 1) if per_rank % b == 0]


def search(sizes: List[int], probe: Callable[[int], int], budget: float) -> Tuple[int, List[Trial]]:
    """The largest of `sizes` (ascending) whose measured peak `probe(b)` is within `budget`."""
    trials: List[Trial] = []

    def measure(b: int) -> int:
        peak = probe(b)
        trials.append(Trial(b, peak))
        return peak

    first = measure(sizes[0])
    if first > budget:
        raise BatchFinderError(f"micro-batch {sizes[0]} already peaks at {first / 2**30:.2f} GiB, over the budget "
                               f"of {budget / 2**30:.2f} GiB ({HEADROOM:.0%} of the device); raise "
                               f"parallel.zero_stage or tp/pp, or turn on model.activation_checkpointing")
    if len(sizes) == 1:
        return sizes[0], trials
    second = measure(sizes[1])
    per_sample = max((second - first) / (sizes[1] - sizes[0]), 1.0)
    fixed = first - per_sample * sizes[0]
    fitting = [b for b in sizes if fixed + per_sample * b <= budget]
    best = max(b for b in fitting if b >= sizes[1]) if second <= budget else sizes[0]
    measured = {t.micro_batch: t.peak_bytes for t in trials}
    while True:
        peak = measured[best] if best in measured else measure(best)
        if peak <= budget or best == sizes[0]:
            return best, trials
        best = max(b for b in sizes if b < best)


def _probe(cfg, layout, grid, task, device) -> Callable[[int], int]:
    from zoo.engine import initialize_engine

    def probe(micro: int) -> int:
        global_batch = micro * layout.dp
        trial_cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(
            cfg.trainer, micro_batch_size=micro, global_batch_size=global_batch))
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        engine = initialize_engine(task.build_model(grid), trial_cfg, layout, grid)
        engine.train()
        dp_rank = grid.get_data_parallel_rank()
        for step in range(2):
            x, y = task.micro_batch(step * global_batch, 0, micro_batch=micro, global_batch=global_batch,
                                    dp_rank=dp_rank, dp_size=layout.dp)
            loss = engine(x.to(device), y.to(device))
            engine.backward(loss)
            engine.step()
        torch.cuda.synchronize(device)
        peak = torch.tensor(float(torch.cuda.max_memory_allocated(device)), device=device)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        engine.destroy()
        del engine, loss
        gc.collect()
        torch.cuda.empty_cache()
        return int(peak.item())

    return probe


def find_micro_batch_size(cfg, layout, grid, task, device: torch.device) -> Tuple[int, List[Trial], float]:
    """(micro-batch, trials, budget bytes) for this run on `device` (collective over all ranks)."""
    if device.type != "cuda":  # validation refuses auto without CUDA; this guards direct callers
        raise BatchFinderError("trainer.micro_batch_size=auto measures CUDA memory; this rank has no CUDA device")
    budget = HEADROOM * torch.cuda.get_device_properties(device).total_memory
    sizes = candidates(cfg.trainer.global_batch_size, layout.dp)
    best, trials = search(sizes, _probe(cfg, layout, grid, task, device), budget)
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)  # the run's reported peak is its own, not the probes'
    return best, trials, budget  # the probes drew from the RNG: the Trainer seeds it again


def describe(best: int, trials: List[Trial], budget: float, global_batch: int, dp: int) -> str:
    tried = ", ".join(f"{t.micro_batch}: {t.peak_bytes / 2**30:.2f} GiB" for t in trials)
    return (f"zoo: micro_batch_size=auto: {best} (peak memory measured per micro-batch: {tried}; budget "
            f"{budget / 2**30:.2f} GiB = {HEADROOM:.0%} of the device), accumulation "
            f"{global_batch // (best * dp)} for the global batch {global_batch}")
