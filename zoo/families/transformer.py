"""What the transformer families (GPT, BERT) share: the vocabulary padding, their part of
validation (dimensions and their tensor-parallel splits, those of an imported model under
model.init_from) and their model FLOPs."""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

from zoo.config.schema import Config, ModelConfig
from zoo.families.llama.keys import LlamaModelKeys
from zoo.parallel.topology import Layout
from zoo.run.errors import ConfigError, require

# Used for checks before the tokenizer is known; any multiple of the pad size.
PLACEHOLDER_VOCAB = 128
# ModelConfig keys only the Llama family reads (its keys.py declares them).
LLAMA_KEYS = tuple(f.name for f in dataclasses.fields(LlamaModelKeys))


def padded_vocab(tokenizer_len: int, cfg: ModelConfig) -> int:
    """The model's vocabulary: model.vocab_size, or the tokenizer's padded to vocab_pad_multiple."""
    if cfg.vocab_size is not None:
        if cfg.vocab_size < tokenizer_len:
            raise ConfigError(f"model.vocab_size={cfg.vocab_size} is smaller than the tokenizer's {tokenizer_len} "
                              f"tokens; raise it or leave it null")
        return cfg.vocab_size
    m = cfg.vocab_pad_multiple
    return -(-tokenizer_len // m) * m


def config_overrides(cfg: ModelConfig) -> dict:
    """The dimensions a config sets over its size preset (None: the preset's)."""
    return dict(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd, block_size=cfg.block_size,
                ffn_mult=cfg.ffn_mult, dropout=cfg.dropout)


def shape_from_config(make_shape, cfg: ModelConfig, vocab_size: Optional[int] = None, **extra):
    """`make_shape(size, vocab, **dims)` with the config's overrides of its size preset (a
    placeholder vocabulary where the tokenizer is not known yet)."""
    return make_shape(cfg.size, vocab_size or PLACEHOLDER_VOCAB, **config_overrides(cfg), **extra)


def imported_dims(spec, m: ModelConfig):
    """The shape of the transformers model that model.init_from names (its config.json)."""
    from zoo.checkpoint.hf_weights import hf_meta

    try:  # validation named the family the directory holds before (zoo.config.validate)
        meta = hf_meta(m.init_from, spec, m.vocab_pad_multiple)
    except KeyError as err:
        raise ConfigError(f"model.init_from={m.init_from}: its config.json has no {err}") from None
    return spec.shape_type(**trained_block(spec, meta, m))


def trained_block(spec, meta: dict, m: ModelConfig) -> dict:
    """An import's shape fields with model.block_size, where set, as the length it trains on:
    shorter than the import's own for a family whose positions are computed (Llama's rotary
    ones: `max_positions` keeps the import's for its export); refused where positions are a
    table of the import's length (GPT, BERT) or where it is longer than the import's."""
    own = meta["block_size"]
    if m.block_size is None or m.block_size == own:
        return meta
    fields = {f.name for f in dataclasses.fields(spec.shape_type)}
    if "max_positions" not in fields:
        raise ConfigError(f"model.block_size={m.block_size} with model.init_from={m.init_from}: its position table "
                          f"holds {own} positions, the length this family trains on; drop model.block_size")
    if m.block_size > own:
        raise ConfigError(f"model.block_size={m.block_size} is longer than model.init_from={m.init_from}'s "
                          f"{own} positions (max_position_embeddings); use at most {own}")
    return {**meta, "block_size": m.block_size, "max_positions": meta.get("max_positions") or own}


def check_transformer(spec, cfg: Config, layout: Layout, warnings: List[str]) -> Tuple[int, str]:
    """Dimensions and their tensor-parallel splits. Returns the layer count."""
    m = cfg.model
    try:
        dims = imported_dims(spec, m) if m.init_from else spec.shape(m, m.vocab_size)
    except ConfigError:
        raise
    except ValueError as err:
        raise ConfigError(str(err)) from None
    fields = {f.name for f in dataclasses.fields(spec.shape_type)}
    fields |= {"head_dim"} if "head_size" in fields else set()  # model.head_dim sets the shape's head_size
    for key in LLAMA_KEYS:  # set for a family that has no such dimension: refused, not ignored
        if getattr(m, key) is not None and key not in fields:
            raise ConfigError(f"model.{key}={getattr(m, key)}: model.family={m.family} has no such setting (a Llama "
                              f"key{'; its embeddings are always tied' if key == 'tie_embeddings' else ''}); remove it")
    for key in ("n_layer", "n_head", "n_embd", "block_size"):
        require(getattr(dims, key) > 0, f"model.{key}={getattr(dims, key)} must be positive")
    require(getattr(dims, "head_size", None) or dims.n_embd % dims.n_head == 0,
             f"model.n_embd={dims.n_embd} is not divisible by model.n_head={dims.n_head}; change one"
             + (" or set model.head_dim" if "head_size" in fields else ""))
    if layout.tp > 1:
        heads = "the imported model's heads" if m.init_from else "model.n_head"
        for what, size in ((heads, dims.n_head), ("the FFN width", dims.ffn_dim)):
            require(size % layout.tp == 0,
                     f"parallel.tp={layout.tp} does not divide {what} ({size}); choose tp among "
                     f"{[d for d in range(1, size + 1) if size % d == 0 and d <= 64]}")
        if m.init_from:
            require(dims.vocab_size % layout.tp == 0,
                     f"parallel.tp={layout.tp} does not divide the vocabulary of model.init_from={m.init_from} "
                     f"({dims.vocab_size} tokens), which the embedding splits by rows; "
                     + (f"zoo pads an imported vocabulary to a multiple of model.vocab_pad_multiple="
                        f"{m.vocab_pad_multiple}: set it to a multiple of {layout.tp} (e.g. 128)" if spec.hf.vocab_rows
                        else f"choose tp among {[d for d in range(1, 65) if dims.vocab_size % d == 0]}, or pad the "
                        f"model's vocabulary first (transformers: resize_token_embeddings(n, "
                        f"pad_to_multiple_of={128 * layout.tp}))"))
        elif m.vocab_size is None:
            require(m.vocab_pad_multiple % layout.tp == 0,
                     f"parallel.tp={layout.tp} does not divide model.vocab_pad_multiple ({m.vocab_pad_multiple}), "
                     f"the multiple the vocabulary is padded to; set model.vocab_pad_multiple to a multiple of {layout.tp}")
        else:
            require(m.vocab_size % layout.tp == 0,
                     f"parallel.tp={layout.tp} does not divide model.vocab_size ({m.vocab_size}); pad it to "
                     f"{-(-m.vocab_size // (128 * layout.tp)) * 128 * layout.tp} or leave model.vocab_size null")
    if layout.cp > 1:
        _check_context_split(dims.block_size, layout, cfg.parallel.sequence_parallel)
    return dims.n_layer, f"layers of model.init_from={m.init_from}" if m.init_from else f"layers of model.size={m.size}"


def _check_context_split(block: int, layout: Layout, sequence_parallel: bool) -> None:
    """parallel.cp cuts each block into 2 x cp equal chunks (zoo.parallel.context); sequence
    parallelism then splits each cp rank's share over tp."""
    cp = layout.cp
    require(block % (2 * cp) == 0,
            f"parallel.cp={cp} cuts each block into 2 x cp = {2 * cp} chunks and model.block_size={block} does "
            f"not divide by {2 * cp}; use a block size of {max(block // (2 * cp), 1) * 2 * cp} or a cp with "
            f"2 x cp dividing {block}")
    if sequence_parallel and layout.tp > 1:
        require((block // cp) % layout.tp == 0,
                f"parallel.sequence_parallel=true splits each cp rank's {block // cp} tokens (model.block_size="
                f"{block} / parallel.cp={cp}) over parallel.tp={layout.tp}, which does not divide them; use a "
                f"block size divisible by {2 * cp * layout.tp}")


def transformer_flops_per_sample(task) -> Tuple[Optional[float], str]:
    """6N + 12*L*H*Q*T per token (zoo.observe.flops), times the tokens of one sample."""
    from zoo.observe.flops import transformer_flops_per_token

    shape, tokens = task.shape, task.tokens_per_sample()
    return (tokens * transformer_flops_per_token(task.num_params(), shape.n_layer, shape.n_embd, shape.block_size,
                                                 tokens), "6N + 12*L*H*Q*T")
