"""A model a resume fills is built without the layout-free initialisation (#50 item 6): it drew
every weight on one CPU thread and was then overwritten (46% of a 1.1B model's resume start)."""
from __future__ import annotations

import torch

from zoo.families.registry import family_of_shape as spec_of
from zoo.models.gpt import gpt_shape
from zoo.parallel import build as build_module
from zoo.parallel.build import build_model


def test_init_false_draws_no_weight_and_init_true_draws_the_same_ones(monkeypatch):
    shape = gpt_shape("tiny", 256, n_layer=2, block_size=16)
    spec = spec_of(shape)
    drawn = []
    real = build_module.init_parameters
    monkeypatch.setattr(build_module, "init_parameters", lambda *a, **k: drawn.append(1) or real(*a, **k))
    built = build_model(spec, shape, seed=7, device=torch.device("cpu"), init=False)
    assert drawn == []  # no weight drawn: a resume fills them all
    assert {n for n, _ in built.named_parameters()} == {n for n, _ in spec.model(shape).named_parameters()}
    a = build_model(spec, shape, seed=7, device=torch.device("cpu"))
    b = build_model(spec, shape, seed=7, device=torch.device("cpu"))
    assert drawn == [1, 1] and all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def test_a_pipeline_stage_is_built_without_init_too(monkeypatch):
    """build_pipeline hands its stages' build to DeepSpeed's PipelineModule (stood in for here:
    it builds the whole meta model once) with the same init=False."""
    from zoo.parallel.build import build_pipeline
    from zoo.parallel.topology import Layout

    shape = gpt_shape("tiny", 256, n_layer=2, block_size=16)
    drawn = []
    monkeypatch.setattr(build_module, "init_parameters", lambda *a, **k: drawn.append(1))
    monkeypatch.setattr("zoo.parallel.pipeline.pipeline_module",
                        lambda meta, layout, build, **k: build(meta) or meta)
    build_pipeline(spec_of(shape), shape, Layout(tp=1, pp=2, dp=1), seed=7, device=torch.device("cpu"),
                   partition_method="parameters", activation_checkpointing=False, init=False)
    assert drawn == []
