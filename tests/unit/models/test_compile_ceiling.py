"""benchmarks/compile_ceiling.py's split of a profile: the matmul and attention kernels by
name and their time and FLOPs per step; the rest is not counted."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


def _ceiling():
    spec = importlib.util.spec_from_file_location("compile_ceiling", BENCHMARKS / "compile_ceiling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _event(key, us, flops=0):
    return SimpleNamespace(key=key, self_cpu_time_total=us, flops=flops)


def test_split_counts_the_matmul_and_attention_kernels_per_step():
    events = [_event("aten::mm", 300_000, 6e9), _event("aten::addmm", 100_000, 2e9),
              _event("aten::_scaled_dot_product_flash_attention_for_cpu", 20_000),
              _event("aten::_scaled_dot_product_flash_attention_for_cpu_backward", 40_000),
              _event("aten::matmul", 5_000),  # a composite: its self time is the dispatch, not a kernel
              _event("aten::gelu", 50_000), _event("## Call CompiledFxGraph abc", 70_000)]
    out = _ceiling().split(events, steps=2)
    assert out == pytest.approx({"matmul_s": 0.2, "attention_s": 0.03, "matmul_flops": 4e9})


def test_a_profile_without_a_matmul_is_refused():
    with pytest.raises(ValueError, match="no matmul"):
        _ceiling().split([_event("aten::gelu", 10)], steps=1)
