"""What the planner needs to know about zoo's GPT (`zoo.plan.model_desc.ModelDesc`): per piece
its parameters, the activations backward keeps, its FLOPs and its tensor-parallel traffic."""
from __future__ import annotations

from zoo.config.schema import ModelConfig
from zoo.families.transformer import padded_vocab, shape_from_config
from zoo.models.gpt import gpt_shape
from zoo.plan.model_desc import (
    Activations,
    ModelDesc,
    ParamCount,
    Piece,
    gpt_layer_activations,
)


def describe(cfg: ModelConfig, vocab_size: int) -> ModelDesc:
    """zoo's GPT (`zoo.models.gpt`): pre-LN blocks, tied embeddings, learned positions.

    Its attention is `F.scaled_dot_product_attention`, whose fused kernels keep only the
    output and a log-sum-exp, never the a*s scores per token, so `stores_attention_scores`
    is False here (Korthikanti's 5as/h term is Megatron's unfused softmax).
    """
    vocab = padded_vocab(vocab_size, cfg)
    d = shape_from_config(gpt_shape, cfg, vocab)
    h, f, s, a, v = d.n_embd, d.ffn_dim, d.block_size, d.n_head, d.vocab_size
    dropout = d.dropout > 0
    # c_attn (h -> 3h) and c_fc (h -> f) are column-parallel with their biases; c_proj of
    # attention and MLP are row-parallel, their biases and both LayerNorms replicated.
    layer_params = ParamCount(sharded=3 * h * h + 3 * h + h * h + h * f + f + f * h,
                              replicated=h + h + 4 * h)
    matmul_params = 3 * h * h + h * h + 2 * h * f
    layer = Piece(params=layer_params,
                  activations=gpt_layer_activations(h, a, s, f, dropout=dropout, stores_attention_scores=False),
                  checkpoint=Activations(sp_elems=h),
                  fwd_flops_per_token=2 * matmul_params + 4 * h * s,  # + QK^T and AV: 2*s*h each
                  # after attention's and the MLP's row-parallel c_proj in forward, before their
                  # column-parallel inputs in backward
                  tp_allreduce_elems_per_token=4 * h)
    embedding = Piece(params=ParamCount(sharded=v * h, replicated=s * h),
                      activations=Activations(sp_bytes=h if dropout else 0),
                      checkpoint=Activations(sp_bytes=h if dropout else 0), fwd_flops_per_token=0,
                      tp_allreduce_elems_per_token=h)  # the vocab-parallel lookup's sum (forward)
    # ln_f (lm_head is wte). Kept: ln_f and lm_head inputs (h each) and the loss's float32
    # log-softmax (V/tp * 4 bytes, Korthikanti's 4sbv/t); the logits themselves are not kept
    # (the log-softmax's backward reads its output). The loss's backward allocates the gradient
    # of the log-softmax (float32) and of the logits (counted as V/tp in the dtype) beside it.
    head = Piece(params=ParamCount(replicated=2 * h),
                 activations=Activations(sp_elems=2 * h, tp_bytes=4 * v),
                 checkpoint=Activations(sp_elems=2 * h, tp_bytes=4 * v),
                 fwd_flops_per_token=2 * v * h, backward_extra=Activations(tp_elems=v, tp_bytes=4 * v),
                 tp_allreduce_elems_per_token=h)  # lm_head's input gradient (backward); the loss's are scalars
    vocab_key = "model.vocab_size" if cfg.vocab_size is not None else "model.vocab_pad_multiple"
    overrides = ", ".join(f"{k}={getattr(cfg, k)}" for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")
                          if getattr(cfg, k) is not None)
    return ModelDesc(name=f"gpt {cfg.size}" + (f" [{overrides}]" if overrides else ""), embedding=embedding,
                     layers=(layer,) * d.n_layer, head=head, head_ties_embedding=True, tokens_per_sample=s, hidden_size=h, gemm_shape=(h, h), kv_width=2 * h,
                     cp_kept_extra=3 * h,  # the attention output twice over h, the share's keys and values in c_attn's output
                     tp_divides={"model.n_head": a, "the FFN width": f,
                                 vocab_key: cfg.vocab_size if cfg.vocab_size is not None else cfg.vocab_pad_multiple})
