"""The BERT family: `BertForMaskedLM`'s architecture (`zoo.models.bert`) trained by masked-LM
on sentence-pair samples; tensor parallelism by heads and MLP columns (vocab-parallel word
embeddings, decoder and loss), `BertForMaskedLM` in and out."""
from __future__ import annotations

from zoo.families import data_keys
from zoo.families.bert import hf
from zoo.families.bert.task import BertTask
from zoo.families.spec import FamilySpec, HFConverter
from zoo.families.transformer import (
    check_transformer,
    shape_from_config,
    transformer_flops_per_sample,
)
from zoo.models.bert import BERT_PUBLISHED, BERT_SIZES, BertForMaskedLM, BertShape, bert_init_std, bert_shape
from zoo.parallel.cross_entropy import TokenLoss
from zoo.parallel.tp_rules import TPRules

# q, k and v are separate projections (HF's layout): split column-wise, each rank holds the
# same whole heads of all three. The MLM decoder is the head tied to the vocab-parallel
# word embeddings, its bias split with it; the head's transform stays replicated.
TP_RULES = TPRules(
    layers=(
        ("bert.embeddings.word_embeddings", "vocab"),
        ("bert.encoder.layer.*.attention.self.query", "column"),
        ("bert.encoder.layer.*.attention.self.key", "column"),
        ("bert.encoder.layer.*.attention.self.value", "column"),
        ("bert.encoder.layer.*.attention.output.dense", "row"),
        ("bert.encoder.layer.*.intermediate.dense", "column"),
        ("bert.encoder.layer.*.output.dense", "row"),
        ("cls.predictions.decoder", "head"),
    ),
    ties=(("cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight"),),
)


def _shape(cfg, vocab_size=None, pad_token_id=0) -> BertShape:
    return shape_from_config(bert_shape, cfg, vocab_size, pad_token_id=pad_token_id)


SPEC = FamilySpec(
    name="bert", model=BertForMaskedLM, shape_type=BertShape, shape=_shape, task=BertTask,
    init_std=lambda shape, _module: (lambda name: bert_init_std(name, shape)),
    check=lambda cfg, layout, warnings: check_transformer(SPEC, cfg, layout, warnings),
    data_sources=("pydoc", "files", "hub", "prepared"), reads="text", 
    mix_sources=("pydoc", "files", "hub"),
    sizes=tuple(BERT_SIZES), published=BERT_PUBLISHED, data_keys=data_keys.MASKED_TEXT,
    pipeline_loss=TokenLoss, flops_per_sample=transformer_flops_per_sample, tp_rules=TP_RULES,
    hf=HFConverter.of(hf, model_types=("bert",), loads_as="BertForMaskedLM"),
)
