"""The planner's formulas against the published tables and zoo's own model.

- ZeRO (Rajbhandari et al. 2020, figure 1 / section 5): 7.5B parameters, Adam with mixed
  precision (K = 12), 64-way data parallelism: 120 GB baseline, 31.4 GB with optimizer-state
  partitioning, 16.6 GB with gradients too, 1.9 GB with parameters too.
- Korthikanti et al. 2022, table 2: activation bytes per transformer layer, evaluated for
  GPT-3 175B (a = 96, h = 12288, s = 2048) with t = 8, b = 1; and section 4.2's note that
  5as/h = 80 for GPT-3, so attention's scores are 70% of a layer's activations.
- zoo's GPT: parameter count and the 6N + 12Lhs FLOPs per token.
"""
from __future__ import annotations

import pytest

from zoo.config.schema import ModelConfig
from zoo.families.registry import family_of_shape as spec_of
from zoo.families.registry import model_dims
from zoo.families.transformer import padded_vocab
from zoo.parallel.build import count_parameters
from zoo.plan.describe import describe_model
from zoo.plan.layout import PlanLayout, stage_layer_counts
from zoo.plan.memory import model_state_bytes, moment_bytes, stage_memory
from zoo.plan.model_desc import Activations, gpt_layer_activations
from zoo.plan.step_time import training_flops_per_token

GB = 1e9


@pytest.mark.parametrize("stage, total_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_zero_paper_7_5b_on_64_ranks(stage, total_gb, dtype):
    assert model_state_bytes(7.5e9, 64, stage, dtype).total / GB == pytest.approx(total_gb, abs=0.05)


def test_zero_bytes_per_parameter():
    def per_param(stage, dtype, dp=1):
        m = model_state_bytes(1, dp, stage, dtype)
        return m.params, m.grads, m.optimizer

    assert per_param(0, "bf16") == (2, 2, 12)
    assert per_param(0, "fp32") == (4, 4, 8)
    assert per_param(1, "fp32", dp=4) == (4, 4, 3)  # DeepSpeed's fp32 master clone + 2 moments, over 4 ranks
    assert per_param(3, "bf16", dp=4) == (0.5, 0.5, 3)


def test_the_optimizers_own_state_is_counted():
    """AdamW's two fp32 moments, SGD's one momentum buffer (none without momentum); the fp32 master
    copy stays where it was (mixed precision, or any ZeRO stage)."""
    assert (moment_bytes("adamw"), moment_bytes("sgd", 0.9), moment_bytes("sgd", 0.0)) == (8, 4, 0)
    sgd = moment_bytes("sgd", 0.9)
    assert model_state_bytes(1, 1, 0, "fp32", sgd).optimizer == 4
    assert model_state_bytes(1, 1, 0, "bf16", sgd).optimizer == 8
    assert model_state_bytes(1, 4, 1, "fp32", 0).optimizer == 1  # the master clone alone, over 4 ranks
    with pytest.raises(ValueError, match="optim.name='lion': the planner knows adamw and sgd"):
        moment_bytes("lion")


S, H, A, T = 2048, 12288, 96, 8  # GPT-3 175B; Korthikanti's tensor-parallel size


def korthikanti_layer(tp, sp, scores, recompute=False):
    """Bytes per layer for one sequence (b = 1) by zoo's decomposition, 2-byte activations with dropout."""
    if recompute:
        return Activations(sp_elems=H).bytes_per_token(2, tp, False) * S
    acts = gpt_layer_activations(H, A, S, 4 * H, dropout=True, stores_attention_scores=scores)
    return acts.bytes_per_token(2, tp, sp) * S


@pytest.mark.parametrize("row, got, formula", [
    ("no parallelism", lambda: korthikanti_layer(1, False, True), S * H * (34 + 5 * A * S / H)),
    ("tensor parallel", lambda: korthikanti_layer(T, False, True), S * H * (10 + 24 / T + 5 * A * S / (H * T))),
    ("tensor + sequence parallel", lambda: korthikanti_layer(T, True, True), S * H * (34 / T + 5 * A * S / (H * T))),
    ("tensor parallel + selective recompute", lambda: korthikanti_layer(T, False, False), S * H * (10 + 24 / T)),
    ("tensor + sequence parallel + selective", lambda: korthikanti_layer(T, True, False), S * H * 34 / T),
    ("full recompute", lambda: korthikanti_layer(T, True, True, recompute=True), S * H * 2),
])
def test_korthikanti_table_2_for_gpt3_175b(row, got, formula):
    assert got() == pytest.approx(formula, rel=1e-12), row


def test_korthikanti_gpt3_attention_share():
    assert 5 * A * S / H == 80
    no_par = korthikanti_layer(1, False, True)
    assert no_par / GB == pytest.approx(2.869, abs=1e-3)  # sbh(34 + 80) bytes, s=2048, b=1
    assert 1 - korthikanti_layer(1, False, False) / no_par == pytest.approx(80 / 114)  # 70%


def test_zoo_gpt_keeps_no_attention_scores():
    """zoo's attention is fused (scaled_dot_product_attention): without dropout a layer keeps
    32 bytes per token per hidden unit in bf16, Korthikanti's 34 minus the two dropout masks."""
    desc = describe_model(ModelConfig(family="gpt", size="gpt3-175b"), 50257)
    assert desc.layers[0].activations.bytes_per_token(2, 1, False) == 32 * H


def test_first_stage_holds_the_whole_models_layer_activations():
    """Korthikanti section 4.3: with 1F1B the first stage holds p micro-batches of L/p layers,
    so its layer activations are those of all L layers for one micro-batch, whatever p (and at
    pp=1 the head's, with its backward's float32 gradient of the logits)."""
    desc = describe_model(ModelConfig(family="gpt", size="gpt3-175b"), 50257)
    layer = desc.layers[0].activations.bytes_per_token(2, 8, True) * S
    for pp in (1, 2, 4, 8, 16):
        lay = PlanLayout(tp=8, pp=pp, dp=1, micro_batch_size=1, grad_accum=64)
        mem = stage_memory(desc, lay, 0, dtype="bf16", sequence_parallel=True, bucket_elems=0)
        head = desc.head.activations.bytes_per_token(2, 8, True) + desc.head.backward_extra.bytes_per_token(2, 8, True)
        ends = desc.embedding.activations.bytes_per_token(2, 8, True) * S * pp + (head * S if pp == 1 else 0)
        assert mem.activations - ends == pytest.approx(96 * layer)


@pytest.mark.parametrize("size", ["tiny", "small", "medium", "gpt3-1.3b"])
def test_parameter_count_equals_the_built_model(size):
    cfg = ModelConfig(family="gpt", size=size)
    desc = describe_model(cfg, 50257)
    assert desc.num_params == count_parameters(spec_of(model_dims(cfg, padded_vocab(50257, cfg))), model_dims(cfg, padded_vocab(50257, cfg)))


def test_gpt3_175b_size_and_flops_per_token():
    desc = describe_model(ModelConfig(family="gpt", size="gpt3-175b"), 50257)
    assert desc.num_params / 1e9 == pytest.approx(174.6, abs=0.1)
    pieces = [desc.embedding, *desc.layers, desc.head]
    flops = training_flops_per_token(pieces, list(desc.layers), checkpointing=False)
    assert flops == pytest.approx(6 * desc.num_params + 12 * 96 * H * S, rel=1e-3)
    recompute = training_flops_per_token(pieces, list(desc.layers), checkpointing=True)
    assert recompute / flops == pytest.approx(4 / 3, rel=2e-3)


def test_stage_layer_counts():
    assert stage_layer_counts(96, 16) == [6] * 16
    assert stage_layer_counts(12, 5) == [3, 3, 2, 2, 2]
    assert sum(stage_layer_counts(44, 8)) == 44


def test_the_document_mask_is_one_mask_a_micro_batch_in_flight_as_the_model_keeps_it():
    """data.document_mask: a stage keeps one (B, 1, T, T) mask in the dtype per micro-batch in
    flight (zoo.models.documents.attention_mask), whole on every tp rank; the planner's term is
    what the built model keeps for its backward beyond the causal model's, but for the
    positions (8 bytes a token)."""
    import torch

    from tests.unit.models.test_document_mask import saved_tensors
    from zoo.models.gpt import gpt_shape
    from zoo.parallel.build import build_model

    cfg = ModelConfig(family="gpt", size="tiny", n_layer=2, block_size=32)
    desc = describe_model(cfg, 256)
    T, B = 32, 3

    def extra(lay, stage):
        args = dict(dtype="fp32", sequence_parallel=True, bucket_elems=0)
        return (stage_memory(desc, lay, stage, document_mask=True, **args).activations
                - stage_memory(desc, lay, stage, **args).activations)

    assert extra(PlanLayout(tp=1, pp=1, dp=1, micro_batch_size=B, grad_accum=1), 0) == B * T * T * 4
    pp2 = PlanLayout(tp=2, pp=2, dp=1, micro_batch_size=B, grad_accum=4)
    assert (extra(pp2, 0), extra(pp2, 1)) == (2 * B * T * T * 4, B * T * T * 4)  # 2 in flight, then 1; tp splits none

    def kept(model, x):  # bytes of the distinct storages kept for the backward
        return sum(dict((ptr, n) for ptr, n, _ in saved_tensors(model, x[:, :-1], x[:, 1:])).values())

    shape = gpt_shape("tiny", 256, n_layer=2, block_size=T)
    x = torch.randint(2, 256, (B, T + 1), generator=torch.Generator().manual_seed(0))
    x[:, 10] = 1
    causal = build_model(spec_of(shape), shape, seed=0, device=torch.device("cpu"))
    masked = build_model(spec_of(shape), shape, seed=0, device=torch.device("cpu"), document_end=1)
    beyond = kept(masked, x) - kept(causal, x) - B * T * T * 4
    assert 0 <= beyond <= B * T * 8, beyond  # the rest: the (B, T) int64 positions, not the planner's to count
