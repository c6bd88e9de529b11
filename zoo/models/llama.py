"""The Llama decoder as a plain single-device module, and its named sizes.

Pre-RMSNorm blocks, rotary position embeddings (`rope_theta`), a SwiGLU MLP with its own
intermediate size, grouped-query attention (`n_kv_head` key/value heads shared by groups of
`n_head / n_kv_head` query heads; 1: multi-query), no biases, untied input and output
embeddings; and the pieces by which Qwen2 (q/k/v biases), Qwen3 (per-head q/k RMSNorm, a
head width of its own) and Mistral (a sliding window) differ, as shape fields. Parameter
names mirror transformers' `LlamaForCausalLM` (and Qwen2's, Qwen3's, Mistral's: the same
names), so export and import are plain copies. Nothing here knows about parallelism: under tensor parallelism each rank
holds whole query heads and the key/value heads they use (`zoo.families.llama`), and RoPE
runs inside attention on the whole sequence, so its positions are right also under
sequence parallelism.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from zoo.models.causal_lm import CausalLM, HeadLogits
from zoo.models.documents import ReadsContext, with_documents
from zoo.models.kv_cache import ReadsDecodeCache
from zoo.models.sliding_window import windowed_mask
from zoo.models.stages import PipeLayer


# name: the preset's dimensions, from each model's published config.json:
# HuggingFaceTB/SmolLM-135M, TinyLlama/TinyLlama-1.1B (v1.0), meta-llama/Llama-2-7b-hf,
# meta-llama/Meta-Llama-3-8B, meta-llama/Llama-2-70b-hf, Qwen/Qwen2.5-0.5B, Qwen/Qwen3-0.6B,
# mistralai/Mistral-7B-v0.1. The `-tiny` variants are the tiny Llama with each architecture's
# own pieces (Qwen2's q/k/v biases, Qwen3's q/k norms and wider heads, Mistral's window).
def _preset(n_layer, n_head, n_kv_head, n_embd, intermediate_size, block_size, rope_theta, tie_embeddings, **extra):
    return dict(n_layer=n_layer, n_head=n_head, n_kv_head=n_kv_head, n_embd=n_embd,
                intermediate_size=intermediate_size, block_size=block_size, rope_theta=rope_theta,
                tie_embeddings=tie_embeddings, **extra)


QWEN2 = dict(arch="qwen2", attention_bias=True, rms_norm_eps=1e-6)
QWEN3 = dict(arch="qwen3", qk_norm=True, rms_norm_eps=1e-6)
LLAMA_SIZES = {
    "tiny": _preset(4, 4, 2, 128, 352, 128, 10000.0, False),
    "smollm-135m": _preset(30, 9, 3, 576, 1536, 2048, 10000.0, True),
    "tinyllama-1.1b": _preset(22, 32, 4, 2048, 5632, 2048, 10000.0, False),
    "llama2-7b": _preset(32, 32, 32, 4096, 11008, 4096, 10000.0, False),
    "llama3-8b": _preset(32, 32, 8, 4096, 14336, 8192, 500000.0, False),
    "llama2-70b": _preset(80, 64, 8, 8192, 28672, 4096, 10000.0, False),
    "qwen2-tiny": _preset(4, 4, 2, 128, 352, 128, 1000000.0, True, **QWEN2),
    "qwen2.5-0.5b": _preset(24, 14, 2, 896, 4864, 32768, 1000000.0, True, **QWEN2),
    "qwen3-tiny": _preset(4, 4, 2, 128, 352, 128, 1000000.0, True, head_size=64, **QWEN3),
    "qwen3-0.6b": _preset(28, 16, 8, 1024, 3072, 40960, 1000000.0, True, head_size=128, **QWEN3),
    "mistral-tiny": _preset(4, 4, 2, 128, 352, 128, 10000.0, False, arch="mistral", sliding_window=128),
    "mistral-7b": _preset(32, 32, 8, 4096, 14336, 32768, 10000.0, False, arch="mistral", sliding_window=4096),
}
# name: (vocabulary, parameters) of the published model: the config.json's vocab_size and
# transformers' `num_parameters()` of the checkpoints named above (the figures their model
# cards give: SmolLM 135M, TinyLlama 1.1B, Llama 2 7B and 70B, Llama 3 8B, Qwen2.5 0.49B,
# Qwen3 0.6B, Mistral 7.24B).
LLAMA_PUBLISHED = {
    "smollm-135m": (49152, 134_515_008),
    "tinyllama-1.1b": (32000, 1_100_048_384),
    "llama2-7b": (32000, 6_738_415_616),
    "llama3-8b": (128256, 8_030_261_248),
    "llama2-70b": (32000, 68_976_648_192),
    "qwen2.5-0.5b": (151936, 494_032_768),
    "qwen3-0.6b": (151936, 596_049_920),
    "mistral-7b": (32000, 7_241_732_096),
}
ARCHS = ("llama", "qwen2", "qwen3", "mistral")
"""transformers' model types zoo's Llama covers, each its own pieces on the same decoder."""
RMS_NORM_EPS = 1e-5


@dataclass(frozen=True)
class LlamaShape:
    """Resolved dimensions of one Llama."""

    n_layer: int
    n_head: int
    n_kv_head: int
    n_embd: int
    intermediate_size: int
    block_size: int
    vocab_size: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = RMS_NORM_EPS
    vocab_real: Optional[int] = None
    """The tokens of an imported vocabulary that `vocab_size` pads (their logits only count)."""
    tie_embeddings: bool = False
    """The LM head is the token embedding (SmolLM; Llama itself is untied)."""
    arch: str = "llama"
    """transformers' model type an export writes (ARCHS): the pieces below say what differs."""
    head_size: Optional[int] = None
    """Each head's width where it is not n_embd / n_head (Qwen3: 128 at width 1024 and 16 heads)."""
    attention_bias: bool = False
    """Biases on the query, key and value projections (Qwen2)."""
    qk_norm: bool = False
    """An RMSNorm over each query and key head before the rotary embeddings (Qwen3)."""
    max_positions: Optional[int] = None
    """An import's own context length where model.block_size trains a shorter one (its export
    keeps it as max_position_embeddings). None: block_size."""
    sliding_window: Optional[int] = None
    """Mistral's attention window: a token sees the `sliding_window` tokens up to itself
    (zoo.models.sliding_window), in every layer. None: the whole block."""

    @property
    def head_dim(self) -> int:
        return self.head_size or self.n_embd // self.n_head

    @property
    def q_width(self) -> int:
        """The query projection's outputs (and the output projection's inputs): all heads."""
        return self.n_head * self.head_dim

    @property
    def ffn_dim(self) -> int:
        return self.intermediate_size


LLAMA_KEYS = ("n_layer", "n_head", "n_kv_head", "n_embd", "intermediate_size", "block_size", "rope_theta",
              "tie_embeddings", "head_size", "attention_bias", "qk_norm", "sliding_window")
"""The shape fields a model config may override (`model.<key>`; head_size is `model.head_dim`)."""


def llama_shape(size: str, vocab_size: int, **overrides) -> LlamaShape:
    """The preset `size` with every override that is not None (unknown keys ignored)."""
    if size not in LLAMA_SIZES:
        raise ValueError(f"model.size={size!r} is not a Llama size; choose one of {sorted(LLAMA_SIZES)}")
    given = {k: v for k, v in overrides.items() if k in LLAMA_KEYS and v is not None}
    return LlamaShape(**{**LLAMA_SIZES[size], **given}, vocab_size=vocab_size)


def llama_init_std(name: str, shape: LlamaShape) -> Optional[float]:
    """N(0, 0.02) for every matrix (transformers' initializer_range); None for the RMSNorm weights (ones)."""
    return 0.02 if name.endswith(".weight") and "norm" not in name else None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # torch's own kernel: one call forward and back
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        xf = x.float()  # in float32, as transformers' LlamaRMSNorm
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


@functools.lru_cache(maxsize=16)
def _rope_tables(T: int, d: int, theta: float, device: torch.device, dtype: torch.dtype) -> tuple:
    """cos and the signed sin, (T, head_dim), of positions 0..T-1: computed once per length,
    not per layer. The sin's first half is negated, so that rotating half of q is a roll."""
    with torch.no_grad():
        inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
        freqs = torch.outer(torch.arange(T, device=device, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        sin = emb.sin()
        sin[:, : d // 2].neg_()
        return emb.cos().to(dtype), sin.to(dtype)


def apply_rope(q: torch.Tensor, k: torch.Tensor, theta: float, positions: Optional[torch.Tensor] = None,
               start: int = 0, length: Optional[int] = None) -> tuple:
    """Rotary embeddings on (B, heads, T, head_dim) queries and keys, positions 0..T-1 (or
    `positions`, (B, T), each token's position in its document): x * cos + rotate_half(x) * sin,
    with rotate_half(x) * sin = roll(x, d/2) * signed sin (the same products, bit for bit; a
    roll's backward is a roll, where a cat's is a split and a cat). `start`: the first token's
    position (decoding with a cache); the table's rows are the same whatever its length.
    `length`: the table's, where `positions` reach past these T (context parallelism's share)."""
    d = q.shape[-1]
    cos, signed_sin = _rope_tables(length or start + q.shape[-2], d, float(theta), q.device, q.dtype)
    if start:
        cos, signed_sin = cos[start:], signed_sin[start:]
    if positions is not None:  # each row's own angles, (B, 1, T, d): the table's rows, picked
        cos, signed_sin = cos[positions][:, None], signed_sin[positions][:, None]
    return q * cos + q.roll(d // 2, -1) * signed_sin, k * cos + k.roll(d // 2, -1) * signed_sin


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: Optional[torch.Tensor], causal: bool,
           groups: int, expand: Optional[bool] = None) -> torch.Tensor:
    """SDPA with `groups` query heads to a key/value head. SDPA's own grouped-query attention
    (enable_gqa) runs, on CUDA, only in the flash kernel, which takes no mask, and the math
    kernel, which builds the (B, heads, T, T) scores: so a masked call (document masking) on
    CUDA repeats the key/value heads first (`expand`; groups x their memory, for this call),
    and the memory-efficient kernel takes it with the mask. The same numbers either way
    (tests/unit/models/test_llama_attend.py); elsewhere SDPA repeats none."""
    if expand is None:  # a tensor mask (context parallelism's causal_lower_right is not one: flash takes it)
        expand = isinstance(mask, torch.Tensor) and groups > 1 and q.is_cuda
    if expand:
        k, v = (t.repeat_interleave(groups, dim=1) for t in (k, v))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=groups > 1)


class LlamaAttention(ReadsContext, ReadsDecodeCache, nn.Module):
    def __init__(self, shape: LlamaShape):
        super().__init__()
        d, kv, bias = shape.head_dim, shape.n_kv_head * shape.head_dim, shape.attention_bias
        self.head_dim, self.theta, self.window = d, shape.rope_theta, shape.sliding_window
        self.groups = shape.n_head // shape.n_kv_head  # query heads per key/value head
        self.q_proj = nn.Linear(shape.n_embd, shape.q_width, bias=bias)
        self.k_proj = nn.Linear(shape.n_embd, kv, bias=bias)
        self.v_proj = nn.Linear(shape.n_embd, kv, bias=bias)
        self.o_proj = nn.Linear(shape.q_width, shape.n_embd, bias=False)
        if shape.qk_norm:  # one weight over head_dim, shared by every head (under tp: summed gradients)
            self.q_norm = RMSNorm(d, shape.rms_norm_eps)
            self.k_norm = RMSNorm(d, shape.rms_norm_eps)

    def forward(self, x: torch.Tensor, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """`positions` (B, T): each token's position in its document (zoo.models.documents);
        given, attention stays inside each document and rotary angles restart with it."""
        q, k, v = (proj(x) for proj in (self.q_proj, self.k_proj, self.v_proj))
        B, T, _ = q.shape  # the whole sequence: under sequence parallelism x holds a shard of it
        # (B, heads_local, T, hs): under TP each rank holds whole query heads and their kv heads
        q, k, v = (t.view(B, T, -1, self.head_dim) for t in (q, k, v))
        if hasattr(self, "q_norm"):  # Qwen3: each head normalised, before the rotation
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        shard = self.sharded()  # context parallelism: the positions are global, up to cp x T
        q, k = apply_rope(q, k, self.theta, positions, start=self.cache_start(),
                          length=None if shard is None else T * shard.size)
        if shard is not None:  # this rank's queries over every key
            y = shard.attention(q, k, v, lambda q, k, v, mask: self._attend(q, k, v, mask, False), window=self.window)
        else:  # documents, or decoding (zoo.models.kv_cache), or causal
            k, v, mask, causal = self.keys_and_mask(positions, k, v, q.dtype)
            windowed = windowed_mask(mask, causal, T, k.shape[2], self.cache_start(), self.window, q.dtype, q.device)
            if windowed is not None:  # Mistral: keys further back than the window are not seen
                mask, causal = windowed, False
            y = self._attend(q, k, v, mask, causal)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))

    def _attend(self, q, k, v, mask, causal: bool) -> torch.Tensor:
        replicated = getattr(self.k_proj, "query_to_kv", None)  # tp does not divide the kv heads
        if replicated is None:  # each group of `groups` query heads shares one kv head
            return attend(q, k, v, mask=mask, causal=causal, groups=self.groups)
        index = torch.tensor(replicated, device=k.device)
        k, v = (t.index_select(1, index) for t in (k, v))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)


class LlamaMLP(nn.Module):
    def __init__(self, shape: LlamaShape):
        super().__init__()
        self.gate_proj = nn.Linear(shape.n_embd, shape.intermediate_size, bias=False)
        self.up_proj = nn.Linear(shape.n_embd, shape.intermediate_size, bias=False)
        self.down_proj = nn.Linear(shape.intermediate_size, shape.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # SwiGLU


class LlamaDecoderLayer(nn.Module):
    def __init__(self, shape: LlamaShape):
        super().__init__()
        self.input_layernorm = RMSNorm(shape.n_embd, shape.rms_norm_eps)
        self.self_attn = LlamaAttention(shape)
        self.post_attention_layernorm = RMSNorm(shape.n_embd, shape.rms_norm_eps)
        self.mlp = LlamaMLP(shape)

    def forward(self, x: torch.Tensor, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """The decoder body (`model.` in transformers' names)."""

    def __init__(self, shape: LlamaShape):
        super().__init__()
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.n_embd)
        self.layers = nn.ModuleList(LlamaDecoderLayer(shape) for _ in range(shape.n_layer))
        self.norm = RMSNorm(shape.n_embd, shape.rms_norm_eps)


class LlamaForCausalLM(CausalLM):
    """`forward(idx)` gives logits (B, T, V); `forward(idx, targets)` the mean loss."""

    def __init__(self, shape: LlamaShape):
        if shape.n_head % shape.n_kv_head:
            raise ValueError(f"n_head={shape.n_head} is not a multiple of n_kv_head={shape.n_kv_head}")
        super().__init__(shape)
        self.model = LlamaModel(shape)
        self.lm_head = nn.Linear(shape.n_embd, shape.vocab_size, bias=False)
        if shape.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def pipeline_layers(self) -> List[PipeLayer]:
        """The forward in order: token embeddings, decoder layers, final RMSNorm, the output head
        (tied: it holds the embedding too, and under pp the last stage its own copy)."""
        tied = self.shape.tie_embeddings
        tie = dict(tie="embed_tokens", tied_weight="model.embed_tokens.weight") if tied else {}
        return with_documents(
            [PipeLayer(("model.embed_tokens",), **tie),
             *(PipeLayer((f"model.layers.{i}",), checkpointable=True) for i in range(self.shape.n_layer)),
             PipeLayer(("model.norm",)),
             PipeLayer(("model.embed_tokens", "lm_head") if tied else ("lm_head",), run=HeadLogits(self.shape.vocab_real),
                       **tie)],
            self.document_end, embedding_takes_positions=False, context=self.sharded())


def llama_flops_per_token(shape: LlamaShape, params: int, seq_len: int) -> float:
    """6N + 12*L*H*Q*T: no position table to leave out of N (rotary positions are computed)."""
    return 6 * params + 12 * shape.n_layer * shape.n_head * shape.head_dim * seq_len

