"""The monitor on real CPU runs: sane readings, DeepSpeed's ZeRO and pipeline traffic seen by
the communication timer, and a diagnosis when a deliberately slow loader starves the step;
the prefetching loader (thread or worker processes) leaves every step's loss unchanged."""
from __future__ import annotations

import math
import runpy
import sys
import time

import pytest

FAST = ["debug=fast", "logger=none", "trainer.sample_tokens=0", "trainer.eval_batches=1", "optim.warmup_steps=2",
        "trainer.global_batch_size=8", "trainer.micro_batch_size=2"]
SLOW_COLLATE_S = 0.3  # per micro-batch: 1.2 s of loading per step against 0.2-0.5 s of compute (busy machine)


# -- units ------------------------------------------------------------------------------------


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
    # Within 10%: the windows hold the steps and the rules between them. Rank 0 drawing the
    # topology after the first step was inside them (every rank waited for it): 1.20x at pp2.
    assert s["tokens_per_s"] == pytest.approx(s["steps"] * samples_per_step * tokens_per_sample / trained, rel=0.1)


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


@pytest.mark.parametrize("layout", [["parallel=zero1"], ["parallel=tp"]], ids=["zero1", "tp2"])
def test_the_reported_peak_memory_is_the_largest_ranks(run_zoo, layout):
    """Rank 1 made to touch 400 MB more than rank 0: the step records, summary.json and the end
    line give rank 1's peak and name it, not rank 0's (which users would plan from)."""
    ballast = 400 * 2**20
    run = run_zoo(*FAST, *layout, "trainer.max_steps=2", "trainer.log_every=1",
                  env={"ZOO_TEST_BALLAST_MB": f"1:{ballast // 2**20}"})
    s = run.summary
    per_rank = s["peak_mem_bytes_per_rank"]
    assert len(per_rank) == 2 and per_rank[1] > per_rank[0] + ballast // 2, per_rank
    assert s["peak_mem_rank"] == 1 and s["peak_mem_bytes"] == per_rank[1]
    assert all(m["peak_mem_rank"] == 1 and m["peak_mem_bytes"] > per_rank[0] for m in run.metrics)
    assert s["peak_mem_share"] >= max(m["peak_mem_share"] for m in run.metrics)
    assert f"peak memory {per_rank[1] / 2**30:.2f} GiB (rank 1, the largest of 2)" in run.stdout


def slow_loading_main() -> None:
    """`python -m zoo.train` with a GPT task whose training batches take SLOW_COLLATE_S each
    to build: a loader that really cannot keep up (run in the test's subprocess)."""
    import dataclasses

    from zoo.families import registry as families
    from zoo.families.causal_lm_task import CausalLMTask

    class SlowLoadingGPT(CausalLMTask):
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
        sys.executable, "-c", "from tests.e2e.test_monitor import slow_loading_main; slow_loading_main()",
        f"hydra.run.dir={run_dir}", "trainer.progress=false", *FAST, "trainer.max_steps=6", "trainer.log_every=2"])


def test_a_starved_loader_is_diagnosed(starved):
    assert starved.stdout.count("zoo: diagnosis: waiting for data") == 1, starved.stdout  # once, when it crosses
    for m in starved.metrics:
        assert m["data_wait_share"] > 0.05, m
    # the first window (the warm-up) is never diagnosed; the next one is
    first, *later = starved.metrics
    assert "diagnosis" not in first and later
    assert all(any(line.startswith("waiting for data") for line in m["diagnosis"]) for m in later)
    # prefetching hides part of the loading: the wait is less than the loading time itself
    loading_s = SLOW_COLLATE_S * 4  # 4 micro-batches per step
    assert starved.metrics[-1]["data_wait_share"] * starved.metrics[-1]["step_time_s"] < loading_s


def test_worker_processes_and_the_thread_give_the_same_losses(run_zoo, starved):
    """data.num_workers=2 and the background thread behind a slow loader: the same floats."""
    workers = run_zoo(*FAST, "trainer.max_steps=6", "trainer.log_every=2", "data.num_workers=2")
    assert workers.losses() == starved.losses()
    assert workers.metrics[-1]["data_wait_share"] < 0.05
