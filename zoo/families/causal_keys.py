"""The `data.*` keys only the causal language models (GPT, Llama) read;
`zoo.config.schema.DataConfig` composes them, and `zoo.families.data_keys.CAUSAL_TEXT`
says which of their sources read each (validation refuses them for BERT and the CNN)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class DocumentDataKeys:
    document_mask: bool = False
    """GPT and Llama: attention only within a document (block-causal) and positions restarting
    at each document's start, in the packed blocks (zoo.models.documents); false: a block's
    tokens attend to every earlier token of the block, positions 0..block_size-1."""
    eod_mask_loss: bool = False
    """GPT and Llama: no target across a document boundary (Megatron's --eod-mask-loss): the
    position whose input is the end-of-document token predicts nothing. The loss is then the mean
    over the global batch's targets that count (zoo.parallel.token_weights), the same on every
    layout and micro-batching, as evaluation's."""
    train_on: str = "assistant"
    """data=chat: which tokens are targets: `assistant` (every assistant turn, its end-of-turn
    token included), `last_turn` (the last assistant turn), `all` (every token)."""
    chat_template: Optional[str] = None
    """data=chat: the template conversations are rendered with. None: the tokenizer's own;
    `chatml` (ChatML turns, the assistant's marked for masking); or a .jinja file."""
    packing: bool = True
    """data=chat: conversations packed whole into each block, in order (with data.document_mask:
    none sees another); false: a row a conversation, the rows in length buckets (BERT's pooled
    order), each micro-batch cut to its longest row (whole blocks under pp x tp)."""
    truncate: str = "end"
    """data=chat: a conversation longer than model.block_size is cut at its `end` (counted in
    the start line) or `refuse`d, naming its file and line."""
