"""BERT against Hugging Face's BertForMaskedLM (parameter counts, names, logits and loss with
the same weights), its tensor-parallel and pipeline pieces, and the masked-LM data: the
masking rates, special tokens, per-sample determinism and the padding of bucketed batches."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from zoo.families.registry import family_of_shape as spec_of
from zoo.models.bert import BERT_SIZES, BertForMaskedLM, bert_shape
from zoo.parallel.build import build_model, count_parameters

CPU = torch.device("cpu")


def hf_config(shape):
    from transformers import BertConfig

    return BertConfig(vocab_size=shape.vocab_size, hidden_size=shape.n_embd, num_hidden_layers=shape.n_layer,
                      num_attention_heads=shape.n_head, intermediate_size=shape.ffn_dim,
                      max_position_embeddings=shape.block_size, hidden_act="gelu", layer_norm_eps=1e-12,
                      type_vocab_size=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                      pad_token_id=shape.pad_token_id)


@pytest.mark.parametrize("size, expected", [("base", 109_514_298), ("large", 335_174_458)])
def test_parameter_count_is_hf_bert_for_masked_lm(size, expected):
    from transformers import BertForMaskedLM as HFBert

    shape = bert_shape(size, 30522)
    with torch.device("meta"):
        hf = HFBert(hf_config(shape))
    assert count_parameters(spec_of(shape), shape) == sum(p.numel() for p in hf.parameters()) == expected


def _padded_batch(vocab: int, lengths=(16, 11, 5)):
    g = torch.Generator().manual_seed(0)
    T = max(lengths)
    ids = torch.zeros(len(lengths), T, dtype=torch.long)
    types = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        ids[b, :n] = torch.randint(5, vocab, (n,), generator=g)
        types[b, n // 2:n] = 1
    return ids, types, (ids != 0).long()


def test_logits_and_loss_equal_hf_with_the_same_weights():
    from transformers import BertForMaskedLM as HFBert

    shape = bert_shape("tiny", 256, n_layer=2, block_size=32)
    ours = build_model(spec_of(shape), shape, seed=5, device=CPU).eval()
    hf = HFBert(hf_config(shape)).eval()
    state = ours.state_dict()
    # Every name is HF's; HF also lists the decoder bias under its alias cls.predictions.bias.
    assert set(hf.state_dict()) - set(state) == {"cls.predictions.bias"}
    hf.load_state_dict(state, strict=False)
    assert torch.equal(hf.cls.predictions.bias, state["cls.predictions.decoder.bias"])
    ids, types, mask = _padded_batch(256)
    labels = torch.where((torch.arange(ids.shape[1]) % 3 == 0) & (mask == 1), ids, -100)
    with torch.no_grad():
        expected = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels)
        inputs = torch.stack([ids, types], dim=1)  # (B, 2, T)
        logits = ours(inputs)
        real = mask.bool()
        torch.testing.assert_close(logits[real], expected.logits[real], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours(inputs, labels), expected.loss, rtol=1e-5, atol=1e-6)


def test_padding_changes_nothing_at_real_positions():
    shape = bert_shape("tiny", 256, n_layer=2, block_size=32)
    model = build_model(spec_of(shape), shape, seed=1, device=CPU).eval()
    ids, types, _ = _padded_batch(256)
    with torch.no_grad():
        batch = model(torch.stack([ids, types], 1))
        alone = model(torch.stack([ids[2:, :5], types[2:, :5]], 1))
    torch.testing.assert_close(batch[2, :5], alone[0], rtol=1e-5, atol=1e-5)


def test_sizes_and_init():
    assert BERT_SIZES["base"] == (12, 12, 768, 512) and BERT_SIZES["large"] == (24, 16, 1024, 512)
    sd = build_model(spec_of(bert_shape("tiny", 512)), bert_shape("tiny", 512), seed=3, device=CPU).state_dict()
    assert 0.018 < sd["bert.encoder.layer.0.attention.self.query.weight"].std() < 0.022
    assert sd["bert.embeddings.LayerNorm.weight"].eq(1).all() and sd["cls.predictions.decoder.bias"].eq(0).all()


def test_pipeline_layers_add_up_to_the_model_and_run_its_forward():
    """The layers' parameters (the tied word embeddings counted once) are the model's, and a
    stage layer built alone holds exactly the full model's tensors at the same names."""
    from zoo.parallel.build import materialise
    from zoo.parallel.pipeline import StageLayer

    shape = bert_shape("tiny", 512)
    with torch.device("meta"):
        meta = BertForMaskedLM(shape)
    layers = meta.pipeline_layers()
    held = {n for layer in layers for path in layer.paths for n, _ in meta.get_submodule(path).named_parameters(prefix=path)}
    assert held == {n for n, _ in meta.named_parameters(remove_duplicate=False)}
    full = build_model(spec_of(shape), shape, seed=3, device=CPU).state_dict()
    build = lambda m: materialise(m, spec_of(shape), shape, seed=3, device=CPU)  # noqa: E731
    for index in (0, 2, len(layers) - 1):
        stage = StageLayer(meta, index, build)
        for name, t in stage.state_dict().items():
            assert torch.equal(t, full[name]), name


# -- masked-LM data -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def mlm(tmp_path_factory):
    from transformers import AutoTokenizer

    from data_pipelines.corpus import pydoc_documents
    from data_pipelines.mlm import MLMBatches, load_mlm_samples, prepare_mlm_samples
    from data_pipelines.tokenizer import train_bert_tokenizer

    cache = str(tmp_path_factory.mktemp("mlm_cache"))
    docs = pydoc_documents()[:30]
    tok_dir = str(train_bert_tokenizer(docs, 1024, "pydoc30", cache))
    samples = load_mlm_samples(prepare_mlm_samples(docs, tok_dir, block_size=64, eval_fraction=0.1,
                                                   source_key="pydoc30", cache_dir=cache))
    tok = AutoTokenizer.from_pretrained(tok_dir)
    return samples, tok, MLMBatches(samples, tok, seed=7, mlm_probability=0.15)


def test_samples_are_sentence_pairs_within_the_block(mlm):
    samples, tok, _ = mlm
    assert samples.lengths.max() <= 64 and samples.meta["pairs"] > samples.meta["samples"] // 2
    for i in range(20):
        ids, types = samples.tokens(i)
        a = int(samples.first_lengths[i])
        assert ids[0] == tok.cls_token_id and ids[a - 1] == tok.sep_token_id and ids[-1] == tok.sep_token_id
        assert types[:a].sum() == 0 and types[a:].all()


def test_masking_rates_and_special_tokens(mlm):
    samples, tok, batches = mlm
    selected = masked = randomised = total = 0
    for i in samples.train[:300]:
        ids, _ = samples.tokens(int(i))
        inputs, labels = batches.masker(ids, split=0, epoch=0, sample=int(i))
        chosen = labels != -100
        assert not np.isin(ids[chosen.numpy()], tok.all_special_ids).any(), "a special token was selected"
        assert torch.equal(labels[chosen], torch.from_numpy(ids)[chosen])
        total += int((~torch.from_numpy(np.isin(ids, tok.all_special_ids))).sum())
        selected += int(chosen.sum())
        masked += int((inputs[chosen] == tok.mask_token_id).sum())
        randomised += int(((inputs != torch.from_numpy(ids)) & (inputs != tok.mask_token_id))[chosen].sum())
    assert selected / total == pytest.approx(0.15, abs=0.01)
    assert masked / selected == pytest.approx(0.8, abs=0.03) and randomised / selected == pytest.approx(0.1, abs=0.03)


def test_a_samples_masks_do_not_depend_on_its_batch(mlm):
    samples, tok, batches = mlm
    numbers = samples.train[:6]
    x_all, y_all = batches.batch(numbers, split="train", epochs=[0] * 6)
    x_one, y_one = batches.batch(numbers[4:5], split="train", epochs=[0])
    n = x_one.shape[-1]
    assert torch.equal(x_all[4, :, :n], x_one[0]) and torch.equal(y_all[4, :n], y_one[0])
    assert (x_all[4, 0, n:] == tok.pad_token_id).all() and (y_all[4, n:] == -100).all()
    _, y_next_epoch = batches.batch(numbers[4:5], split="train", epochs=[1])
    assert not torch.equal(y_next_epoch, y_one), "masks should change between epochs"


@pytest.mark.parametrize("pooled", [True, False])
def test_bucketed_batches_pad_little(mlm, pooled):
    from data_pipelines.bucket_stream import PooledBuckets
    from data_pipelines.mlm import BucketedStream
    from data_pipelines.sampler import padding_efficiency

    samples, _, _ = mlm
    lengths = samples.lengths[samples.train]
    assert np.array_equal(samples.length_of(samples.train[:50]), lengths[:50])
    assert samples.tokens_of(samples.train, chunk=7) == int(lengths.sum())
    stream = (PooledBuckets(len(lengths), lambda p: lengths[p], global_batch=16, seed=0) if pooled
              else BucketedStream(lengths, global_batch=16, seed=0))
    bucketed = padding_efficiency((stream.indices(s, 4) for s in range(0, stream.per_epoch, 4)), lengths)
    order = np.random.default_rng(0).permutation(len(lengths))
    shuffled = padding_efficiency((order[s:s + 4] for s in range(0, len(order) - 3, 4)), lengths)
    assert bucketed > 0.97 and bucketed > shuffled
    epoch0 = stream.indices(0, stream.per_epoch)
    assert len(set(epoch0.tolist())) == stream.per_epoch  # an epoch never repeats a sample


def test_the_whole_epoch_order_is_sliced_per_epoch_across_a_boundary():
    """Positions across an epoch boundary, sliced per epoch: the same as one position at a time
    (its padding efficiency: tests/unit/data/test_bucket_stream.py)."""
    from data_pipelines.mlm import BucketedStream

    stream = BucketedStream(np.random.default_rng(1).integers(3, 60, size=203), global_batch=8, seed=3)
    assert np.array_equal(stream.indices(stream.per_epoch - 8, 16),
                          [stream.epoch_order(p // stream.per_epoch)[p % stream.per_epoch]
                           for p in range(stream.per_epoch - 8, stream.per_epoch + 8)])


def test_mean_loss_is_over_masked_positions_only():
    shape = bert_shape("tiny", 128, n_layer=1, block_size=16)
    model = BertForMaskedLM(shape)
    ids, types, _ = _padded_batch(128, (16, 9))
    labels = torch.full_like(ids, -100)
    labels[0, 3], labels[1, 2] = ids[0, 3], ids[1, 2]
    inputs = torch.stack([ids, types], 1)
    logits = model(inputs)
    expected = F.cross_entropy(torch.stack([logits[0, 3], logits[1, 2]]), torch.stack([ids[0, 3], ids[1, 2]]))
    torch.testing.assert_close(model(inputs, labels), expected)


# -- tensor parallelism -------------------------------------------------------------------
def _tp_equivalence(rank, world):
    import torch.distributed as dist

    from zoo.checkpoint.consolidate import full_parameters
    from zoo.parallel.mappings import gather_from_tp_region
    from zoo.parallel.sharding import unshard_tensors

    group = dist.group.WORLD
    shape = bert_shape("tiny", 256, n_layer=2, block_size=32)
    ref = build_model(spec_of(shape), shape, seed=11, device=CPU)
    tp = build_model(spec_of(shape), shape, seed=11, device=CPU, tp_group=group)
    assert tp.cls.predictions.decoder.weight is tp.bert.embeddings.word_embeddings.weight
    full = full_parameters(tp, group)
    for name, p in ref.named_parameters():
        assert torch.equal(full[name], p.detach()), f"initial shard of {name} is not the slice of tp=1"
    ids, types, mask = _padded_batch(256)
    inputs = torch.stack([ids, types], 1)
    labels = torch.where((torch.arange(ids.shape[1]) % 4 == 1) & (mask == 1), ids, -100)
    torch.testing.assert_close(gather_from_tp_region(tp(inputs), group), ref(inputs), rtol=1e-5, atol=1e-5)
    expected = ref(inputs, labels)
    expected.backward()
    loss = tp(inputs, labels)
    loss.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    for name, p in tp.named_parameters():
        grad, spec = p.grad, getattr(p, "tp_shard", None)
        if spec is not None:
            parts = [torch.empty_like(grad) for _ in range(world)]
            dist.all_gather(parts, grad.contiguous(), group=group)
            grad = unshard_tensors(parts, spec.dim, spec.chunks)
        torch.testing.assert_close(grad, ref.get_parameter(name).grad, rtol=1e-5, atol=1e-6,
                                   msg=lambda m: f"{name}: {m}")


def test_bert_tp2_matches_tp1_logits_loss_and_every_gradient():
    from tests.unit.parallel._dist import run_ranks

    run_ranks(2, _tp_equivalence)
