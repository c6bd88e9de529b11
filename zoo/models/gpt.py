"""The GPT-2 decoder as a plain single-device module, and its named sizes.

The architecture is GPT-2's exactly (learned positions, pre-LayerNorm, tanh-GELU MLP,
biases everywhere, input and output embeddings tied), with parameter names that mirror
Hugging Face's `GPT2LMHeadModel` so that export and import are renames plus a transpose.
Nothing here knows about parallelism: `zoo.parallel.tp_rules` swaps layers for their
tensor-parallel twins and `zoo.parallel.pipeline` cuts `pipeline_layers()`, the list the
forward runs, into stages.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from zoo.models.causal_lm import CausalLM, HeadLogits
from zoo.models.documents import ReadsContext, with_documents
from zoo.models.kv_cache import ReadsDecodeCache
from zoo.models.stages import PipeLayer

# name: (n_layer, n_head, n_embd, block_size)
GPT_SIZES = {
    "tiny": (4, 4, 128, 128),
    "small": (12, 12, 768, 1024),
    "medium": (24, 16, 1024, 1024),
    "large": (36, 20, 1280, 1024),
    "xl": (48, 25, 1600, 1024),
    # The GPT-3 paper's family (Brown et al. 2020, table 2.1), context 2048. The paper's
    # 1.3B row lists 24 heads of 128 for d_model 2048; we use 16 heads of 128 as Megatron does.
    "gpt3-125m": (12, 12, 768, 2048),
    "gpt3-350m": (24, 16, 1024, 2048),
    "gpt3-760m": (24, 16, 1536, 2048),
    "gpt3-1.3b": (24, 16, 2048, 2048),
    "gpt3-2.7b": (32, 32, 2560, 2048),
    "gpt3-6.7b": (32, 32, 4096, 2048),
    "gpt3-13b": (40, 40, 5120, 2048),
    "gpt3-175b": (96, 96, 12288, 2048),
}
# name: (vocabulary, parameters) of the published model each preset is. GPT-2: OpenAI's
# checkpoints as transformers counts them (`GPT2LMHeadModel.num_parameters()` of gpt2,
# gpt2-medium, gpt2-large, gpt2-xl; the head is tied). GPT-3: the paper's table 2.1, whose
# counts are rounded (the model here counts 125.2M, 355.9M, 760.3M, 1.316B, 2.652B, 6.658B,
# 12.85B and 174.6B: within 2% of them); GPT-2's vocabulary (the paper, section 2.2).
GPT_PUBLISHED = {
    "small": (50257, 124_439_808),
    "medium": (50257, 354_823_168),
    "large": (50257, 774_030_080),
    "xl": (50257, 1_557_611_200),
    "gpt3-125m": (50257, 125_000_000),
    "gpt3-350m": (50257, 350_000_000),
    "gpt3-760m": (50257, 760_000_000),
    "gpt3-1.3b": (50257, 1_300_000_000),
    "gpt3-2.7b": (50257, 2_700_000_000),
    "gpt3-6.7b": (50257, 6_700_000_000),
    "gpt3-13b": (50257, 13_000_000_000),
    "gpt3-175b": (50257, 175_000_000_000),
}


@dataclass(frozen=True)
class GPTShape:
    """Resolved dimensions of one GPT."""

    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    vocab_size: int
    ffn_mult: int = 4
    dropout: float = 0.0
    vocab_real: Optional[int] = None
    """The tokens of an imported vocabulary that `vocab_size` pads (their logits only count)."""

    @property
    def ffn_dim(self) -> int:
        return self.ffn_mult * self.n_embd


class CausalSelfAttention(ReadsContext, ReadsDecodeCache, nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float):
        super().__init__()
        self.head_dim = n_embd // n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)  # fused [q; k; v]
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.dropout = dropout
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """`positions` (B, T): each token's position in its document (zoo.models.documents);
        given, attention stays inside each document, else it is causal over the block."""
        qkv = self.c_attn(x)  # (B, T, 3*C_local): under TP each rank holds whole heads
        B, T, three_c = qkv.shape
        q, k, v = qkv.split(three_c // 3, dim=2)
        # (B, nh_local, T, hs)
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        dropout = self.dropout if self.training else 0.0
        shard = self.sharded()
        if shard is not None:  # context parallelism: this rank's queries over every key
            y = shard.attention(q, k, v, lambda q, k, v, mask: F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout))
        else:  # documents, or decoding (zoo.models.kv_cache), or causal
            k, v, mask, causal = self.keys_and_mask(positions, k, v, q.dtype)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, dropout_p=dropout)
        y = y.transpose(1, 2).reshape(B, T, three_c // 3)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, n_embd: int, ffn_dim: int, dropout: float):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, ffn_dim)
        self.c_proj = nn.Linear(ffn_dim, n_embd)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, shape: GPTShape):
        super().__init__()
        self.ln_1 = nn.LayerNorm(shape.n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(shape.n_embd, shape.n_head, shape.dropout)
        self.ln_2 = nn.LayerNorm(shape.n_embd, eps=1e-5)
        self.mlp = MLP(shape.n_embd, shape.ffn_dim, shape.dropout)

    def forward(self, x: torch.Tensor, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), positions)
        return x + self.mlp(self.ln_2(x))


class Embeddings(ReadsDecodeCache, nn.Module):
    """Token plus learned position embeddings (the first pipeline stage)."""

    def __init__(self, shape: GPTShape):
        super().__init__()
        self.wte = nn.Embedding(shape.vocab_size, shape.n_embd)
        self.wpe = nn.Embedding(shape.block_size, shape.n_embd)
        self.wpe.decayed = False  # a position table is not weight-decayed (zoo.engine.initialize.param_groups)
        self.drop = nn.Dropout(shape.dropout)

    def forward(self, idx: torch.Tensor, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        if positions is None:  # 0..T-1, or on from the decode cache's length
            start = self.cache_start()
            pos = torch.arange(start, start + idx.shape[1], device=idx.device)
        else:
            pos = positions
        return self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)


class GPT(CausalLM):
    """GPT-2. `forward(idx)` gives logits (B, T, V); `forward(idx, targets)` the mean loss."""

    def __init__(self, shape: GPTShape):
        super().__init__(shape)
        self.embed = Embeddings(shape)
        self.h = nn.ModuleList(Block(shape) for _ in range(shape.n_layer))
        self.ln_f = nn.LayerNorm(shape.n_embd, eps=1e-5)
        self.lm_head = nn.Linear(shape.n_embd, shape.vocab_size, bias=False)
        self.lm_head.weight = self.embed.wte.weight  # tied

    def pipeline_layers(self) -> List[PipeLayer]:
        """The forward in order: embeddings, blocks, final LayerNorm, the output head (tied
        to the token embedding: under pp the last stage holds its own copy of it)."""
        tie = dict(tie="wte", tied_weight="embed.wte.weight")
        return with_documents([PipeLayer(("embed",), **tie),
                               *(PipeLayer((f"h.{i}",), checkpointable=True) for i in range(self.shape.n_layer)),
                               PipeLayer(("ln_f",)),
                               PipeLayer(("embed.wte", "lm_head"), run=HeadLogits(self.shape.vocab_real), **tie)],
                              self.document_end, embedding_takes_positions=True, context=self.sharded())


def gpt_shape(size: str, vocab_size: int, *, n_layer: Optional[int] = None, n_head: Optional[int] = None,
              n_embd: Optional[int] = None, block_size: Optional[int] = None, ffn_mult: int = 4,
              dropout: float = 0.0) -> GPTShape:
    if size not in GPT_SIZES:
        raise ValueError(f"model.size={size!r} is not a GPT size; choose one of {sorted(GPT_SIZES)}")
    L, H, C, T = GPT_SIZES[size]
    pick = lambda override, preset: preset if override is None else override  # noqa: E731
    return GPTShape(n_layer=pick(n_layer, L), n_head=pick(n_head, H), n_embd=pick(n_embd, C),
                    block_size=pick(block_size, T), vocab_size=vocab_size, ffn_mult=ffn_mult, dropout=dropout)


def gpt_init_std(name: str, shape: GPTShape) -> Optional[float]:
    """GPT-2's initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2L);
    None means the parameter is a bias (zeros) or a LayerNorm (ones/zeros)."""
    if name.endswith("c_proj.weight"):
        return 0.02 / math.sqrt(2 * shape.n_layer)
    if name.endswith(("wte.weight", "wpe.weight")) or (name.endswith(".weight") and ".ln" not in name
                                                        and not name.startswith("ln")):
        return 0.02
    return None
