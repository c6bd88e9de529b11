"""The device-time breakdown (zoo/observe/device_time.py) of a Chrome trace in the format
torch.profiler writes on CUDA (Kineto: kernels and their launches joined by
args.correlation): each kernel counted for the range open on the training thread when it was
launched, from whichever thread, NCCL kernels as communication, copies as memory; and nothing
from a CPU run's trace."""
from __future__ import annotations

import json

import pytest
import torch

from zoo.observe.device_time import device_breakdown, trace_device_breakdown


def _range(name, ts, dur, tid=1):
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 100, "tid": tid, "ts": ts, "dur": dur}


def _launch(corr, ts, tid=1, name="cudaLaunchKernel"):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 100, "tid": tid, "ts": ts, "dur": 5,
            "args": {"correlation": corr}}


def _kernel(corr, name, ts, dur, stream=7, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "device": 0, "stream": stream}}


def _one_step(offset=0.0):
    """One step of 1000 us: forward 0-300, backward 300-800 (its kernels launched by autograd's
    thread, an all-reduce inside it on the training thread), optimizer 800-950."""
    o = offset
    return [
        _range("zoo.step", o, 1000), _range("zoo.forward", o, 300), _range("zoo.backward", o + 300, 500),
        _range("zoo.comm:all_reduce", o + 600, 100), _range("zoo.optimizer", o + 800, 150),
        _launch(o + 1, o + 10), _kernel(o + 1, "ampere_sgemm_128x64_tn", o + 50, 200),
        _launch(o + 2, o + 250), _kernel(o + 2, "vectorized_elementwise_kernel", o + 320, 100),  # runs after the range
        _launch(o + 3, o + 350, tid=2), _kernel(o + 3, "ampere_sgemm_64x64_nn", o + 430, 300),  # autograd's thread
        _launch(o + 4, o + 610), _kernel(o + 4, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", o + 650, 150, stream=20),
        _launch(o + 5, o + 820), _kernel(o + 5, "multi_tensor_apply_kernel", o + 830, 100),
        _launch(o + 6, o + 20), _kernel(o + 6, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", o + 260, 40, stream=20),
        _launch(o + 7, o + 960, name="cudaMemcpyAsync"), _kernel(o + 7, "Memcpy DtoH (Device -> Pinned)", o + 965, 10,
                                                                 cat="gpu_memcpy"),
    ]


def test_kernels_are_counted_for_the_range_that_launched_them():
    got = device_breakdown({"traceEvents": _one_step() + _one_step(offset=2000.0)})
    assert got["steps"] == 2 and got["kernels"] == 14
    ms = got["device_ms"]
    assert ms["forward"] == pytest.approx(0.3) and ms["backward"] == pytest.approx(0.3)
    assert ms["all-reduce"] == pytest.approx(0.15) and ms["optimizer"] == pytest.approx(0.1)
    assert ms["other comm"] == pytest.approx(0.04)  # an NCCL kernel launched in forward (tp's all-reduce)
    assert ms["memory"] == pytest.approx(0.01)
    # busy: 50-250, 260-300 (the tp all-reduce, between forward's kernels), 320-420, 430-800, 830-930, 965-975
    assert got["busy_ms"] == pytest.approx((200 + 40 + 100 + 370 + 100 + 10) / 1e3)
    # communication beside compute: the all-reduce's 650-730 under the backward's gemm
    assert got["comm_overlap_ms"] == pytest.approx(80 / 1e3)


def test_a_trace_without_device_activity_or_steps_has_no_device_breakdown():
    assert device_breakdown({"traceEvents": [_range("zoo.step", 0, 10)]}) is None
    assert device_breakdown({"traceEvents": [_launch(1, 0), _kernel(1, "k", 1, 2)]}) is None


def test_a_cpu_profile_s_trace_has_none(tmp_path):
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("zoo.step"), record_function("zoo.forward"):
            torch.ones(64, 64) @ torch.ones(64, 64)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    assert any(e.get("name") == "zoo.step" for e in json.loads(path.read_text())["traceEvents"])
    assert trace_device_breakdown(path) is None


def test_a_gpu_run_s_rows_compare_stages_by_device_time_and_print_it():
    """On a GPU the CPU ranges put the device time in forward (the CPU waits there): the
    stage comparison and the printed table read the kernels instead."""
    from tests.unit.observe.test_profile import _row
    from zoo.observe.profiler import summarize, table_lines

    rows = [_row(0, 0, 0, 80), _row(1, 1, 0, 80)]  # the CPU ranges: equal stages
    for row, (fwd, bwd) in zip(rows, ((10.0, 20.0), (20.0, 40.0))):
        row["device"] = {"steps": 3, "device_ms": {"forward": fwd, "backward": bwd, "all-reduce": 5.0},
                         "busy_ms": fwd + bwd + 5.0, "comm_overlap_ms": 2.0, "kernels": 100}
    s = summarize(rows, first=3, last=5, partition_method="parameters")
    assert s["stage_compute_ms"] == {"0": 30.0, "1": 60.0} and s["diagnoses"][0].startswith("stage 1 computes 2.0x")
    lines = table_lines(s)
    at = next(i for i, line in enumerate(lines) if line.startswith("zoo: profile: device time from the trace's kernels"))
    assert lines[at + 1].split() == ["rank", "step", "busy", "forward", "backward", "all-reduce", "comm", "overlapped"]
    assert lines[at + 3].split() == ["1", "100.0", "65.0", "(65%)", "20.0", "(20%)", "40.0", "(40%)", "5.0", "(5%)",
                                     "2.0", "ms"]
    assert not any("device time" in line for line in table_lines(summarize([_row(0, 0, 0, 80)], first=3, last=5,
                                                                           partition_method="parameters")))
