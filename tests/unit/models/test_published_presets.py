"""Every size preset that is a published model builds that model's parameter count with its
published vocabulary, and the planner counts the same and plans the preset with that
vocabulary (#37 item 4: llama3-8b planned as 7.39B with GPT-2's vocabulary, published 8.03B)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from zoo.config.schema import ModelConfig
from zoo.families.registry import FAMILIES
from zoo.plan.describe import describe_model

PRESETS = [(name, size) for name, spec in FAMILIES.items() for size in spec.published]


def _count(module) -> int:
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


def _built(name: str, size: str) -> int:
    spec = FAMILIES[name]
    vocab, _ = spec.published[size]
    with torch.device("meta"):  # no memory: llama2-70b and gpt3-175b too
        return _count(spec.model(spec.shape(ModelConfig(family=name, size=size), vocab)))


def test_the_families_with_presets_publish_them():
    assert {n for n, _ in PRESETS} == {"gpt", "llama", "bert"}
    assert {s for n, s in PRESETS if n == "llama"} == {"smollm-135m", "tinyllama-1.1b", "llama2-7b", "llama3-8b",
                                                       "llama2-70b", "qwen2.5-0.5b", "qwen3-0.6b", "mistral-7b"}
    assert all(size in FAMILIES[n].sizes for n, size in PRESETS)


@pytest.mark.parametrize("name,size", PRESETS, ids=[f"{n}-{s}" for n, s in PRESETS])
def test_a_preset_builds_its_published_parameter_count(name, size):
    published = FAMILIES[name].published[size][1]
    built = _built(name, size)
    if published % 10**6:  # an exact count (transformers' num_parameters of the checkpoint)
        assert built == published
    else:  # the GPT-3 paper's table rounds its counts
        assert built == pytest.approx(published, rel=0.02)


@pytest.mark.parametrize("name,size", [p for p in PRESETS if FAMILIES[p[0]].planner is not None],
                         ids=lambda v: str(v))
def test_the_planner_counts_what_the_model_builds(name, size):
    vocab, _ = FAMILIES[name].published[size]
    exact = ModelConfig(family=name, size=size, vocab_pad_multiple=1)
    assert describe_model(exact, vocab).num_params == _built(name, size)


def test_a_plan_takes_the_presets_vocabulary_unless_told_another():
    from zoo.plan.search import make_plan
    from zoo.plan.settings import PlanRunConfig

    def planned(size, **plan):
        cfg = PlanRunConfig(model=ModelConfig(family="llama", size=size))
        cfg = dataclasses.replace(cfg, plan=dataclasses.replace(cfg.plan, **plan))
        return make_plan(cfg).desc.num_params

    assert planned("llama3-8b") == 8_030_261_248  # 128,256 is a multiple of 128: no padding
    assert planned("llama2-7b") == 6_738_415_616
    assert planned("llama3-8b", vocab_size=50257) == 8_030_261_248 - 2 * 4096 * (128256 - 50304)
