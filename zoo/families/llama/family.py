"""The Llama family: a Llama-style decoder (`zoo.models.llama`: RMSNorm, RoPE, SwiGLU,
grouped-query attention; Qwen2, Qwen3 and Mistral as its variants) as a causal language model on the same data as GPT; tensor
parallelism by heads (each rank holds whole query heads and the key/value heads they use)
and MLP columns, vocab-parallel embedding, head and loss, sequence parallelism;
`LlamaForCausalLM`, `Qwen2ForCausalLM`, `Qwen3ForCausalLM` and `MistralForCausalLM` in and out."""
from __future__ import annotations

import dataclasses
from typing import List, Tuple

from zoo.families import data_keys
from zoo.families.causal_lm_task import CausalLMTask
from zoo.families.llama import hf, planner
from zoo.families.llama.dims import llama_dims
from zoo.families.spec import FamilySpec, HFConverter
from zoo.families.transformer import check_transformer, imported_dims
from zoo.models.llama import (
    ARCHS,
    LLAMA_PUBLISHED,
    LLAMA_SIZES,
    LlamaForCausalLM,
    LlamaShape,
    llama_flops_per_token,
    llama_init_std,
)
from zoo.parallel.cross_entropy import TokenLoss
from zoo.parallel.tp_rules import KVHeads, TPRules
from zoo.run.errors import ConfigError, require

TP_RULES = TPRules(
    layers=(
        ("model.embed_tokens", "vocab"),
        ("model.layers.*.self_attn.q_proj", "column"),
        ("model.layers.*.self_attn.k_proj", "column"),
        ("model.layers.*.self_attn.v_proj", "column"),
        ("model.layers.*.self_attn.o_proj", "row"),
        ("model.layers.*.mlp.gate_proj", "column"),
        ("model.layers.*.mlp.up_proj", "column"),
        ("model.layers.*.mlp.down_proj", "row"),
        ("lm_head", "head"),
    ),
    embedding="model.embed_tokens",
    # Replicated, but with sequence parallelism they see only this rank's share of the sequence.
    sequence_parallel_norms=("model.layers.*.input_layernorm", "model.layers.*.post_attention_layernorm",
                             "model.norm"),
    # Qwen3's: one weight over head_dim applied to each of this rank's heads.
    head_norms=("model.layers.*.self_attn.q_norm", "model.layers.*.self_attn.k_norm"),
)


def tp_rules_of(shape: LlamaShape) -> TPRules:
    """TP_RULES with the key/value projections split by their heads where tp divides them, else
    replicated (KVHeads), and the head tied to the embedding when the shape ties them."""
    kv = KVHeads(shape.n_head, shape.n_kv_head)
    layers = tuple((name, kv if name.endswith(("k_proj", "v_proj")) else style) for name, style in TP_RULES.layers)
    ties = (("lm_head.weight", "model.embed_tokens.weight"),) if shape.tie_embeddings else ()
    return dataclasses.replace(TP_RULES, layers=layers, ties=ties)


def check(cfg, layout, warnings: List[str]) -> Tuple[int, str]:
    """The transformer checks, then grouped-query attention and RoPE."""
    m = cfg.model
    try:
        shape = imported_dims(SPEC, m) if m.init_from else llama_dims(m, m.vocab_size)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    require(shape.n_kv_head >= 1 and shape.n_head % shape.n_kv_head == 0,
             f"model.n_kv_head={shape.n_kv_head} does not divide model.n_head={shape.n_head}; choose n_kv_head among "
             f"{[d for d in range(1, shape.n_head + 1) if shape.n_head % d == 0]}")
    require(shape.head_dim % 2 == 0 and (shape.head_size or shape.n_embd % shape.n_head == 0),
             f"model.n_embd={shape.n_embd} / model.n_head={shape.n_head} gives head size "
             f"{shape.head_size or shape.n_embd / shape.n_head:g}; rotary embeddings need an even whole head size"
             if not shape.head_size else f"model.head_dim={shape.head_size}: rotary embeddings need an even head size")
    window = shape.sliding_window
    if window is not None and window < shape.block_size:
        require(shape.arch not in ("qwen2", "qwen3"),
                f"model.sliding_window={window} is shorter than model.block_size={shape.block_size}: a {shape.arch} "
                f"window applies to some layers only (max_window_layers), which zoo does not build; set "
                f"model.block_size={window} (or less)")
    require(m.dropout == 0, f"model.dropout={m.dropout}: the Llama family has no dropout; set model.dropout=0")
    if layout.tp > 1 and shape.n_kv_head % layout.tp:
        warnings.append(f"parallel.tp={layout.tp} does not divide model.n_kv_head={shape.n_kv_head}: every rank holds "
                        f"all {shape.n_kv_head} key/value heads' projections (replicated, their gradients summed over "
                        f"tp) and computes the ones its query heads use; tp among "
                        f"{[d for d in range(1, shape.n_kv_head + 1) if shape.n_kv_head % d == 0]} splits them")
    return check_transformer(SPEC, cfg, layout, warnings)


def _flops_per_sample(task):
    tokens = task.tokens_per_sample()
    return tokens * llama_flops_per_token(task.shape, task.num_params(), tokens), "6N + 12*L*H*Q*T"


SPEC = FamilySpec(
    name="llama", model=LlamaForCausalLM, shape_type=LlamaShape, shape=llama_dims, task=CausalLMTask,
    init_std=lambda shape, _module: (lambda name: llama_init_std(name, shape)), check=check,
    data_sources=("pydoc", "files", "hub", "prepared", "chat"), reads="text",
    mix_sources=("pydoc", "files", "hub", "prepared"),
    sizes=tuple(LLAMA_SIZES), published=LLAMA_PUBLISHED, data_keys=data_keys.CAUSAL_TEXT, generates_text=True, context_parallel=True,
    pipeline_loss=TokenLoss, flops_per_sample=_flops_per_sample, tp_rules=TP_RULES, tp_rules_of=tp_rules_of,
    planner=planner.describe,
    hf=HFConverter.of(hf, model_types=ARCHS, loads_as="LlamaForCausalLM",
                   vocab_rows=("model.embed_tokens.weight", "lm_head.weight")),
)
