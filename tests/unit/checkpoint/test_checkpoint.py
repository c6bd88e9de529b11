"""Checkpoints without a training run: the weights-only guard over every torch.load, the data
position across layouts, when DeepSpeed's native files are written."""
from __future__ import annotations

import os

import pytest
import torch

from data_pipelines.schedule import SampleStream, micro_batch_start


class ExecutesCode:
    """What a hostile pickle holds: unpickling it calls os.system."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_every_torch_load_during_a_native_load_is_weights_only(tmp_path):
    """DeepSpeed's universal-checkpoint and optimizer paths call torch.load(weights_only=False)
    themselves; inside the guard that flag is overridden and the refusal names the file."""
    from zoo.engine.native import RefusedPickle, weights_only_loading

    marker, hostile, plain = tmp_path / "code-ran", tmp_path / "optimizer_state.pt", tmp_path / "plain.pt"
    torch.save({"state": ExecutesCode(marker)}, hostile)
    torch.save({"w": torch.ones(2)}, plain)
    with weights_only_loading():
        with pytest.raises(RefusedPickle, match="optimizer_state.pt"):
            torch.load(hostile, weights_only=False)
        assert torch.equal(torch.load(plain, weights_only=False)["w"], torch.ones(2))
    assert not marker.exists()
    assert torch.load.__module__ == "torch.serialization"  # restored on the way out


@pytest.mark.parametrize("dp_before, dp_after", [(2, 1), (1, 2), (2, 4), (4, 2)])
def test_data_position_carries_over_sample_by_sample(dp_before, dp_after):
    """The samples of every step are the same whichever dp wrote the position: none twice, none skipped."""
    stream, global_batch, micro = SampleStream(1000, seed=3), 16, 2

    def step_samples(consumed, dp):
        out = []
        for rank in range(dp):
            for m in range(global_batch // (micro * dp)):
                start = micro_batch_start(consumed, m, global_batch=global_batch, micro_batch=micro,
                                          dp_rank=rank, dp_size=dp)
                out.extend(stream.indices(start, micro))
        return out

    before = [s for step in range(5) for s in step_samples(step * global_batch, dp_before)]
    after = [s for step in range(5, 70) for s in step_samples(step * global_batch, dp_after)]
    seen = before + after  # 70 steps of 16 = 1120 samples: the first epoch (1000) then 120 more
    assert sorted(seen[:1000]) == list(range(1000))
    assert seen == list(stream.indices(0, 1120))


@pytest.mark.parametrize("zero_stage, setting, on", [(3, None, True), (1, None, False), (0, None, False),
                                                      (1, True, True), (3, False, False)])
def test_native_files_by_default_only_under_zero3(zero_stage, setting, on):
    from zoo.config.schema import Config
    from zoo.engine.native import enabled
    from zoo.parallel.topology import Layout

    cfg = Config()
    cfg.checkpoint.native = setting
    assert enabled(cfg.checkpoint, Layout(tp=1, pp=1, dp=2, zero_stage=zero_stage)) is on


def test_a_shape_field_added_later_matches_its_default_and_nothing_else(tmp_path):
    """A checkpoint written before a shape field existed (vocab_real) resumes where this run's
    value is the default, None; any other value, or any other field differing, is refused."""
    from zoo.checkpoint.layout_free import CheckpointError, check_compatible

    old = {"family": "gpt", "shape": {"n_layer": 4, "n_embd": 128}}
    check_compatible(old, {"family": "gpt", "shape": {"n_layer": 4, "n_embd": 128, "vocab_real": None}}, tmp_path)
    for now, names in (({"family": "gpt", "shape": {"n_layer": 4, "n_embd": 128, "vocab_real": 50257}},
                        r"another model shape: vocab_real None \(this run: 50257\); resume with the model settings"),
                       ({"family": "gpt", "shape": {"n_layer": 2, "n_embd": 128, "vocab_real": None}},
                        r"another model shape: n_layer 4 \(this run: 2\); resume"),  # only the field that differs
                       ({"family": "llama", "shape": {"n_layer": 4, "n_embd": 128}},
                        r"written for model.family=gpt but this run builds model.family=llama; resume with model=gpt")):
        with pytest.raises(CheckpointError, match=names):
            check_compatible(old, now, tmp_path)
