"""BERT for masked-language modelling as a plain single-device module, and its named sizes.

The architecture is Hugging Face's `BertForMaskedLM` exactly: word + learned position +
token-type embeddings, post-LayerNorm encoder layers (eps 1e-12) with exact-erf GELU, and
the MLM head (dense, GELU, LayerNorm, then a decoder tied to the word embeddings with its
own bias). Every parameter has the name it has in `BertForMaskedLM`'s state dict, so
export and import are plain copies (`cls.predictions.bias` is HF's alias of the decoder
bias). Nothing here knows about parallelism: `zoo.parallel.tp_rules` swaps the projections for
their tensor-parallel twins (q, k and v split by whole heads) and `zoo.parallel.pipeline`
cuts `pipeline_layers()`, the list the forward runs, into stages.

Inputs travel as one tensor (B, 2, T): token ids and segment (token-type) ids stacked, so
the engine and the pipeline stages carry a single tensor; padding is wherever the token id
is the pad id, and attention never looks at it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from zoo.models.losses import cross_entropy_per_token, masked_mean
from zoo.models.stages import PipeLayer, run_layers

# name: (n_layer, n_head, n_embd, block_size); the FFN is 4 x n_embd (model.ffn_mult).
BERT_SIZES = {
    "tiny": (4, 4, 128, 128),
    "base": (12, 12, 768, 512),
    "large": (24, 16, 1024, 512),
}
# name: (vocabulary, parameters) of the published model: google-research's bert-base-uncased
# and bert-large-uncased as transformers' `BertForMaskedLM.num_parameters()` counts them (the
# masked-LM head's transform and output bias, no pooler; the paper rounds them to 110M and 340M).
BERT_PUBLISHED = {
    "base": (30522, 109_514_298),
    "large": (30522, 335_174_458),
}
LAYER_NORM_EPS = 1e-12
TYPE_VOCAB_SIZE = 2


@dataclass(frozen=True)
class BertShape:
    """Resolved dimensions of one BERT."""

    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    vocab_size: int
    ffn_mult: int = 4
    dropout: float = 0.0
    pad_token_id: int = 0

    @property
    def ffn_dim(self) -> int:
        return self.ffn_mult * self.n_embd


def bert_shape(size: str, vocab_size: int, *, n_layer: Optional[int] = None, n_head: Optional[int] = None,
               n_embd: Optional[int] = None, block_size: Optional[int] = None, ffn_mult: int = 4,
               dropout: float = 0.0, pad_token_id: int = 0) -> BertShape:
    if size not in BERT_SIZES:
        raise ValueError(f"model.size={size!r} is not a BERT size; choose one of {sorted(BERT_SIZES)}")
    L, H, C, T = BERT_SIZES[size]
    pick = lambda override, preset: preset if override is None else override  # noqa: E731
    return BertShape(n_layer=pick(n_layer, L), n_head=pick(n_head, H), n_embd=pick(n_embd, C),
                     block_size=pick(block_size, T), vocab_size=vocab_size, ffn_mult=ffn_mult, dropout=dropout,
                     pad_token_id=pad_token_id)


def bert_init_std(name: str, shape: BertShape) -> Optional[float]:
    """BERT's initialisation: every Linear and Embedding weight N(0, 0.02); None for biases
    (zeros) and LayerNorms (ones/zeros)."""
    return 0.02 if name.endswith(".weight") and "LayerNorm" not in name else None


def padding_mask(inputs: torch.Tensor, pad_token_id: int) -> torch.Tensor:
    """(B, 2, T) packed inputs -> (B, T) bool, True at real tokens."""
    return inputs[:, 0] != pad_token_id


class BertEmbeddings(nn.Module):
    def __init__(self, shape: BertShape):
        super().__init__()
        self.word_embeddings = nn.Embedding(shape.vocab_size, shape.n_embd)
        self.position_embeddings = nn.Embedding(shape.block_size, shape.n_embd)
        self.token_type_embeddings = nn.Embedding(TYPE_VOCAB_SIZE, shape.n_embd)
        self.LayerNorm = nn.LayerNorm(shape.n_embd, eps=LAYER_NORM_EPS)
        self.dropout = nn.Dropout(shape.dropout)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.position_embeddings(pos) + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, shape: BertShape):
        super().__init__()
        self.head_dim = shape.n_embd // shape.n_head
        self.query = nn.Linear(shape.n_embd, shape.n_embd)
        self.key = nn.Linear(shape.n_embd, shape.n_embd)
        self.value = nn.Linear(shape.n_embd, shape.n_embd)
        self.dropout = shape.dropout

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # (B, nh_local, T, hs): under TP each rank's q, k, v columns are whole heads
        q, k, v = (proj(x).view(B, T, -1, self.head_dim).transpose(1, 2) for proj in (self.query, self.key, self.value))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :],  # keys only
                                           dropout_p=self.dropout if self.training else 0.0)
        return y.transpose(1, 2).reshape(B, T, -1)  # (B, T, C_local)


class BertSelfOutput(nn.Module):
    """dense (row-parallel under TP), dropout, then the residual's post-LayerNorm."""

    def __init__(self, in_dim: int, n_embd: int, dropout: float):
        super().__init__()
        self.dense = nn.Linear(in_dim, n_embd)
        self.LayerNorm = nn.LayerNorm(n_embd, eps=LAYER_NORM_EPS)
        self.dropout = nn.Dropout(dropout)

    def forward(self, y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(y)) + residual)


class BertAttention(nn.Module):
    def __init__(self, shape: BertShape):
        super().__init__()
        self.self = BertSelfAttention(shape)
        self.output = BertSelfOutput(shape.n_embd, shape.n_embd, shape.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x, mask), x)


class BertIntermediate(nn.Module):
    def __init__(self, shape: BertShape):
        super().__init__()
        self.dense = nn.Linear(shape.n_embd, shape.ffn_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x))  # exact (erf) GELU, HF's "gelu"


class BertLayer(nn.Module):
    def __init__(self, shape: BertShape):
        super().__init__()
        self.attention = BertAttention(shape)
        self.intermediate = BertIntermediate(shape)
        self.output = BertSelfOutput(shape.ffn_dim, shape.n_embd, shape.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, mask)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, shape: BertShape):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(shape) for _ in range(shape.n_layer))


class BertModel(nn.Module):
    """The encoder body (`bert.` in HF's names; BertForMaskedLM has no pooler)."""

    def __init__(self, shape: BertShape):
        super().__init__()
        self.embeddings = BertEmbeddings(shape)
        self.encoder = BertEncoder(shape)


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, shape: BertShape):
        super().__init__()
        self.dense = nn.Linear(shape.n_embd, shape.n_embd)
        self.LayerNorm = nn.LayerNorm(shape.n_embd, eps=LAYER_NORM_EPS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(F.gelu(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    def __init__(self, shape: BertShape):
        super().__init__()
        self.transform = BertPredictionHeadTransform(shape)
        self.decoder = nn.Linear(shape.n_embd, shape.vocab_size)  # weight tied to the word embeddings


class BertOnlyMLMHead(nn.Module):
    def __init__(self, shape: BertShape):
        super().__init__()
        self.predictions = BertLMPredictionHead(shape)


# The layers pass (hidden, inputs) on, so that every encoder layer sees the padding.
def _embed(root: nn.Module, inputs: torch.Tensor):
    return root.bert.embeddings(inputs[:, 0], inputs[:, 1]), inputs  # (B, T, C), (B, 2, T)


def _encoder_layer(index: int, pad_token_id: int, root: nn.Module, x):
    hidden, inputs = x
    return root.get_submodule(f"bert.encoder.layer.{index}")(hidden, padding_mask(inputs, pad_token_id)), inputs


def _transform(root: nn.Module, x) -> torch.Tensor:
    return root.cls.predictions.transform(x[0])


def _decode(root: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    return root.cls.predictions.decoder(hidden)  # (B, T, V): vocab-sharded under tensor parallelism


class BertForMaskedLM(nn.Module):
    """`forward(inputs)` gives MLM logits (B, T, V); `forward(inputs, labels)` the mean loss
    over the positions whose label is not -100. `inputs` is (B, 2, T): ids and token types."""

    def __init__(self, shape: BertShape):
        super().__init__()
        self.shape = shape
        self.bert = BertModel(shape)
        self.cls = BertOnlyMLMHead(shape)
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight  # tied
        # Replaced by the vocab-parallel loss when the decoder is sharded.
        self.loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = cross_entropy_per_token
        self.activation_checkpointing = False

    def pipeline_layers(self) -> List[PipeLayer]:
        """The forward in order: embeddings, encoder layers, the MLM head's transform, the
        decoder (tied to the word embeddings: under pp the last stage holds its own copy)."""
        tie = dict(tie="word_embeddings", tied_weight="bert.embeddings.word_embeddings.weight")
        pad = self.shape.pad_token_id
        return [PipeLayer(("bert.embeddings",), run=_embed, **tie),
                *(PipeLayer((f"bert.encoder.layer.{i}",), run=functools.partial(_encoder_layer, i, pad),
                            checkpointable=True) for i in range(self.shape.n_layer)),
                PipeLayer(("cls.predictions.transform",), run=_transform),
                PipeLayer(("bert.embeddings.word_embeddings", "cls.predictions.decoder"), run=_decode, **tie)]

    def forward(self, inputs: torch.Tensor, labels: Optional[torch.Tensor] = None) -> torch.Tensor:
        T = inputs.shape[-1]
        assert T <= self.shape.block_size, f"sequence length {T} > block_size {self.shape.block_size}"
        logits = run_layers(self, self.pipeline_layers(), inputs, activation_checkpointing=self.activation_checkpointing)
        if labels is None:
            return logits
        return masked_mean(self.loss_fn(logits, labels), labels)
