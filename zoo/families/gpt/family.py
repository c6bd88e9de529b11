"""The GPT family: zoo's GPT-2 decoder (`zoo.models.gpt`) as a causal language model on
packed token blocks; tensor parallelism by heads and MLP columns (vocab-parallel embedding,
head and loss, optional sequence parallelism), `GPT2LMHeadModel` in and out, planned."""
from __future__ import annotations

from zoo.families import data_keys
from zoo.families.causal_lm_task import CausalLMTask
from zoo.families.gpt import hf, planner
from zoo.families.spec import FamilySpec, HFConverter
from zoo.families.transformer import (
    check_transformer,
    shape_from_config,
    transformer_flops_per_sample,
)
from zoo.models.gpt import GPT, GPT_PUBLISHED, GPT_SIZES, GPTShape, gpt_init_std, gpt_shape
from zoo.parallel.cross_entropy import TokenLoss
from zoo.parallel.tp_rules import TPRules

TP_RULES = TPRules(
    layers=(
        ("embed.wte", "vocab"),
        ("h.*.attn.c_attn", "column_qkv"),
        ("h.*.attn.c_proj", "row"),
        ("h.*.mlp.c_fc", "column"),
        ("h.*.mlp.c_proj", "row"),
        ("lm_head", "head"),
    ),
    ties=(("lm_head.weight", "embed.wte.weight"),),
    embedding="embed",
    # Replicated, but with sequence parallelism they see only this rank's share of the sequence.
    sequence_parallel_norms=("h.*.ln_1", "h.*.ln_2", "ln_f"),
)


def _shape(cfg, vocab_size=None, pad_token_id=0) -> GPTShape:
    return shape_from_config(gpt_shape, cfg, vocab_size)


SPEC = FamilySpec(
    name="gpt", model=GPT, shape_type=GPTShape, shape=_shape, task=CausalLMTask,
    init_std=lambda shape, _module: (lambda name: gpt_init_std(name, shape)),
    check=lambda cfg, layout, warnings: check_transformer(SPEC, cfg, layout, warnings),
    data_sources=("pydoc", "files", "hub", "prepared", "chat"), reads="text",
    mix_sources=("pydoc", "files", "hub", "prepared"),
    sizes=tuple(GPT_SIZES), published=GPT_PUBLISHED, data_keys=data_keys.CAUSAL_TEXT, generates_text=True, context_parallel=True,
    pipeline_loss=TokenLoss, flops_per_sample=transformer_flops_per_sample, tp_rules=TP_RULES,
    hf=HFConverter.of(hf, model_types=("gpt2",), loads_as="GPT2LMHeadModel",
                   vocab_rows=("embed.wte.weight", "lm_head.weight")),
    planner=planner.describe,
)
