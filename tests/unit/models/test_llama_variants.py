"""Qwen2, Qwen3 and Mistral as variants of zoo's Llama: the logits of transformers' own
Qwen2ForCausalLM, Qwen3ForCausalLM and MistralForCausalLM from the same weights, the config
read and written back unchanged, and the new pieces (Qwen2's q/k/v biases, also on replicated
key/value heads; Qwen3's per-head q/k norms, whose gradients tp sums) under tp=2 against tp=1."""
from __future__ import annotations

import pytest
import torch

from tests.unit.parallel._dist import run_ranks
from tests.unit.parallel.test_gpt_tp import check_tp_equivalence
from zoo.families.llama import hf
from zoo.families.registry import family_of_shape as spec_of
from zoo.models.llama import LlamaForCausalLM, LlamaShape, llama_shape
from zoo.parallel.build import count_parameters
from zoo.run.errors import ConfigError

TINY = dict(vocab_size=512, hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6)
VARIANTS = {
    "qwen2": dict(tie_word_embeddings=True, rope_theta=1e6),
    "qwen3": dict(tie_word_embeddings=True, head_dim=64, rope_theta=1e6),  # heads wider than 128 / 4
    "mistral": dict(tie_word_embeddings=False, sliding_window=64),
}


def _hf_model(kind: str, **extra):
    import transformers

    config = getattr(transformers, hf.CONFIGS[kind])(**TINY, **{**VARIANTS[kind], **extra}, attn_implementation="eager")
    torch.manual_seed(0)
    model = getattr(transformers, hf.CLASSES[kind])(config).eval()
    with torch.no_grad():  # transformers zero-initialises biases and ones the norms: make them count
        for name, p in model.named_parameters():
            if name.endswith(("bias", "norm.weight")):
                p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.mark.parametrize("kind", sorted(VARIANTS))
def test_logits_equal_transformers(kind):
    theirs = _hf_model(kind)
    meta = hf.meta_from_config(theirs.config.to_dict())
    shape = LlamaShape(**meta)
    ours = LlamaForCausalLM(shape).eval()
    missing, unexpected = ours.load_state_dict(theirs.state_dict(), strict=False)
    assert not missing and not [k for k in unexpected if not k.endswith("inv_freq")], (missing, unexpected)
    assert (shape.arch, shape.attention_bias, shape.qk_norm) == (kind, kind == "qwen2", kind == "qwen3")
    idx = torch.randint(0, 512, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), theirs(idx).logits, rtol=1e-5, atol=1e-5)
    assert count_parameters(spec_of(shape), shape) == sum(p.numel() for p in theirs.parameters())


@pytest.mark.parametrize("kind", sorted(VARIANTS))
def test_the_config_written_back_reads_the_same(kind):
    meta = hf.meta_from_config(_hf_model(kind).config.to_dict())
    written = hf.config(meta, eos_token_id=0, pad_token_id=0)
    assert type(written).__name__ == hf.CONFIGS[kind] and written.architectures == [hf.CLASSES[kind]]
    assert hf.meta_from_config(written.to_dict()) == meta


def test_the_rotary_base_is_read_from_transformers_5_rope_parameters():
    """transformers 5 writes rope_theta inside rope_parameters: read as 10000 before (a Llama 3's
    500000 silently lost)."""
    from transformers import LlamaConfig

    written = LlamaConfig(**TINY, rope_theta=500000.0).to_dict()
    assert "rope_theta" not in written  # the layout this test is about
    assert hf.meta_from_config(written)["rope_theta"] == 500000.0
    assert hf.meta_from_config({**written, "rope_parameters": None, "rope_theta": 5e5})["rope_theta"] == 5e5


@pytest.mark.parametrize("scaling", [{"rope_type": "llama3", "factor": 8.0, "rope_theta": 5e5},
                                     {"rope_type": "linear", "factor": 2.0}])
def test_a_scaled_rotary_embedding_is_refused_not_read_as_plain(scaling):
    from transformers import LlamaConfig

    written = LlamaConfig(**TINY).to_dict()
    for cfg in ({**written, "rope_parameters": scaling}, {**written, "rope_scaling": scaling}):
        with pytest.raises(ConfigError, match="rotary scaling"):
            hf.meta_from_config(cfg)


def test_output_projection_biases_are_refused():
    with pytest.raises(ConfigError, match="attention_bias=true on a qwen3 model"):
        hf.meta_from_config({**_hf_model("qwen3").config.to_dict(), "attention_bias": True})


def _tp_variant(rank, world, dims, sequence_parallel):
    check_tp_equivalence(llama_shape("tiny", 256, n_layer=2, block_size=16, **dims), sequence_parallel)


@pytest.mark.parametrize("dims, sequence_parallel", [
    (dict(attention_bias=True), True),  # the biases split with their heads
    (dict(attention_bias=True, n_kv_head=1), False),  # one kv head on both ranks: its bias replicated, summed
    (dict(qk_norm=True, head_size=48), False),  # each rank normalises its own heads: the norm's gradient summed
    (dict(qk_norm=True, attention_bias=True, tie_embeddings=True), True),
], ids=["qwen2-bias-sp", "qwen2-bias-mqa-replicated", "qwen3-qk-norm", "qk-norm-bias-tied-sp"])
def test_variants_tp2_match_tp1(dims, sequence_parallel):
    run_ranks(2, _tp_variant, dims, sequence_parallel)


@pytest.mark.parametrize("documents", [False, True], ids=["causal", "documents"])
def test_a_mistral_window_shorter_than_the_sequence_gives_transformers_logits(documents):
    """sliding_window=16 over 40 tokens: each token sees its 16 latest (transformers' eager
    Mistral); with document masking the window applies inside each document as well."""
    theirs = _hf_model("mistral", sliding_window=16)
    shape = LlamaShape(**hf.meta_from_config(theirs.config.to_dict()))
    assert shape.sliding_window == 16
    ours = LlamaForCausalLM(shape).eval()
    ours.load_state_dict(theirs.state_dict(), strict=False)
    idx = torch.randint(1, 512, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        if not documents:
            torch.testing.assert_close(ours(idx), theirs(idx).logits, rtol=1e-5, atol=1e-5)
            return
        idx[:, 30] = 0  # a document ends at 30: the next starts at 31, its own positions and window
        ours.document_end = 0
        got = ours(idx)
        torch.testing.assert_close(got[:, :31], theirs(idx[:, :31]).logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got[:, 31:], theirs(idx[:, 31:]).logits, rtol=1e-5, atol=1e-5)


def test_decoding_past_the_window_gives_the_full_forwards_logits():
    from zoo.models.kv_cache import decoding

    theirs = _hf_model("mistral", sliding_window=8)
    ours = LlamaForCausalLM(LlamaShape(**hf.meta_from_config(theirs.config.to_dict()))).eval()
    ours.load_state_dict(theirs.state_dict(), strict=False)
    idx = torch.randint(1, 512, (1, 20), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = ours(idx)
        torch.testing.assert_close(full, theirs(idx).logits, rtol=1e-5, atol=1e-5)
        with decoding(ours, 32) as cache:
            step = [ours(idx[:, :12])[:, -1]]
            cache.advance(12)
            for t in range(12, 20):
                step.append(ours(idx[:, t:t + 1])[:, -1])
                cache.advance(1)
    torch.testing.assert_close(torch.stack(step[1:], 1), full[:, 12:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(step[0], full[:, 11], rtol=1e-5, atol=1e-5)
