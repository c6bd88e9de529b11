"""An imported vocabulary that tensor parallelism cannot split is padded inside zoo: zero
rows at import (zoo.checkpoint.hf_weights.read_hf, read slice by slice), the pad tokens' logits masked
(HeadLogits), the rows stripped at export (zoo.checkpoint.hf_weights.real_rows). The padded model's logits and loss equal transformers' on the
unpadded weights; under tp=2 the masked shard equals tp=1."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.unit.parallel._dist import run_ranks
from tests.unit.parallel.test_gpt_tp import check_tp_equivalence
from zoo.checkpoint.consolidate import assign_full_weights
from zoo.checkpoint.hf_weights import read_hf, real_rows
from zoo.families.registry import family
from zoo.models.causal_lm import HeadLogits
from zoo.models.gpt import GPT, GPTShape, gpt_shape
from zoo.models.llama import LlamaForCausalLM, LlamaShape, llama_shape

VOCAB = 1001  # not divisible by 2: imported as 1024 with vocab_pad_multiple=128


def save_hf(kind, directory, vocab=VOCAB):
    torch.manual_seed(0)
    if kind == "llama":
        from transformers import LlamaConfig
        from transformers import LlamaForCausalLM as HF

        config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                             tie_word_embeddings=False, attn_implementation="eager")
    else:
        from transformers import GPT2Config
        from transformers import GPT2LMHeadModel as HF

        config = GPT2Config(vocab_size=vocab, n_positions=128, n_embd=64, n_layer=2, n_head=4,
                            activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = HF(config).eval()
    model.save_pretrained(str(directory), safe_serialization=True)
    return model


@pytest.mark.parametrize("kind, shape_type, model_type", [("llama", LlamaShape, LlamaForCausalLM),
                                                          ("gpt", GPTShape, GPT)], ids=["llama", "gpt"])
def test_padded_import_gives_transformers_logits_and_loss_and_strips_back(tmp_path, kind, shape_type, model_type):
    hf = save_hf(kind, tmp_path)
    meta, state = read_hf(tmp_path, family(kind), pad_multiple=128)
    assert (meta["vocab_size"], meta["vocab_real"]) == (1024, VOCAB)
    for key in family(kind).hf.vocab_rows:
        if key in state:
            assert state.full(key).shape[0] == 1024 and not state.full(key)[VOCAB:].any(), key
    ours = model_type(shape_type(**meta)).eval()
    assign_full_weights(ours, state)  # as a rank's build does it: each parameter's slices
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits, theirs = ours(ids), hf(ids).logits
        torch.testing.assert_close(logits[..., :VOCAB], theirs, rtol=1e-4, atol=1e-4)
        assert (logits[..., VOCAB:] == torch.finfo(logits.dtype).min).all()
        torch.testing.assert_close(ours(ids[:, :-1], ids[:, 1:]), hf(ids, labels=ids).loss, rtol=1e-5, atol=1e-5)
    # Without the mask the pad tokens' zero logits would take probability mass: the loss differs.
    unmasked = torch.nn.functional.cross_entropy(torch.cat([theirs, torch.zeros(2, 24, 1024 - VOCAB)], -1)[:, :-1]
                                                 .flatten(0, 1), ids[:, 1:].flatten())
    assert abs(unmasked - hf(ids, labels=ids).loss) > 1e-3
    assert all(real_rows(family(kind), meta, k) == VOCAB for k in family(kind).hf.vocab_rows)
    assert real_rows(family(kind), {**meta, "vocab_real": None}, family(kind).hf.vocab_rows[0]) is None


def test_a_vocabulary_that_divides_is_imported_as_it_is(tmp_path):
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM as HF

    HF(LlamaConfig(vocab_size=1024, hidden_size=64, intermediate_size=160, num_hidden_layers=1,
                   num_attention_heads=4, num_key_value_heads=2)).save_pretrained(str(tmp_path))
    meta, state = read_hf(tmp_path, family("llama"), pad_multiple=128)
    assert meta["vocab_size"] == 1024 and "vocab_real" not in meta


def test_the_mask_follows_the_rank_of_a_sharded_head():
    class Shard(torch.nn.Module):  # the second half of a 256-token head split over tp=2
        gather_output, output_start = False, 128

        def forward(self, x):
            return torch.zeros(*x.shape[:-1], 128)

    root = torch.nn.Module()
    root.lm_head = Shard()
    out = HeadLogits(250)(root, torch.zeros(1, 3, 8))
    low = torch.finfo(out.dtype).min
    assert (out[..., :122] == 0).all() and (out[..., 122:] == low).all()  # tokens 250..255 of this shard
    root.lm_head = torch.nn.Linear(8, 256)
    assert (HeadLogits(250)(root, torch.zeros(1, 3, 8))[..., 250:] == low).all()


def _padded_equivalence(rank, world, kind, sequence_parallel):
    shape = (llama_shape("tiny", 256, n_layer=2, block_size=16) if kind == "llama"
             else gpt_shape("tiny", 256, n_layer=2, block_size=16))
    # rank 1 holds tokens 128..255: 56 of them pad
    check_tp_equivalence(dataclasses.replace(shape, vocab_real=200), sequence_parallel)


@pytest.mark.parametrize("kind, sequence_parallel", [("llama", False), ("gpt", True)])
def test_padded_vocabulary_under_tp2_matches_tp1(kind, sequence_parallel):
    run_ranks(2, _padded_equivalence, kind, sequence_parallel)
