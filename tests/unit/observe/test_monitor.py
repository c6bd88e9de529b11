"""The monitor on real CPU runs: sane readings, DeepSpeed's ZeRO and pipeline traffic seen by
the communication timer, and a diagnosis when a deliberately slow loader starves the step;
the prefetching loader (thread or worker processes) leaves every step's loss unchanged."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from data_pipelines.loader import StepLoader
from data_pipelines.schedule import micro_batch_start
from zoo.observe.comm_timer import CommTimer
from zoo.observe.flops import forward_flops, transformer_flops_per_token
from zoo.observe.monitor import Diagnoses, diagnose
from zoo.worker import leave_process_group

FAST = ["debug=fast", "logger=none", "trainer.sample_tokens=0", "trainer.eval_batches=1", "optim.warmup_steps=2",
        "trainer.global_batch_size=8", "trainer.micro_batch_size=2"]
SLOW_COLLATE_S = 0.1  # per micro-batch: 0.4 s of loading per step against ~0.2 s of compute


# -- units ------------------------------------------------------------------------------------


def test_transformer_formula_matches_counted_flops():
    """6N + 12*L*H*Q*T per token against 3x the forward FLOPs torch counts on the real model."""
    from zoo.models.gpt import GPT, GPTShape

    shape = GPTShape(n_layer=2, n_head=4, n_embd=64, block_size=64, vocab_size=512)
    with torch.device("meta"):
        model = GPT(shape)
    params = sum(p.numel() for p in model.parameters())
    counted = 3 * forward_flops(model, torch.zeros(1, 64, dtype=torch.long, device="meta"))
    formula = 64 * transformer_flops_per_token(params, 2, 64, 64, 64)
    assert counted == pytest.approx(formula, rel=0.02)


def test_comm_timer_times_sync_calls_and_waits(tmp_path):
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    timer, original = CommTimer(torch.device("cpu")), dist.all_reduce
    try:
        timer.install()
        dist.all_reduce(torch.ones(4))
        dist.all_reduce(torch.ones(4), async_op=True).wait()
        objects = [None]
        dist.all_gather_object(objects, {"a": 1})  # calls all_gather inside: counted once
        dist.all_gather_single(torch.empty(4), torch.ones(4))  # the tensor-parallel gather and scatter
        dist.reduce_scatter_single(torch.empty(4), torch.ones(4))
        with timer.paused():
            dist.all_reduce(torch.ones(4))
        total, by_call = timer.seconds()
    finally:
        timer.uninstall()
        leave_process_group()
    assert set(by_call) == {"all_reduce", "wait", "all_gather_object", "all_gather_single", "reduce_scatter_single"}
    assert total == pytest.approx(sum(by_call.values()))
    assert dist.all_reduce is original  # uninstalled


def test_concurrent_calls_count_once():
    timer = CommTimer(torch.device("cpu"))
    timer._spans = [("a", 0.0, 2.0), ("b", 1.0, 3.0), ("c", 5.0, 6.0)]
    assert timer.seconds() == (4.0, {"a": 2.0, "b": 2.0, "c": 1.0})


def test_diagnosis_thresholds():
    found = diagnose({"gpu_util": 0.5, "comm_share": 0.1, "peak_mem_share": 0.9, "data_wait_share": 0.06})
    assert set(found) == {"gpu_util", "peak_mem_share", "data_wait_share"}
    assert "activation_checkpointing" in found["peak_mem_share"] and "num_workers" in found["data_wait_share"]
    assert diagnose({"comm_share": 0.2, "data_wait_share": 0.05}) == {}


def test_a_condition_is_diagnosed_once_after_the_first_window_and_again_when_it_moves():
    d = Diagnoses()
    assert d.new({"comm_share": 0.6}) == []  # the warm-up window
    (line,) = d.new({"comm_share": 0.3})
    assert line.startswith("communication 30%")
    assert d.new({"comm_share": 0.35}) == [] and d.new({"comm_share": 0.25}) == []  # the same condition
    assert d.new({"comm_share": 0.1}) == []  # gone...
    assert d.new({"comm_share": 0.3}) == []  # ...and back as it was: said already
    (moved,) = d.new({"comm_share": 0.5})
    assert moved.startswith("communication 50%")
    lines = d.new({"comm_share": 0.5, "data_wait_share": 0.2})
    assert len(lines) == 1 and lines[0].startswith("waiting for data 20%")


def test_an_mfu_above_the_peak_is_taken_out_and_said_once():
    d = Diagnoses()
    record = {"mfu": 2.76, "comm_share": 0.0}
    (line,) = d.new(record, "measured bf16 matmul")
    assert "mfu" not in record and record["mfu_impossible"] == 2.76
    assert line.startswith("MFU reads 276%, above the device's peak (measured bf16 matmul)")
    again = {"mfu": 2.5}
    assert d.new(again) == [] and "mfu" not in again
    fine = {"mfu": 0.4}
    assert d.new(fine) == [] and fine["mfu"] == 0.4


def test_the_cpu_peak_for_an_emulated_half_precision_is_the_fp32_rate(tmp_path, monkeypatch):
    from zoo.observe import flops

    rates = {torch.float32: 1e11, torch.bfloat16: 1.4e9}
    monkeypatch.setattr(flops, "measured_matmul_flops", lambda dtype: rates[dtype])
    peak, how = flops.device_peak_flops(torch.device("cpu"), "bf16", str(tmp_path))
    assert peak == 1e11 and "bf16 matmul measured slower here" in how
    rates[torch.bfloat16] = 3e11  # native bf16 units: their rate
    (tmp_path / "cpu_peak_flops.json").unlink()
    assert flops.device_peak_flops(torch.device("cpu"), "bf16", str(tmp_path))[0] == 3e11


class PositionTask:
    """Batches that say which stream positions they hold (the base Task's addressing)."""

    device = torch.device("cpu")

    def micro_batch(self, consumed, micro, *, micro_batch, global_batch, dp_rank, dp_size):
        start = micro_batch_start(consumed, micro, global_batch=global_batch, micro_batch=micro_batch,
                                  dp_rank=dp_rank, dp_size=dp_size)
        return torch.arange(start, start + micro_batch), torch.full((micro_batch,), consumed)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_loader_hands_out_exactly_the_asked_position(num_workers):
    """Prefetched steps are used only for their own position; a jump (a resume) re-reads."""
    task, shape = PositionTask(), dict(global_batch=8, micro_batch=2, dp_rank=1, dp_size=2)
    loader = StepLoader(task, torch.device("cpu"), start=16, end=80, grad_accum=2, num_workers=num_workers, **shape)
    try:
        for consumed in (16, 24, 32, 56, 64, 72):
            want = [task.micro_batch(consumed, m, **shape) for m in range(2)]
            got = loader.get(consumed)
            assert [[t.tolist() for t in b] for b in got] == [[t.tolist() for t in b] for b in want], consumed
    finally:
        loader.close()


def test_the_cpu_peak_is_measured_once_per_machine_and_cached(tmp_path, monkeypatch):
    from zoo.observe import flops

    calls = []
    monkeypatch.setattr(flops, "measured_matmul_flops", lambda dtype: calls.append(dtype) or 1.5e11)
    first, how = flops.device_peak_flops(torch.device("cpu"), "fp32", str(tmp_path))
    again, how_again = flops.device_peak_flops(torch.device("cpu"), "fp32", str(tmp_path))
    assert (first, again, len(calls)) == (1.5e11, 1.5e11, 1)
    assert "cached in" not in how and f"cached in {tmp_path / 'cpu_peak_flops.json'}" in how_again
    flops.device_peak_flops(torch.device("cpu"), "bf16", str(tmp_path))  # another dtype: its own entry
    assert len(calls) == 2
    (tmp_path / "cpu_peak_flops.json").write_text("not json")  # a damaged file is measured again
    assert flops.device_peak_flops(torch.device("cpu"), "fp32", str(tmp_path))[0] == 1.5e11 and len(calls) == 3


def test_measuring_the_cpu_peak_leaves_the_global_rng_alone():
    """It ran on rank 0 only, and only when not cached: drawing from the global generator
    shifted that rank's dropout in the run that filled the cache (a dropout run's losses
    differed between the first run on a machine and the next)."""
    from zoo.observe.flops import measured_matmul_flops

    torch.manual_seed(5)
    before = torch.get_rng_state()
    measured_matmul_flops(torch.float32)
    assert torch.equal(torch.get_rng_state(), before)
