"""The monitor on real CPU runs: sane readings, DeepSpeed's ZeRO and pipeline traffic seen by
the communication timer, and a diagnosis when a deliberately slow loader starves the step;
the prefetching loader (thread or worker processes) leaves every step's loss unchanged."""
from __future__ import annotations

import math
import runpy
import sys
import time

import pytest
import torch
import torch.distributed as dist

from data_pipelines.schedule import micro_batch_start
from zoo.data_loading import StepLoader
from zoo.observe.comm_timer import CommTimer
from zoo.observe.flops import forward_flops, transformer_flops_per_token
from zoo.observe.monitor import diagnose
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


# -- real runs --------------------------------------------------------------------------------
def check_sane(run, *, samples_per_step: int, tokens_per_sample: int = 128):
    for m in run.metrics:
        for key in ("comm_share", "data_wait_share", "peak_mem_share", "padding_efficiency"):
            assert 0.0 <= m[key] <= 1.0, (key, m)
        assert 0.0 < m["mfu"] <= 1.0, m
        assert m["tokens_per_s"] * m["step_time_s"] == pytest.approx(samples_per_step * tokens_per_sample)
        assert m["samples_per_s"] * m["step_time_s"] == pytest.approx(samples_per_step)
        assert math.isfinite(m["grad_norm"]) and m["grad_norm"] > 0
    s = run.summary
    assert 0.0 < s["mfu"] <= 1.0 and 0.0 <= s["comm_share"] <= 1.0 and 0.0 <= s["data_wait_share"] <= 1.0
    # the logged step times account for the training time, which the whole run's wall time bounds
    windows = [b["step"] - a for a, b in zip([0] + [m["step"] for m in run.metrics], run.metrics)]
    trained = sum(w * m["step_time_s"] for w, m in zip(windows, run.metrics))
    assert trained <= s["wall_time_s"]
    assert s["tokens_per_s"] == pytest.approx(s["steps"] * samples_per_step * tokens_per_sample / trained, rel=0.2)


def test_monitor_readings_on_a_pipeline(run_zoo):
    """pp 2: sane readings, and the timer sees the pipeline's sends and receives, which
    DeepSpeed's engine makes through deepspeed.comm (ZeRO's traffic: test_tracking)."""
    run = run_zoo(*FAST, "parallel=pp", "parallel.num_microbatches=4", "trainer.max_steps=4", "trainer.log_every=2")
    check_sane(run, samples_per_step=8)
    calls = set().union(*(m["comm_s_by_call"] for m in run.metrics))
    assert {"send", "recv"} <= calls, calls
    assert all(m["comm_share"] > 0 for m in run.metrics)
    line = next(l for l in run.stdout.splitlines() if l.startswith("step      2 |"))
    assert all(part in line for part in ("gnorm", "tok/s", "MFU", "mem", "comm", "data wait")), line


def slow_loading_main() -> None:
    """`python -m zoo.train` with a GPT task whose training batches take SLOW_COLLATE_S each
    to build: a loader that really cannot keep up (run in the test's subprocess)."""
    import dataclasses

    from zoo import families
    from zoo.families.gpt.task import GPTTask

    class SlowLoadingGPT(GPTTask):
        def collate(self, split, indices):
            if split == "train":
                time.sleep(SLOW_COLLATE_S)
            return super().collate(split, indices)

    families.FAMILIES["gpt"] = dataclasses.replace(families.FAMILIES["gpt"], task=SlowLoadingGPT)
    runpy.run_module("zoo.train", run_name="__main__", alter_sys=True)  # as `python -m zoo.train`


@pytest.fixture(scope="module")
def starved(run_zoo, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("starved") / "run"
    return run_zoo(run_dir=run_dir, cmd=[
        sys.executable, "-c", "from tests.test_monitor import slow_loading_main; slow_loading_main()",
        f"hydra.run.dir={run_dir}", "trainer.progress=false", *FAST, "trainer.max_steps=4", "trainer.log_every=2"])


def test_a_starved_loader_is_diagnosed(starved):
    assert starved.stdout.count("zoo: diagnosis: waiting for data") == 1, starved.stdout  # once, when it crosses
    for m in starved.metrics:
        assert m["data_wait_share"] > 0.05, m
        assert any(line.startswith("waiting for data") for line in m["diagnosis"])
    # prefetching hides part of the loading: the wait is less than the loading time itself
    loading_s = SLOW_COLLATE_S * 4  # 4 micro-batches per step
    assert starved.metrics[-1]["data_wait_share"] * starved.metrics[-1]["step_time_s"] < loading_s


def test_worker_processes_and_the_thread_give_the_same_losses(run_zoo, starved):
    """data.num_workers=2 and the background thread behind a slow loader: the same floats."""
    workers = run_zoo(*FAST, "trainer.max_steps=4", "trainer.log_every=2", "data.num_workers=2")
    assert workers.losses() == starved.losses()
    assert workers.metrics[-1]["data_wait_share"] < 0.05
