"""A Hugging Face import read slice by slice (zoo.checkpoint.hf_weights.HFWeights): a tensor-parallel
shard of a transposed, fused or vocabulary-padded tensor equals the same shard cut from the
whole tensor, and reading it reads about the shard's bytes, not the tensor's."""
from __future__ import annotations

import torch

from tests.unit.models.test_vocab_padding import VOCAB, save_hf
from zoo.checkpoint import sharded
from zoo.checkpoint.hf_weights import read_hf
from zoo.families.registry import family
from zoo.parallel.sharding import ShardSpec, shard_tensor


def _shard_of(weights, name, spec):
    full = weights.full(name)
    target = torch.empty(shard_tensor(full, spec).shape)
    target.tp_shard = spec
    weights.fill(name, target)
    return full, target


def test_each_shard_equals_the_same_cut_of_the_whole_tensor(tmp_path, monkeypatch):
    hf = save_hf("gpt", tmp_path)
    meta, weights = read_hf(tmp_path, family("gpt"), pad_multiple=128)
    c_attn = hf.state_dict()["transformer.h.0.attn.c_attn.weight"]  # Conv1D: (in, 3 x out)
    for name, spec in [("h.0.attn.c_attn.weight", ShardSpec(dim=0, rank=1, world=2, chunks=3)),  # fused q, k, v
                       ("h.0.attn.c_proj.weight", ShardSpec(dim=1, rank=0, world=2)),  # row-parallel
                       ("embed.wte.weight", ShardSpec(dim=0, rank=1, world=2)),  # rows 512..1023, 23 of them pad
                       ("h.1.mlp.c_fc.bias", ShardSpec(dim=0, rank=1, world=4))]:
        full, shard = _shard_of(weights, name, spec)
        assert torch.equal(shard, shard_tensor(full, spec)), name
    assert torch.equal(weights.full("h.0.attn.c_attn.weight"), c_attn.t())
    wte = weights.full("embed.wte.weight")
    assert wte.shape == (1024, 64) and not wte[VOCAB:].any() and torch.equal(wte[:VOCAB], hf.transformer.wte.weight)
    read = []
    original = sharded.ShardReader._pread

    def counting(self, offset, nbytes, into=None):
        read.append(nbytes)
        return original(self, offset, nbytes, into)

    monkeypatch.setattr(sharded.ShardReader, "_pread", counting)
    spec = ShardSpec(dim=0, rank=0, world=4, chunks=3)  # a quarter of the fused projection's rows
    target = torch.empty(192 // 4, 64)
    target.tp_shard = spec
    weights.fill("h.0.attn.c_attn.weight", target)
    assert sum(read) == target.numel() * 4  # its own values: a narrow band of the transposed tensor's columns

