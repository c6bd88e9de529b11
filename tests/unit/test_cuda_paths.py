"""The paths only CUDA takes, checked on this CPU with stand-ins for torch.cuda (#51 item 4):
the rank's device when a task sees fewer GPUs than its LOCAL_RANK, DeepSpeed's throughput
timers off, the memory snapshot's Python stacks, the batch finder's peak reset after its
probes, and the RNG state of the rank's own device in checkpoints."""
from __future__ import annotations

import types

import pytest
import torch


@pytest.fixture
def one_visible_gpu(monkeypatch):
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    return chosen


def test_a_task_with_one_visible_gpu_takes_it_and_tells_deepspeed(monkeypatch, one_visible_gpu):
    """Slurm giving each task its own GPU: LOCAL_RANK=3, one device visible. zoo picked cuda:0
    but DeepSpeed read LOCAL_RANK=3 for its set_device and the group's device_id."""
    from zoo.worker import _device

    monkeypatch.setenv("LOCAL_RANK", "3")
    assert _device(3) == torch.device("cuda", 0) and one_visible_gpu == [0]
    import os

    assert os.environ["LOCAL_RANK"] == "0"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)  # all eight visible: nothing changes
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert _device(3) == torch.device("cuda", 3) and os.environ["LOCAL_RANK"] == "3"


def test_deepspeeds_throughput_timers_are_off():
    """On by default they synchronize the device at every forward and step."""
    from deepspeed.utils.config import get_timers_config

    from zoo.config.schema import Config
    from zoo.engine import deepspeed_config
    from zoo.parallel.topology import Layout

    timers = get_timers_config(deepspeed_config(Config(), Layout(tp=1, pp=1, dp=1, zero_stage=1)))
    assert (timers.enabled, timers.synchronized) == (False, False)


def test_the_memory_history_records_python_stacks_only(monkeypatch, tmp_path):
    from zoo.config.schema import Config
    from zoo.observe.profiler import ProfileWindow

    recorded = []
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda *a, **k: recorded.append(k))
    cfg = Config()
    cfg.trainer.profile.start, cfg.trainer.profile.memory = 2, True
    window = ProfileWindow(cfg, tmp_path, rank=0, coords={"tp": 0, "pp": 0, "dp": 0}, device=torch.device("cpu"),
                           comm=types.SimpleNamespace(annotate=False), engine=None, pipelined=False)
    window.memory = True
    monkeypatch.setattr(torch.profiler, "profile", lambda **k: types.SimpleNamespace(start=lambda: None))
    window._start()
    assert recorded and recorded[0].get("stacks") == "python", recorded


def test_the_batch_finder_resets_the_peak_after_its_probes(monkeypatch):
    from zoo.plan import batch_finder

    calls = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(total_memory=10**9))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: calls.append("reset"))
    monkeypatch.setattr(batch_finder, "_probe", lambda *a: (lambda b: calls.append(b) or 100 * b))
    cfg = types.SimpleNamespace(trainer=types.SimpleNamespace(global_batch_size=8))
    best, _, _ = batch_finder.find_micro_batch_size(cfg, types.SimpleNamespace(dp=1), None, None,
                                                    torch.device("cuda", 0))
    assert best == 8 and calls[-1] == "reset" and "reset" not in calls[:-1]


def test_a_checkpoint_keeps_the_rank_devices_rng_state_only(monkeypatch):
    from zoo.checkpoint import layout_free

    asked = []
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device=None: asked.append(device) or torch.zeros(8))
    states = layout_free._rng_states(torch.device("cuda", 2))
    assert set(states) == {"", "cuda_"} and asked == [torch.device("cuda", 2)]
    assert set(layout_free._rng_states(torch.device("cpu"))) == {""}
