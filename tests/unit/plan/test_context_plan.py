"""The planner with context parallelism: a rank's activations are its share of each sequence
plus what cp adds (the gathered keys and values where they are kept, one layer's in the
backward where they are recomputed, the chunks' masks where they are built); the model states
partition over dp x cp; cp's gathers cost time; the search offers cp beside tp inside a node
(GPT and Llama, no pipeline, 2 x cp dividing the sequence) and picks it for a long sequence that
a dp degree cannot split; parallel=auto keeps a cp given on the command line and sets the one it
plans. (Each rank's kept bytes against autograd's: benchmarks/context_parallel.py.)"""
from __future__ import annotations

import dataclasses

import pytest

from tests.unit.plan.test_auto import _plan
from zoo.config.schema import ModelConfig
from zoo.plan.describe import describe_model
from zoo.plan.layout import PlanLayout
from zoo.plan.memory import layout_memory
from zoo.plan.search import enumerate_layouts, recommend
from zoo.plan.settings import ClusterConfig, PlanConfig
from zoo.plan.step_time import step_time

T = 8192


def llama(**kw):
    return describe_model(ModelConfig(family="llama", size="tiny", block_size=T, vocab_size=4096, **kw), 4096)


def _acts(desc, cp, **kw):
    return layout_memory(desc, PlanLayout(tp=1, pp=1, dp=1, cp=cp), dtype="bf16", sequence_parallel=False, **kw)


def test_a_rank_keeps_its_share_and_what_cp_adds():
    desc = llama()
    one, two = _acts(desc, 1), _acts(desc, 2)
    gathered = T / 2 * desc.kv_width * 2  # a layer's keys and values of the other rank's half, bf16
    kept = _acts(desc, 2, cp_recompute=False)  # and the attention's output twice, its share's tokens
    assert desc.cp_kept_extra == desc.hidden_size
    assert kept.activations - two.activations == pytest.approx(
        (desc.n_layer - 1) * gathered + desc.n_layer * T / 2 * desc.cp_kept_extra * 2)
    share = one.activations - T * desc.head.backward_extra.bytes_per_token(2, 1, False)  # less the transient
    assert two.activations - gathered - T / 2 * desc.head.backward_extra.bytes_per_token(2, 1, False) == \
        pytest.approx(share / 2)
    masked = _acts(desc, 2, builds_causal_masks=True)
    c = T / 4
    assert masked.activations - two.activations == pytest.approx(c * 5 * c)  # c x (2cp + 1)c, boolean
    docs = _acts(desc, 2, document_mask=True)  # the documents' mask is the chunks' rows too
    assert docs.activations - two.activations == pytest.approx(c * 5 * c)
    kept_masks = _acts(desc, 2, builds_causal_masks=True, cp_recompute=False)  # additive, in bf16: SDPA keeps them
    assert kept_masks.activations - kept.activations == pytest.approx(c * 5 * c * 2)
    assert _acts(desc, 1, document_mask=True).activations - one.activations == pytest.approx(T * T * 2)


def test_the_model_states_partition_over_dp_x_cp_and_the_gathers_cost_time():
    desc, cluster = llama(), ClusterConfig(name="x", gpus_per_node=8)
    cp2 = PlanLayout(tp=1, pp=1, dp=1, cp=2, zero_stage=1)
    dp2 = PlanLayout(tp=1, pp=1, dp=2, zero_stage=1)
    a, b = (layout_memory(desc, lay, dtype="bf16") for lay in (cp2, dp2))
    assert (a.params, a.grads, a.optimizer) == (b.params, b.grads, b.optimizer)
    kept, recomputed = (step_time(desc, cp2, cluster, dtype="bf16", cp_recompute=r) for r in (False, True))
    assert kept.cp_comm > 0 and recomputed.cp_comm == pytest.approx(1.5 * kept.cp_comm)  # a third gather a layer
    assert recomputed.compute > kept.compute  # attention's forward again
    assert step_time(desc, dp2, cluster, dtype="bf16").cp_comm == 0


def test_the_search_offers_cp_inside_the_node_for_the_decoders_only():
    cluster = ClusterConfig(name="x", gpus_per_node=8)
    found = [c.layout for c in enumerate_layouts(llama(), cluster, 8)]
    cps = {lay.cp for lay in found}
    assert cps == {1, 2, 4, 8}
    assert all(8 % (lay.tp * lay.cp) == 0 for lay in found if lay.cp > 1)
    assert any(lay.cp == 2 and lay.pp == 2 for lay in found)  # cp inside each pipeline stage
    assert any(lay.tp == 2 and lay.cp == 4 for lay in found)
    restricted = enumerate_layouts(llama(), cluster, 8, plan=dataclasses.replace(PlanConfig(), cp=[2]))
    assert {c.layout.cp for c in restricted} == {2}
    odd = describe_model(ModelConfig(family="llama", size="tiny", block_size=12, vocab_size=4096), 4096)
    assert {c.layout.cp for c in enumerate_layouts(odd, cluster, 8)} == {1, 2}  # 2 x 4 does not divide 12
    no_cp = dataclasses.replace(llama(), kv_width=0)  # a family without context parallelism
    assert {c.layout.cp for c in enumerate_layouts(no_cp, cluster, 8)} == {1}


def test_a_long_sequence_a_dp_degree_cannot_split_is_planned_with_cp():
    cpu = ClusterConfig(name="cpu", gpus_per_node=4, gpu_mem_gb=10, peak_tflops=0.095, fp32_tflops=0.04, hbm_gbps=4,
                        intra_node_gbps=2, inter_node_gbps=1.25, mfu=0.88, comm_efficiency=0.5,
                        builds_causal_masks=True)
    desc = describe_model(ModelConfig(family="llama", size="tiny", block_size=32768, vocab_size=4096), 4096)
    best = recommend(enumerate_layouts(desc, cpu, 1))  # one sequence a step: dp = 1
    assert best.layout.cp > 1 and best.layout.dp == 1 and best.fits


def test_parallel_auto_keeps_a_given_cp_and_sets_the_one_it_plans():
    cfg, lines = _plan("model=llama", "model.block_size=256", "parallel.cp=2", "trainer.global_batch_size=8")
    assert cfg.parallel.cp == 2 and cfg.parallel.tp * cfg.parallel.cp * cfg.parallel.pp * cfg.parallel.dp == 4
    assert "kept parallel.cp=2" in lines[0] and " cp=2 " in lines[0]
    cfg, _ = _plan("model=llama", "model.block_size=32768", "trainer.global_batch_size=1", "trainer.micro_batch_size=1",
                   "model.activation_checkpointing=false", "parallel.cp_recompute=false", device_gb=64)
    assert cfg.parallel.cp > 1 and cfg.parallel.cp_recompute is False


def test_a_sliding_window_shorter_than_the_sequence_builds_the_chunks_masks_on_cuda_too():
    """No unbuilt causal bias takes a window: Mistral's chunks' masks are counted where the causal
    ones are not (CUDA), a byte an element where cp's attention is recomputed."""
    window = describe_model(ModelConfig(family="llama", size="mistral-tiny", block_size=T, sliding_window=512), 4096)
    whole = describe_model(ModelConfig(family="llama", size="mistral-tiny", block_size=T, sliding_window=T), 4096)
    assert window.windowed and not whole.windowed and not llama().windowed
    c = T / 4
    assert _acts(window, 2).activations - _acts(whole, 2).activations == pytest.approx(c * 5 * c)
    # without cp, zoo.models.sliding_window's additive mask: one (T, T) for every causal block, or a
    # windowed copy of each micro-batch's document mask
    assert _acts(window, 1).activations - _acts(whole, 1).activations == pytest.approx(T * T * 2)
    docs = [_acts(d, 1, document_mask=True).activations for d in (window, whole)]
    assert docs[0] - docs[1] == pytest.approx(T * T * 2)  # micro-batch 1
