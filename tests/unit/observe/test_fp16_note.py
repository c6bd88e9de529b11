"""precision=fp16 on a CPU is said once at the start, with the measured rates and the fast choice."""
from __future__ import annotations

import json

from zoo.observe import flops


def test_fp16_on_a_cpu_names_the_rates_and_bf16(tmp_path, monkeypatch):
    rates = {"fp16": 0.004e12, "fp32": 0.08e12, "bf16": 0.19e12}
    monkeypatch.setattr(flops, "cached_cpu_peak_flops", lambda dtype, cache_dir=None: (rates[dtype], "measured"))
    note = flops.cpu_fp16_note("fp16")
    assert note.startswith("precision=fp16 on a CPU: an fp16 matmul runs at 0.004 TFLOP/s here against fp32's 0.08 "
                           "and bf16's 0.19")
    assert note.endswith("on a CPU use precision=bf16 (or precision=fp32); fp16 is for GPUs")
    rates["bf16"] = 0.05e12  # a CPU without bf16 units (or one thread where it measures slower): fp32 first
    assert flops.cpu_fp16_note("fp16").endswith("on a CPU use precision=fp32 (or precision=bf16); fp16 is for GPUs")
    assert flops.cpu_fp16_note("fp32") is None and flops.cpu_fp16_note("bf16") is None


def test_the_rates_come_from_the_machines_cache(tmp_path):
    """Measured once per machine, like the MFU peak: a second call reads the cache."""
    note = flops.cpu_fp16_note("fp16", str(tmp_path))
    cached = json.loads((tmp_path / "cpu_peak_flops.json").read_text())
    assert {key.split(" | ")[2] for key in cached} == {"fp16", "fp32", "bf16"}
    assert flops.cpu_fp16_note("fp16", str(tmp_path)) == note
