"""trainer.micro_batch_size=auto: the search, against probes whose peak memory is known.

The probe on a real run measures CUDA's allocator over a real training step (only on a GPU:
benchmarks/gpu_check runs it); here the search is driven by stand-in probes with a known peak
per micro-batch, which is what decides the answer."""
from __future__ import annotations

import pytest

from zoo.config.schema import Config, ModelConfig
from zoo.parallel.topology import Layout
from zoo.plan.batch_finder import BatchFinderError, candidates, describe, search
from zoo.plan.fit import fit_warning


def recording(peak):
    calls = []

    def probe(b):
        calls.append(b)
        return peak(b)

    return probe, calls


def test_candidates_keep_the_accumulation_whole():
    assert candidates(48, 2) == [1, 2, 3, 4, 6, 8, 12, 24]
    assert candidates(64, 8) == [1, 2, 4, 8]


def test_linear_memory_takes_three_probes_and_the_largest_that_fits():
    probe, calls = recording(lambda b: 1000 + 100 * b)  # fixed states + activations per sample
    best, trials = search(candidates(64, 1), probe, budget=2000)
    assert best == 8  # 1000 + 100 * 8 = 1800 <= 2000 < 1000 + 100 * 16
    assert calls == [1, 2, 8] and [t.peak_bytes for t in trials] == [1100, 1200, 1800]


def test_memory_that_grows_faster_than_the_line_steps_down_to_a_measured_fit():
    peak = lambda b: 1000 + 100 * b + 8 * b * b  # noqa: E731 (e.g. attention's T^2 terms, fragmentation)
    probe, calls = recording(peak)
    best, trials = search(candidates(64, 1), probe, budget=3000)
    # the line through 1 (1,108) and 2 (1,232) predicts that 16 fits; 16 measures 4,648 > 3,000,
    # so 8 is measured (2,312) and taken
    assert best == 8 == max(b for b in candidates(64, 1) if peak(b) <= 3000) and calls == [1, 2, 16, 8]
    assert all(t.peak_bytes == peak(t.micro_batch) for t in trials)
    assert peak(best) <= 3000 and len(calls) == len(set(calls))  # nothing measured twice


def test_the_line_overshoots_then_each_smaller_candidate_is_measured():
    peak = lambda b: 1000 + 10 * b if b <= 2 else 1000 + 400 * b  # noqa: E731 a cliff after 2
    probe, calls = recording(peak)
    best, _ = search(candidates(32, 1), probe, budget=2500)
    assert best == 2 and calls == [1, 2, 32, 16, 8, 4]  # 4: 2600 > 2500


def test_nothing_fits_says_what_was_measured_and_what_to_change():
    probe, _ = recording(lambda b: 5 * 2**30 * b)
    with pytest.raises(BatchFinderError, match=r"micro-batch 1 already peaks at 5.00 GiB, over the budget of "
                                               r"4.00 GiB .* parallel.zero_stage"):
        search([1, 2, 4], probe, budget=4 * 2**30)


def test_a_single_candidate_is_measured_once():
    probe, calls = recording(lambda b: 10)
    assert search([1], probe, budget=100)[0] == 1 and calls == [1]


def test_the_report_names_choice_measurements_and_accumulation():
    _, trials = search([1, 2, 4, 8], lambda b: 2**30 * b, budget=5 * 2**30)
    line = describe(4, trials, 5 * 2**30, global_batch=64, dp=2)
    assert "micro_batch_size=auto: 4" in line and "2: 2.00 GiB" in line and "accumulation 8" in line


def test_the_start_warning_under_auto_is_about_micro_batch_1():
    cfg = Config(model=ModelConfig(family="gpt", size="gpt3-175b"))
    cfg.trainer.micro_batch_size, cfg.precision.dtype = "auto", "bf16"
    assert "micro-batch 1 x 1" in fit_warning(cfg, Layout(tp=1, pp=1, dp=8), device_mem_bytes=80e9)
    cfg.model.size = "tiny"
    assert fit_warning(cfg, Layout(tp=1, pp=1, dp=8), device_mem_bytes=80e9) is None
