"""What the planner needs to know about a model, and one function per family that says it.

A family plugs in with one function `(model_cfg, vocab_size) -> ModelDesc`, its spec's
`planner` (`zoo.families`; GPT's is in `zoo/families/gpt/planner.py`). The description is plain numbers: for the input end, each layer
in order and the output end, its parameters (split into what tensor parallelism shards and
what it replicates), the activations backward needs per token (split by how tp and sequence
parallelism divide them), its forward FLOPs per token and its tensor-parallel all-reduces;
plus the sizes tp must divide. Memory and time (`zoo.plan.memory`, `zoo.plan.step_time`)
are computed from these alone, so nothing else changes when a family is added.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple


@dataclass(frozen=True)
class ParamCount:
    """Parameters of one piece of the model, unsharded."""

    sharded: int = 0
    """Split over the tp group (column/row-parallel weights, vocab-parallel embeddings)."""
    replicated: int = 0
    """Held whole by every tp rank (LayerNorms, the biases of row-parallel layers, position tables)."""

    @property
    def total(self) -> int:
        return self.sharded + self.replicated

    def per_rank(self, tp: int) -> float:
        return self.sharded / tp + self.replicated


@dataclass(frozen=True)
class Activations:
    """What backward needs per token of one piece, split by how tensor parallelism divides it."""

    tp_elems: float = 0
    """Elements in the training dtype split over tp (whole heads, FFN columns, vocab shards)."""
    sp_elems: float = 0
    """Elements in the training dtype that tp replicates unless sequence parallelism splits
    them (LayerNorm inputs, the inputs of column-parallel layers)."""
    tp_bytes: float = 0
    """Fixed-size bytes split over tp (1-byte attention-dropout masks, the loss's fp32 softmax)."""
    sp_bytes: float = 0
    """Fixed-size bytes split over tp only with sequence parallelism (1-byte residual-dropout masks)."""

    def bytes_per_token(self, dtype_bytes: int, tp: int, sequence_parallel: bool) -> float:
        sp_div = tp if sequence_parallel else 1
        return (self.tp_elems * dtype_bytes + self.tp_bytes) / tp + (self.sp_elems * dtype_bytes + self.sp_bytes) / sp_div


@dataclass(frozen=True)
class Piece:
    """One pipeline-placeable piece: the input end, a layer, or the output end."""

    params: ParamCount
    """Its parameters."""
    activations: Activations
    """Activations kept for backward per token, without recomputation."""
    checkpoint: Activations
    """Activations kept per token with activation checkpointing on: a layer keeps its input
    and recomputes the rest in backward; the two ends are not recomputed and keep everything."""
    fwd_flops_per_token: float
    """Forward FLOPs per token (backward is twice this; recomputation adds one forward)."""
    tp_allreduce_elems_per_token: float
    """Elements per token all-reduced over the tp group in its forward and backward together
    (recomputing a layer's forward repeats the forward's half)."""
    backward_extra: Activations = Activations()
    """What its backward allocates per token on top of what it keeps, while what it keeps is
    still alive (the output end: the loss's float32 gradient of the logits): a transient, one
    piece's at a time."""


@dataclass(frozen=True)
class ModelDesc:
    """A model as the planner sees it."""

    name: str
    """For printing, e.g. `gpt gpt3-175b`."""
    embedding: Piece
    """The input end (first pipeline stage)."""
    layers: Tuple[Piece, ...]
    """The repeated layers, in order; pipeline stages take contiguous runs of them."""
    head: Piece
    """The output end (last pipeline stage): final norm, output projection, loss; its
    parameters exclude a projection tied to the embedding."""
    head_ties_embedding: bool
    """The output projection is the embedding's weight. With pp > 1 the last stage holds its
    own copy of that (vocab-sharded) weight, tied to the first stage's by a DeepSpeed
    TiedLayerSpec; the rest of the input end (e.g. position tables) stays on the first stage."""
    tokens_per_sample: int
    """Tokens per sample (the context length)."""
    hidden_size: int
    """Elements per token passed between layers (pipeline p2p, checkpoints)."""
    gemm_shape: Tuple[int, int]
    """(K, N) of the narrowest matrix multiply of a layer at tp=1; tp divides N. With the
    tokens of a micro-batch as M it gives the arithmetic intensity that bounds efficiency."""
    tp_divides: Dict[str, int]
    """Sizes tp must divide, by the name the error message uses."""
    kv_width: int = 0
    """Elements per token of one layer's keys and values together (2 x n_kv_head x head_dim): what
    context parallelism all-gathers and keeps whole; 0: the family has no context parallelism."""
    windowed: bool = False
    """Attention within a sliding window shorter than the sequence (Mistral's): context
    parallelism builds its chunks' masks also where the causal ones need none (CUDA)."""
    cp_kept_extra: int = 0
    """Elements a token of a cp rank's share keeps in a layer, besides the gathered keys and values,
    where cp's attention is not recomputed (parallel.cp_recompute=false): the attention's output
    twice (each chunk's, which SDPA keeps, and their concatenation, which the output projection
    keeps), and where the keys and values come out of one projection with the queries (GPT's
    c_attn), the rank's own keys and values again inside it (the queries keep it)."""

    @property
    def n_layer(self) -> int:
        return len(self.layers)

    @property
    def num_params(self) -> int:
        return sum(p.params.total for p in (self.embedding, *self.layers, self.head))


def gpt_layer_activations(h: int, n_head: int, seq: int, ffn: int, *, dropout: bool,
                          stores_attention_scores: bool) -> Activations:
    """Korthikanti et al. 2022, section 4.1, per token of one transformer layer.

    Attention: QKV input (h), Q and K (2h), V (h), output-projection input (h); with
    materialised scores the softmax (a*s), its dropout output (a*s) and 1-byte mask (a*s).
    MLP: fc input (h), GeLU input (ffn), fc2 input (ffn). Two LayerNorm inputs (2h). Two
    1-byte residual-dropout masks (2h). With 2-byte elements, dropout, scores and ffn = 4h
    that is 34h + 5as bytes: sbh(34 + 5as/h) for s*b tokens.
    """
    scores = n_head * seq if stores_attention_scores else 0
    return Activations(tp_elems=4 * h + 2 * ffn + scores * (2 if dropout else 1),
                       sp_elems=4 * h,
                       tp_bytes=scores if dropout else 0,
                       sp_bytes=2 * h if dropout else 0)
