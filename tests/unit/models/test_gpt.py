"""GPT shapes, parameter counts and the layout-independent initialisation."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zoo.families.registry import family_of_shape as spec_of
from zoo.models.gpt import GPT_SIZES, gpt_init_std, gpt_shape
from zoo.models.init import normal_param
from zoo.parallel.build import build_model, count_parameters
from zoo.parallel.sharding import ShardSpec, shard_tensor


@pytest.mark.parametrize("size, expected", [
    # Hugging Face's gpt2, gpt2-medium, gpt2-large, gpt2-xl (vocab 50257, 1024 positions).
    ("small", 124_439_808), ("medium", 354_823_168), ("large", 774_030_080), ("xl", 1_557_611_200)])
def test_gpt2_parameter_counts(size, expected):
    assert count_parameters(spec_of(gpt_shape(size, 50257)), gpt_shape(size, 50257)) == expected


def test_gpt3_family_is_defined_for_planning():
    assert count_parameters(spec_of(gpt_shape("gpt3-125m", 50257)), gpt_shape("gpt3-125m", 50257)) == pytest.approx(125e6, rel=0.02)
    assert {k for k in GPT_SIZES if k.startswith("gpt3-")} >= {"gpt3-125m", "gpt3-1.3b", "gpt3-175b"}


def test_forward_shapes_loss_and_tied_head():
    shape = gpt_shape("tiny", 256, block_size=16)
    model = build_model(spec_of(shape), shape, seed=0, device=torch.device("cpu"))
    idx = torch.randint(0, 256, (3, 16))
    logits = model(idx)
    assert logits.shape == (3, 16, 256)  # (B, T, V)
    targets = torch.randint(0, 256, (3, 16))
    torch.testing.assert_close(model(idx, targets), F.cross_entropy(logits.flatten(0, 1), targets.flatten()))
    assert model.lm_head.weight is model.embed.wte.weight
    out = model.generate(idx[:1, :4], 5, generator=torch.Generator().manual_seed(0))
    assert out.shape == (1, 9)


def test_init_is_a_function_of_seed_and_name():
    shape = gpt_shape("tiny", 256, block_size=16)
    a = build_model(spec_of(shape), shape, seed=3, device=torch.device("cpu")).state_dict()
    b = build_model(spec_of(shape), shape, seed=3, device=torch.device("cpu")).state_dict()
    c = build_model(spec_of(shape), shape, seed=4, device=torch.device("cpu")).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["h.0.attn.c_attn.weight"], c["h.0.attn.c_attn.weight"])
    std = a["h.0.mlp.c_fc.weight"].std().item()
    assert 0.018 < std < 0.022 and a["h.0.ln_1.weight"].eq(1).all() and a["h.0.attn.c_attn.bias"].eq(0).all()
    assert a["h.1.mlp.c_proj.weight"].std().item() < 0.02 / 2  # residual projections scaled by 1/sqrt(2L)


@pytest.mark.parametrize("full_shape, dim, chunks", [((300, 24), 0, 1), ((96, 40), 0, 3), ((24, 200), 1, 1),
                                                     ((70, 1408), 1, 1), ((260, 600), 0, 1), ((520,), 0, 1)])
@pytest.mark.parametrize("world", [2, 4])
def test_a_shard_is_exactly_the_slice_of_the_full_init(full_shape, dim, chunks, world):
    name = "h.0.attn.c_attn.weight"
    full = normal_param(torch.empty(full_shape), name, seed=7, std=0.02)
    for rank in range(world):
        spec = ShardSpec(dim=dim, rank=rank, world=world, chunks=chunks)
        shard = torch.empty(shard_tensor(full, spec).shape)
        shard.tp_shard = spec
        assert torch.equal(normal_param(shard, name, seed=7, std=0.02), shard_tensor(full, spec))


@pytest.mark.parametrize("world", [2, 4, 8])
def test_a_row_parallel_shard_draws_its_share_not_the_whole_tensor(monkeypatch, world):
    """A shard along dim 1 (o_proj, down_proj, c_proj under tp) draws the tiles it overlaps:
    its share plus at most a tile's width at each edge. It drew the whole tensor before."""
    import zoo.models.init as init

    drawn = []
    real = torch.randn

    def counted(*size, **kw):
        out = real(*size, **kw)
        drawn.append(out.numel())
        return out

    monkeypatch.setattr(torch, "randn", counted)
    full_shape = (512, 5632)  # TinyLlama's down_proj, 512 rows of it
    for rank in range(world):
        spec = ShardSpec(dim=1, rank=rank, world=world)
        shard = torch.empty(full_shape[0], full_shape[1] // world)
        shard.tp_shard = spec
        drawn.clear()
        normal_param(shard, "model.layers.0.mlp.down_proj.weight", seed=1, std=0.02)
        assert shard.numel() <= sum(drawn) <= shard.numel() + 2 * full_shape[0] * init.COLS_PER_TILE


def test_init_std_policy():
    shape = gpt_shape("small", 50257)
    assert gpt_init_std("embed.wte.weight", shape) == 0.02
    assert gpt_init_std("h.3.attn.c_proj.weight", shape) == pytest.approx(0.02 / (24 ** 0.5))
    assert gpt_init_std("h.3.ln_1.weight", shape) is None and gpt_init_std("h.3.mlp.c_fc.bias", shape) is None
