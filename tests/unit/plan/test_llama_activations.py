"""The planner's Llama activations are what autograd saves of zoo's decoder layer: the tensors
`torch.autograd.graph.saved_tensors_hooks` sees in one forward (each storage once, the weights
left out), per token, equal the planner's count but for RoPE's cos/sin tables and the two
RMSNorms' reciprocal norms (one element a token each)."""
from __future__ import annotations

import pytest
import torch

from zoo.config.schema import ModelConfig
from zoo.models.llama import LlamaDecoderLayer, llama_shape
from zoo.plan.describe import describe_model

DIMS = dict(n_layer=1, n_head=4, n_kv_head=2, n_embd=64, intermediate_size=160, block_size=16)


def _saved_elements_per_token(layer: torch.nn.Module, x: torch.Tensor) -> tuple:
    """(fp32 elements a token autograd keeps, of them those that do not grow with the batch)."""
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t
        return t

    weights = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    kept = [t for ptr, t in seen.items() if ptr not in weights]
    tokens = x.shape[0] * x.shape[1]
    tables = (x.shape[1], layer.self_attn.head_dim)  # RoPE's cos and sin: a row a position, not a token
    per_position = sum(t.untyped_storage().nbytes() for t in kept if not t.requires_grad and tuple(t.shape) == tables)
    return sum(t.untyped_storage().nbytes() for t in kept) / 4 / tokens, per_position / 4 / tokens


@pytest.mark.parametrize("variant", [{}, dict(attention_bias=True), dict(qk_norm=True, head_dim=32)],
                         ids=["llama", "qwen2-biases", "qwen3-qk-norm-wide-heads"])
def test_llama_layer_activations_equal_what_autograd_saves(variant):
    shape = llama_shape("tiny", 256, **DIMS, **{("head_size" if k == "head_dim" else k): v for k, v in variant.items()})
    layer = LlamaDecoderLayer(shape)
    x = torch.randn(2, DIMS["block_size"], DIMS["n_embd"], requires_grad=True)
    saved, tables = _saved_elements_per_token(layer, x)
    desc = describe_model(ModelConfig(family="llama", size="tiny", vocab_size=256, **DIMS, **variant), 256)
    planned = desc.layers[0].activations.bytes_per_token(4, 1, False) / 4
    rsqrt = 2 + (shape.n_head + shape.n_kv_head if shape.qk_norm else 0)  # each RMSNorm's reciprocal norm a row
    assert saved == planned + tables + rsqrt, (saved, planned, tables)


@pytest.mark.parametrize("size, keys", [("tiny", dict(n_kv_head=1, intermediate_size=96, tie_embeddings=True)),
                                       ("tiny", dict(attention_bias=True, qk_norm=True, head_dim=48)),
                                       ("qwen3-tiny", {}), ("qwen2-tiny", dict(n_kv_head=4))])
def test_the_planner_reads_every_llama_dimension_the_config_overrides(size, keys):
    """model.n_kv_head, model.intermediate_size, model.tie_embeddings and the Qwen pieces over a
    size preset: the planner's parameter count is the built model's."""
    from zoo.families.llama.dims import llama_dims
    from zoo.models.llama import LlamaForCausalLM

    cfg = ModelConfig(family="llama", size=size, vocab_size=256, **keys)
    with torch.device("meta"):
        built = LlamaForCausalLM(llama_dims(cfg, 256))
    assert describe_model(cfg, 256).num_params == sum(p.numel() for p in built.parameters())
