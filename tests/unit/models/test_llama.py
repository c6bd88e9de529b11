"""The Llama decoder: transformers' LlamaForCausalLM's logits from the same weights (GQA on),
its layers as the pipeline cuts them, and tensor parallelism (with and without sequence
parallelism) against tp=1: initial shards, logits, loss and every gradient."""
from __future__ import annotations

import pytest
import torch

from tests.unit.parallel._dist import run_ranks
from tests.unit.parallel.test_gpt_tp import check_tp_equivalence
from zoo.families.registry import family_of_shape as spec_of
from zoo.models.llama import LLAMA_SIZES, LlamaForCausalLM, llama_shape
from zoo.parallel.build import count_parameters

CPU = torch.device("cpu")


def _hf_twin(shape):
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM as HFLlama

    config = LlamaConfig(vocab_size=shape.vocab_size, hidden_size=shape.n_embd, intermediate_size=shape.intermediate_size,
                         num_hidden_layers=shape.n_layer, num_attention_heads=shape.n_head,
                         num_key_value_heads=shape.n_kv_head, max_position_embeddings=shape.block_size,
                         rope_theta=shape.rope_theta, rms_norm_eps=shape.rms_norm_eps,
                         tie_word_embeddings=shape.tie_embeddings,
                         attn_implementation="eager")
    torch.manual_seed(0)
    return HFLlama(config).eval()


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_logits_equal_transformers_llama_with_grouped_query_attention(tied):
    shape = llama_shape("tiny", 512, n_layer=2, tie_embeddings=tied)
    assert (shape.n_head, shape.n_kv_head) == (4, 2)
    hf = _hf_twin(shape)
    ours = LlamaForCausalLM(shape).eval()
    missing, unexpected = ours.load_state_dict(hf.state_dict(), strict=False)
    assert not missing and all(k.endswith("rotary_emb.inv_freq") for k in unexpected), (missing, unexpected)
    idx = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), hf(idx).logits, rtol=1e-4, atol=1e-4)
    assert count_parameters(spec_of(shape), shape) == sum(p.numel() for p in hf.parameters())


@pytest.mark.parametrize("size", sorted(LLAMA_SIZES))
def test_named_sizes_have_whole_even_heads(size):
    shape = llama_shape(size, 32000)
    assert shape.n_head % shape.n_kv_head == 0 and shape.n_embd % shape.n_head == 0 and shape.head_dim % 2 == 0


def test_pipeline_layers_hold_every_parameter_once():
    with torch.device("meta"):
        meta = LlamaForCausalLM(llama_shape("tiny", 512))
    held = [n for layer in meta.pipeline_layers() for path in layer.paths
            for n, _ in meta.get_submodule(path).named_parameters(prefix=path)]
    assert sorted(held) == sorted(n for n, _ in meta.named_parameters())


def _equivalence(rank, world, sequence_parallel):
    check_tp_equivalence(llama_shape("tiny", 256, n_layer=2, block_size=16), sequence_parallel)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_llama_tp2_matches_tp1(sequence_parallel):
    run_ranks(2, _equivalence, sequence_parallel)


def _variant(rank, world, dims, sequence_parallel):
    check_tp_equivalence(llama_shape("tiny", 256, n_layer=2, block_size=16, **dims), sequence_parallel)


@pytest.mark.parametrize("dims, sequence_parallel", [
    (dict(n_kv_head=1), False),  # multi-query: both ranks hold the one key/value head
    (dict(n_head=6, n_kv_head=3, n_embd=96), True),  # rank 0's queries use kv heads 0, 0, 1; rank 1's 1, 2, 2
    (dict(tie_embeddings=True), True),
], ids=["mqa-replicated", "kv3-replicated-sp", "tied-sp"])
def test_llama_variants_tp2_match_tp1(dims, sequence_parallel):
    """Key/value heads tp=2 cannot split are replicated (their gradients summed over tp), and a
    tied head shares the vocab-parallel embedding's shard: tp=1's logits, loss and gradients."""
    run_ranks(2, _variant, dims, sequence_parallel)
