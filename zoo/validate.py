"""One validation pass over the composed config, before any process or process group starts.

Each rule raises `ConfigError` with what is wrong, the numbers and the fix; `zoo.train`
prints it as one line and exits 2. Rules that only warn return their messages.
"""
from __future__ import annotations

from typing import List, Optional

from zoo.config.schema import Config
from zoo.parallel.topology import Layout

FAMILIES = ("gpt",)
DTYPES = ("fp32", "bf16", "fp16")
LOGGERS = ("wandb", "none")
DATA_SOURCES = ("pydoc",)


class ConfigError(ValueError):
    """A user mistake in the config; the message names the key, the numbers and the fix."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def resolve_layout(cfg: Config, world_size: Optional[int]) -> tuple[Layout, List[str]]:
    """The layout of this run. `world_size` is the launcher's (None for a local run, where
    `parallel.dp` says how many replicas to start)."""
    p = cfg.parallel
    warnings: List[str] = []
    for key in ("tp", "pp"):
        _require(getattr(p, key) >= 1, f"parallel.{key}={getattr(p, key)} must be >= 1")
    _require(p.dp is None or p.dp >= 1, f"parallel.dp={p.dp} must be >= 1 (or null)")
    if world_size is None:
        dp = p.dp or 1
    else:
        model_ranks = p.tp * p.pp
        _require(world_size % model_ranks == 0,
                 f"world size {world_size} is not divisible by parallel.tp({p.tp}) * parallel.pp({p.pp}) "
                 f"= {model_ranks}; launch a multiple of {model_ranks} ranks or change tp/pp")
        dp = world_size // model_ranks
        if p.dp is not None and p.dp != dp:
            warnings.append(f"parallel.dp={p.dp} is ignored under an external launcher: dp = world size "
                            f"{world_size} / (tp {p.tp} * pp {p.pp}) = {dp}")
    return Layout(tp=p.tp, pp=p.pp, dp=dp, zero_stage=p.zero_stage), warnings


def validate(cfg: Config, layout: Layout, *, cuda_available: bool) -> List[str]:
    """Check every cross-key rule; returns warnings, raises ConfigError on the first error."""
    from zoo.models import model_dims

    warnings: List[str] = []
    t, p, m = cfg.trainer, cfg.parallel, cfg.model
    _require(m.family in FAMILIES, f"model.family={m.family!r} is unknown; choose one of {list(FAMILIES)}")
    _require(cfg.precision.dtype in DTYPES,
             f"precision.dtype={cfg.precision.dtype!r} is unknown; choose one of {list(DTYPES)}")
    _require(cfg.logger.kind in LOGGERS, f"logger.kind={cfg.logger.kind!r} is unknown; choose one of {list(LOGGERS)}")
    _require(cfg.data.name in DATA_SOURCES,
             f"data.name={cfg.data.name!r} is unknown; choose one of {list(DATA_SOURCES)}")
    for key in ("global_batch_size", "micro_batch_size", "log_every"):
        _require(getattr(t, key) > 0, f"trainer.{key}={getattr(t, key)} must be positive")
    _require(t.max_steps >= 0, f"trainer.max_steps={t.max_steps} must be >= 0")
    _require(t.eval_batches >= 0, f"trainer.eval_batches={t.eval_batches} must be >= 0")
    _require(0 < cfg.data.eval_fraction < 1, f"data.eval_fraction={cfg.data.eval_fraction} must be in (0, 1)")
    _require(cfg.optim.lr > 0, f"optim.lr={cfg.optim.lr} must be positive")
    _require(p.zero_stage in (0, 1, 2, 3), f"parallel.zero_stage={p.zero_stage} must be 0, 1, 2 or 3")
    _require(p.timeout_s > 0, f"parallel.timeout_s={p.timeout_s} must be positive")
    if cfg.precision.dtype == "fp16":
        _require(cuda_available, "precision=fp16 needs CUDA (dynamic loss scaling runs on the GPU) and no GPU "
                                 "is visible; use precision=bf16 or precision=fp32 on this machine")
    try:
        dims = model_dims(m, vocab_size=m.vocab_size)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    for key in ("n_layer", "n_head", "n_embd", "block_size"):
        _require(getattr(dims, key) > 0, f"model.{key}={getattr(dims, key)} must be positive")
    _require(dims.n_embd % dims.n_head == 0,
             f"model.n_embd={dims.n_embd} is not divisible by model.n_head={dims.n_head}")
    if layout.tp > 1:
        for what, size in (("model.n_head", dims.n_head), ("the FFN width", dims.ffn_dim)):
            _require(size % layout.tp == 0,
                     f"parallel.tp={layout.tp} does not divide {what} ({size}); choose tp among "
                     f"{[d for d in range(1, size + 1) if size % d == 0 and d <= 64]}")
        if m.vocab_size is None:
            _require(m.vocab_pad_multiple % layout.tp == 0,
                     f"parallel.tp={layout.tp} does not divide model.vocab_pad_multiple ({m.vocab_pad_multiple}), "
                     f"the multiple the vocabulary is padded to; set model.vocab_pad_multiple to a multiple of {layout.tp}")
        else:
            _require(m.vocab_size % layout.tp == 0,
                     f"parallel.tp={layout.tp} does not divide model.vocab_size ({m.vocab_size}); pad it to "
                     f"{-(-m.vocab_size // (128 * layout.tp)) * 128 * layout.tp} or leave model.vocab_size null")
    _require(layout.pp <= dims.n_layer,
             f"parallel.pp={layout.pp} is more than the {dims.n_layer} layers of model.size={m.size}; use pp <= {dims.n_layer}")
    if layout.pp > 1:
        _require(p.zero_stage <= 1,
                 f"parallel.zero_stage={p.zero_stage} with parallel.pp={layout.pp}: DeepSpeed's pipeline engine supports "
                 f"ZeRO stage 0 or 1 only; set parallel.zero_stage=1 or parallel.pp=1")
    _require(p.num_microbatches is None or p.num_microbatches > 0,
             f"parallel.num_microbatches={p.num_microbatches} must be positive (or null)")
    if layout.pp == 1 and p.num_microbatches is None:
        per_step, what = t.micro_batch_size * layout.dp, f"trainer.micro_batch_size({t.micro_batch_size}) * dp({layout.dp})"
    else:
        count = p.num_microbatches or 3 * layout.pp
        per_step, what = count * layout.dp, f"micro-batches({count}) * dp({layout.dp})"
        _require(count >= layout.pp,
                 f"{count} micro-batches per step is fewer than the {layout.pp} pipeline stages: stages would sit "
                 f"idle; set parallel.num_microbatches to at least {2 * layout.pp} (2-4 x pp)")
        if count < 2 * layout.pp:
            bubble = (layout.pp - 1) / (count + layout.pp - 1)
            warnings.append(f"{count} micro-batches for {layout.pp} pipeline stages: the expected bubble is "
                            f"(p-1)/(m+p-1) = {bubble:.0%} of the step; use parallel.num_microbatches >= {2 * layout.pp}")
    _require(t.global_batch_size % per_step == 0,
             f"trainer.global_batch_size={t.global_batch_size} is not divisible by {what} = {per_step}; "
             f"set trainer.global_batch_size to a multiple of {per_step}, "
             f"e.g. {max(1, round(t.global_batch_size / per_step)) * per_step}")

    return warnings
