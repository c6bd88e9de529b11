"""The live monitor: every `trainer.log_every` steps, what the run achieves and where its
time goes, and a one-line diagnosis when a reading crosses a threshold.

Readings (metrics.jsonl keys): loss, lr, grad_norm, loss_scale, skipped_steps and
skipped_share (fp16: steps skipped on a gradient overflow so far, and their share), tokens_per_s,
samples_per_s, step_time_s, mfu, peak_mem_bytes, peak_mem_share, gpu_util (CUDA with NVML),
comm_share, data_wait_share, padding_efficiency, diagnosis.

- MFU = model FLOPs per second per device / the device's peak (zoo/observe/flops.py). Model FLOPs per token of a
  transformer (PaLM appendix B, nanoGPT's estimate_mfu): 6N + 12*L*H*Q*T, N the parameters
  without the position table, L layers, H heads of size Q, T the tokens attended; of a CNN:
  3x one forward pass counted by torch's FlopCounterMode (each family's spec says which). Peaks: the table below for CUDA (dense, no sparsity); on CPU a
  matmul timed once at start with this rank's threads.
- comm_share (zoo/observe/comm_timer.py): wall time inside torch.distributed calls (DeepSpeed's included: deepspeed.comm
  calls torch.distributed) and waiting on their handles, over the window's wall time; mean
  over ranks. On CUDA, timed with events on the issuing stream, overlapping calls merged: a
  collective overlapped with compute counts too.
- data_wait_share: time the step spent getting its micro-batches, max over ranks.
- peak memory: max over ranks; its share is of the GPU's memory, or on CPU of the host's RAM
  divided among the ranks on the host.
"""
from __future__ import annotations

import contextlib
import math
import os
import time
from typing import Dict, List, Optional

import torch
import torch.distributed as dist

from zoo.engine import state as engine_state
from zoo.observe.comm_timer import CommTimer
from zoo.observe.flops import cpu_fp16_note, device_peak_flops, model_flops_per_sample
from zoo.observe.metrics import peak_memory_bytes

# (reading, threshold, above?, what is likely wrong and what to try)
THRESHOLDS = [
    ("gpu_util", 0.60, False, "device utilization {v:.0%} < 60%: the GPU idles, likely waiting for data or for "
                              "slower ranks (load imbalance); check data_wait_share, balance the pipeline stages "
                              "(parallel.partition_method) or give each rank equal work"),
    ("comm_share", 0.20, True, "communication {v:.0%} of step time > 20% (collectives, and waiting in them for "
                               "slower ranks or pipeline stages): the layout communicates too much for this "
                               "topology; keep tp inside a node, lower tp, pp or dp, use more micro-batches per "
                               "step (parallel.num_microbatches, accumulation), or ask `python -m zoo.plan`"),
    ("peak_mem_share", 0.80, True, "peak memory {v:.0%} of the device > 80%: use a smaller trainer.micro_batch_size "
                                   "(more accumulation), model.activation_checkpointing=true or a higher "
                                   "parallel.zero_stage"),
    ("skipped_share", 0.05, True, "{v:.0%} of the steps so far were skipped on an fp16 gradient overflow > 5%: the "
                                  "loss scale keeps hitting fp16's range; use precision=bf16, a lower optim.lr or "
                                  "gradient clipping (optim.grad_clip)"),
    ("loss_scale", 2.0, False, "the fp16 loss scale collapsed to {v:g}: gradients overflow fp16 even barely "
                               "scaled (the run is diverging or fp16 cannot hold its values); use precision=bf16, "
                               "a lower optim.lr or gradient clipping (optim.grad_clip)"),
    ("data_wait_share", 0.05, True, "waiting for data {v:.0%} of step time > 5%: the loader is too slow; raise "
                                    "data.num_workers, pre-tokenize the data (`python -m data_pipelines.prepare`, "
                                    "data=prepared), use pinned memory (on with CUDA)"),
]


def device_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    import psutil

    return psutil.virtual_memory().total // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


# -- GPU utilization ----------------------------------------------------------------------------
class GpuUtilization:
    """Mean utilization of this rank's GPU since the last reading, from NVML's samples
    (nvidia-ml-py); `available` is False without CUDA or the package."""

    def __init__(self, device: torch.device):
        self.handle, self._since = None, 0
        if device.type != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            matching = [h for h in handles if uuid in str(pynvml.nvmlDeviceGetUUID(h))]
            self.handle = matching[0] if matching else handles[device.index or 0]
            self._nvml = pynvml
        except Exception:  # no package, no driver access (containers): the reading is absent
            self.handle = None

    @property
    def available(self) -> bool:
        return self.handle is not None

    def read(self) -> Optional[float]:
        if self.handle is None:
            return None
        nv = self._nvml
        try:
            _, samples = nv.nvmlDeviceGetSamples(self.handle, nv.NVML_GPU_UTILIZATION_SAMPLES, self._since)
            samples = [s for s in samples if s.timeStamp > self._since]
            if samples:
                self._since = max(s.timeStamp for s in samples)
                return sum(s.sampleValue.uiVal for s in samples) / len(samples) / 100
        except Exception:  # NVML_ERROR_NOT_FOUND when no new sample: the instantaneous reading
            pass
        try:
            return nv.nvmlDeviceGetUtilizationRates(self.handle).gpu / 100
        except Exception:
            return None


# -- the monitor ----------------------------------------------------------------------------------
def diagnose(record: dict, ignore: frozenset = frozenset()) -> Dict[str, str]:
    """{reading: the line saying what is likely wrong and what to try} for each reading of
    `record` (but those in `ignore`) over (or, for utilization, under) its threshold."""
    out = {}
    for key, limit, above, text in THRESHOLDS:
        value = None if key in ignore else record.get(key)
        if value is not None and (value > limit if above else value < limit):
            out[key] = text.format(v=value)
    return out


class Diagnoses:
    """Which diagnosis lines a window's record newly deserves. The first window holds the
    warm-up (first collectives, allocations): no diagnosis from it. A condition is said once,
    and again only when its reading moved 1.5x away from what was said (communication 25% ->
    40%). An MFU above 100% is a wrong peak, not a fast model: it is taken out of the record
    (kept as `mfu_impossible`) and said once."""

    CHANGE = 1.5

    def __init__(self, ignore: frozenset = frozenset()):
        self.windows = 0
        self.said: Dict[str, float] = {}
        self.mfu_said = False
        self.ignore = ignore  # readings that diagnose nothing in this run (a static loss scale)

    def new(self, record: dict, peak_source: str = "") -> List[str]:
        lines = []
        if record.get("mfu", 0) > 1:
            record["mfu_impossible"] = record.pop("mfu")
            if not self.mfu_said:
                self.mfu_said = True
                lines.append(f"MFU reads {record['mfu_impossible']:.0%}, above the device's peak "
                             f"({peak_source or 'unknown'}): the peak is wrong for this device, so MFU is left "
                             f"out of this run's readings")
        found = diagnose(record, self.ignore) if self.windows else {}
        self.windows += 1
        if found:
            record["diagnosis"] = list(found.values())
        for key, line in found.items():
            said = self.said.get(key)
            if said is None or not (said / self.CHANGE <= record[key] <= said * self.CHANGE):
                self.said[key] = record[key]
                lines.append(line)
        return lines


class Monitor:
    """Measures on every rank; `report` (collective: call it on every rank at the same step)
    combines the ranks' readings of the window since the last report."""

    def __init__(self, *, task, engine, cfg, layout, device: torch.device, rank: int):
        t = cfg.trainer
        self.engine, self.layout, self.device, self.rank = engine, layout, device, rank
        engine_state.keep_fp32_grad_norm(engine)
        self.samples_per_step = t.global_batch_size
        self.tokens_per_sample = task.tokens_per_sample()
        self.tokens_per_step = t.global_batch_size * self.tokens_per_sample
        per_sample, self.flops_how = model_flops_per_sample(task)
        self.flops_per_step = per_sample * t.global_batch_size if per_sample else None
        self.peak_flops, self.peak_source = (device_peak_flops(device, cfg.precision.dtype, cfg.data.cache_dir)
                                             if rank == 0 else (None, ""))
        self.device_memory = device_memory_bytes(device)
        self.precision_note = (cpu_fp16_note(cfg.precision.dtype, cfg.data.cache_dir)  # said once, at the start
                               if rank == 0 and device.type == "cpu" else None)
        # Real tokens / padded slots of the run's batches, as the task says; fixed-size samples: 1.
        self.padding_efficiency = task.padding_efficiency() if rank == 0 else 1.0
        self.comm = CommTimer(device)
        self.comm.install()
        self.gpu = GpuUtilization(device)
        self.fp16 = cfg.precision.dtype == "fp16"
        self.diagnoses = Diagnoses(ignore=frozenset({"loss_scale"}) if cfg.precision.loss_scale else frozenset())
        self.totals = {"wall": 0.0, "comm": 0.0, "data_wait": 0.0, "peak_mem_share": 0.0}
        self.start_window()

    def describe(self) -> str:
        unit = "token" if self.tokens_per_sample > 1 else "sample"
        flops = (f"{self.flops_per_step / self.tokens_per_step:.4g} per {unit} ({self.flops_how})"
                 if self.flops_per_step else self.flops_how)
        peak = f"{self.peak_flops / 1e12:.4g} TFLOP/s ({self.peak_source})" if self.peak_flops else self.peak_source
        return f"zoo: monitor: model FLOPs {flops}; MFU against {peak} per device"

    def start_window(self) -> None:
        self._window_start, self._data_wait = time.perf_counter(), 0.0
        self.comm.reset()

    def exclude(self, seconds: float) -> None:
        """Take `seconds` of the current window out of its step time (model.compile's compilation)."""
        self._window_start += seconds

    @contextlib.contextmanager
    def outside_step(self):
        """Work between steps (a periodic evaluation): neither its time nor its collectives
        count in the window's step time, communication or data wait."""
        t0 = time.perf_counter()
        try:
            with self.comm.paused():
                yield
        finally:
            self._window_start += time.perf_counter() - t0

    @contextlib.contextmanager
    def waiting_for_data(self):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._data_wait += time.perf_counter() - t0

    def report(self, step: int, loss: float, steps: int) -> tuple[dict, List[str]]:
        """(the logged record of the window of `steps` steps, diagnosis lines that newly fire)."""
        if self.device.type == "cuda":  # the window's kernels finished: its time is the device's too
            torch.cuda.synchronize(self.device)
        window = time.perf_counter() - self._window_start
        comm_s, comm_by_call = self.comm.seconds()
        util = self.gpu.read()
        mine = torch.tensor([comm_s / window, self._data_wait / window, float(peak_memory_bytes(self.device)),
                             math.nan if util is None else util], dtype=torch.float64, device=self.device)
        ranks = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        with self.comm.paused():
            dist.all_gather(ranks, mine)
        ranks = torch.stack(ranks).cpu()
        step_time = window / steps
        top = int(ranks[:, 2].argmax())
        utils = ranks[:, 3][~torch.isnan(ranks[:, 3])]
        record = {
            "step": step, "loss": loss, "lr": self.engine.get_lr()[0], "grad_norm": engine_state.grad_norm(self.engine),
            "loss_scale": engine_state.loss_scale(self.engine),
            # fp16: the optimizer steps skipped on overflow so far, and their share of the steps
            **({"skipped_steps": engine_state.skipped_steps(self.engine),
                "skipped_share": engine_state.skipped_steps(self.engine) / max(step, 1)} if self.fp16 else {}),
            "tokens_per_s": self.tokens_per_step / step_time, "samples_per_s": self.samples_per_step / step_time,
            "step_time_s": step_time, "mfu": self.mfu(step_time),
            # the largest rank's peak, and which rank it is
            "peak_mem_bytes": int(ranks[top, 2]), "peak_mem_rank": top,
            "peak_mem_share": float(ranks[top, 2]) / self.device_memory,
            "gpu_util": float(utils.mean()) if len(utils) else None,
            # One rank has no peer to communicate with: its few no-op collectives are no share.
            "comm_share": min(1.0, float(ranks[:, 0].mean())) if self.layout.world_size > 1 else None,
            "data_wait_share": min(1.0, float(ranks[:, 1].max())),
            "padding_efficiency": self.padding_efficiency,
            "comm_s_by_call": {k: round(v, 6) for k, v in sorted(comm_by_call.items())},
        }
        record = {k: v for k, v in record.items() if v is not None}
        for key, share in (("wall", 1.0), ("comm", record.get("comm_share", 0.0)),
                           ("data_wait", record["data_wait_share"])):
            self.totals[key] += share * window
        self.totals["peak_mem_share"] = max(self.totals["peak_mem_share"], record["peak_mem_share"])
        new = self.diagnoses.new(record, self.peak_source)
        self.start_window()
        return record, new

    def mfu(self, step_time: float) -> Optional[float]:
        if not (self.flops_per_step and self.peak_flops):
            return None
        return self.flops_per_step / step_time / self.layout.world_size / self.peak_flops

    def summary(self, train_time: float, steps: int) -> dict:
        """Whole-run figures for summary.json."""
        wall = self.totals["wall"]
        if not (wall and steps and train_time):  # nothing trained (max_steps=0, or resumed at the end)
            return {"padding_efficiency": self.padding_efficiency}
        mfu = self.mfu(train_time / steps)
        out = {"samples_per_s": self.samples_per_step * steps / train_time,
               "comm_share": self.totals["comm"] / wall if self.layout.world_size > 1 else None,
               "data_wait_share": self.totals["data_wait"] / wall, "padding_efficiency": self.padding_efficiency,
               "peak_mem_share": self.totals["peak_mem_share"], "mfu": mfu if mfu is None or mfu <= 1 else None}
        return {k: v for k, v in out.items() if v is not None}

    def close(self) -> None:
        self.comm.uninstall()
