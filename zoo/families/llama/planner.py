"""What the planner needs to know about zoo's Llama (`zoo.plan.model_desc.ModelDesc`): per piece
its parameters, the activations backward keeps, its FLOPs and its tensor-parallel traffic."""
from __future__ import annotations

from zoo.config.schema import ModelConfig
from zoo.families.llama.dims import llama_dims
from zoo.families.transformer import padded_vocab
from zoo.plan.model_desc import Activations, ModelDesc, ParamCount, Piece


def describe(cfg: ModelConfig, vocab_size: int) -> ModelDesc:
    """zoo's Llama (`zoo.models.llama`): pre-RMSNorm blocks without biases, grouped-query
    attention (k_proj and v_proj map h to n_kv_head * head_dim), a SwiGLU MLP (three matrices
    of h x intermediate), rotary positions (no parameters), an untied LM head (tied with model.tie_embeddings, as
    smollm-135m), no dropout.

    Activations per token of a layer: what autograd saves of zoo's layer (measured with
    torch.autograd.graph.saved_tensors_hooks, tests/unit/plan/test_llama_activations.py; at
    TinyLlama's width 39,586 fp32 elements a token, of which this count leaves out only RoPE's
    tables and RMSNorm's two reciprocal norms, 130; the GPT-style count before was 0.75x). Split over tp:
    Q and K rotated (h, kv), V (kv), SDPA's log-sum-exp (one a head), the attention output (h),
    and four of the MLP's width: the gate output (SiLU's input), SiLU's output and the up
    output (the product's two inputs) and the product (the down projection's input).
    Replicated unless sequence parallelism splits them: each RMSNorm's input and its
    normalised input (x * rsqrt, kept for the weight's product), and the two column-parallel
    inputs (6h). RoPE's backward needs only its cos/sin tables."""
    vocab = padded_vocab(vocab_size, cfg)
    d = llama_dims(cfg, vocab)  # every dimension the config overrides (n_kv_head, intermediate_size, tied)
    h, inter, s, v = d.n_embd, d.intermediate_size, d.block_size, d.vocab_size
    kv, q = d.n_kv_head * d.head_dim, d.q_width  # q = h unless the heads have a width of their own (Qwen3)
    matmul_params = h * q + 2 * h * kv + q * h + 3 * h * inter  # q, k, v, o, gate, up, down
    biases = (q + 2 * kv) if d.attention_bias else 0  # Qwen2's, split with their projections
    qk_norms = 2 * d.head_dim if d.qk_norm else 0  # Qwen3's, replicated; autograd keeps their inputs and outputs
    layer = Piece(params=ParamCount(sharded=matmul_params + biases, replicated=2 * h + qk_norms),
                  activations=Activations(tp_elems=2 * q + 2 * kv + 4 * inter + d.n_head + (2 * (q + kv) if qk_norms else 0),
                                          sp_elems=6 * h),
                  checkpoint=Activations(sp_elems=h),
                  fwd_flops_per_token=2 * matmul_params + 4 * q * s,  # + QK^T and AV over all query heads
                  # after o_proj's and down_proj's row-parallel outputs in forward, before the
                  # column-parallel inputs in backward
                  tp_allreduce_elems_per_token=4 * h)
    embedding = Piece(params=ParamCount(sharded=v * h), activations=Activations(), checkpoint=Activations(),
                      fwd_flops_per_token=0, tp_allreduce_elems_per_token=h)  # the vocab-parallel lookup's sum
    # model.norm and lm_head. Kept: the norm's input and normalised input (x * rsqrt) and
    # lm_head's input (h each, as a layer's RMSNorms keep them) and the loss's
    # float32 log-softmax (V/tp * 4 bytes; not the logits, which its backward does not read). The
    # loss's backward allocates the gradients of the log-softmax and of the logits beside it.
    tied = d.tie_embeddings  # the head is the embedding: no parameters of its own (a copy on pp's last stage)
    head = Piece(params=ParamCount(sharded=0 if tied else v * h, replicated=h),
                 activations=Activations(sp_elems=3 * h, tp_bytes=4 * v),
                 checkpoint=Activations(sp_elems=3 * h, tp_bytes=4 * v),
                 fwd_flops_per_token=2 * v * h, backward_extra=Activations(tp_elems=v, tp_bytes=4 * v),
                 tp_allreduce_elems_per_token=h)  # lm_head's input gradient (backward)
    vocab_key = "model.vocab_size" if cfg.vocab_size is not None else "model.vocab_pad_multiple"
    keys = ("n_layer", "n_head", "n_kv_head", "n_embd", "intermediate_size", "block_size", "vocab_size")
    overrides = ", ".join(f"{k}={getattr(cfg, k)}" for k in keys if getattr(cfg, k) is not None)
    return ModelDesc(name=f"llama {cfg.size}" + (f" [{overrides}]" if overrides else ""), embedding=embedding,
                     layers=(layer,) * d.n_layer, head=head, head_ties_embedding=tied, tokens_per_sample=s,
                     hidden_size=h, gemm_shape=(h, min(h, kv)), kv_width=2 * kv,
                     windowed=d.sliding_window is not None and d.sliding_window < s,
                     cp_kept_extra=q,  # the attention output twice (separate k and v projections: not kept)
                     tp_divides={"model.n_head": d.n_head, "model.n_kv_head": d.n_kv_head,
                                 "model.intermediate_size": inter,
                                 vocab_key: cfg.vocab_size if cfg.vocab_size is not None else cfg.vocab_pad_multiple})
