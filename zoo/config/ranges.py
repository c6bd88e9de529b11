"""The range of every numeric key of the training schema (zoo.config.schema), as data.

`check_ranges` runs first in the validation pass (zoo.config.validate.resolve_layout), before any
process starts, so nonsense that torch or DeepSpeed would only trip over on the ranks
(a dropout of 1.5, betas above 1, a negative epsilon) is refused in one line naming the
key, the value, the range and what the value means. The ranges are written here only: the
generated config reference (zoo.config.reference, docs/config.md) states each after the key's
docstring (tests/unit/config/test_config_ranges.py fails for a numeric key without a range). Rules across keys (divisibility, layout, batches) stay
in zoo.config.validate and the families' checks.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, List, Optional

from zoo.run.errors import ConfigError


@dataclass(frozen=True)
class Range:
    ge: Optional[float] = None
    gt: Optional[float] = None
    le: Optional[float] = None
    lt: Optional[float] = None
    hint: str = ""
    """What the value means, or the fix; said after the range."""

    def holds(self, v: float) -> bool:
        return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                and (self.ge is None or v >= self.ge) and (self.gt is None or v > self.gt)
                and (self.le is None or v <= self.le) and (self.lt is None or v < self.lt))

    def text(self) -> str:
        """How the schema's docstrings and the error messages say it."""
        low, high = self.ge if self.ge is not None else self.gt, self.le if self.le is not None else self.lt
        if high is None:
            return "positive" if self.gt == 0 else f"{'>=' if self.ge is not None else '>'} {_num(low)}"
        if low is None:
            return f"{'<=' if self.le is not None else '<'} {_num(high)}"
        return (f"in {'[' if self.ge is not None else '('}{_num(low)}, {_num(high)}"
                f"{']' if self.le is not None else ')'}")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


POSITIVE = Range(gt=0)
# Keys that take a number or `auto` (typed Any in the schema; what auto needs is checked below
# or in zoo.config.validate).
AUTO_KEYS = ("trainer.micro_batch_size", "checkpoint.every")

RANGES = {
    "model.n_layer": POSITIVE,
    "model.n_head": POSITIVE,
    "model.n_embd": POSITIVE,
    "model.n_kv_head": Range(gt=0, hint="it must also divide model.n_head"),
    "model.intermediate_size": POSITIVE,
    "model.rope_theta": Range(gt=0, hint="the rotary base; Llama uses 10000 or 500000"),
    "model.head_dim": Range(gt=0, hint="each head's width; rotary embeddings need it even"),
    "model.sliding_window": Range(gt=0, hint="the tokens a token attends to, itself included"),
    "model.ffn_mult": POSITIVE,
    "model.block_size": POSITIVE,
    "model.vocab_size": Range(gt=0, hint="at least the tokenizer's size, or null for the tokenizer's padded up"),
    "model.vocab_pad_multiple": POSITIVE,
    "model.dropout": Range(ge=0, lt=1, hint="the probability of zeroing an activation; 0 disables dropout"),
    "parallel.tp": POSITIVE,
    "parallel.pp": POSITIVE,
    "parallel.cp": POSITIVE,
    "parallel.dp": Range(gt=0, hint="or null"),
    "parallel.zero_stage": Range(ge=0, le=3, hint="DeepSpeed's ZeRO stages are 0, 1, 2 and 3"),
    "parallel.world_size": Range(gt=0, hint="the ranks parallel=auto starts, or null: one per GPU or CPU core"),
    "parallel.num_microbatches": Range(gt=0, hint="or null: derived from the global batch"),
    "parallel.timeout_s": Range(gt=0, hint="seconds a collective may wait before the job ends"),
    "data.image_size": Range(gt=0, hint="pixels, or null: the first image's size"),
    "data.mlm_probability": Range(gt=0, lt=1, hint="the share of tokens BERT learns to predict; BERT used 0.15"),
    "data.vocab_size": Range(ge=260, hint="a byte-level tokenizer holds its 256 byte tokens and special tokens "
                                         "before any merge"),
    "data.eval_fraction": Range(gt=0, lt=1, hint="the share of the source held out for evaluation"),
    "data.num_proc": Range(ge=1),
    "data.num_workers": Range(ge=0, hint="0: one background thread"),
    "optim.lr": POSITIVE,
    "optim.min_lr": Range(ge=0, hint="the learning rate the schedule ends at"),
    "optim.decay_fraction": Range(gt=0, le=1, hint="the share of the steps wsd's final decay takes"),
    "optim.warmup_steps": Range(ge=0),
    "optim.decay_steps": Range(gt=0, hint="or null: trainer.max_steps"),
    "optim.weight_decay": Range(ge=0),
    "optim.betas": Range(ge=0, lt=1, hint="AdamW's moving-average coefficients, e.g. [0.9, 0.95]"),
    "optim.eps": POSITIVE,
    "optim.momentum": Range(ge=0, lt=1, hint="SGD's momentum; 0: none"),
    "optim.grad_clip": Range(ge=0, hint="0 disables clipping"),
    "precision.loss_scale": Range(ge=0, hint="0: dynamic loss scaling"),
    "precision.initial_scale_power": Range(ge=0, le=32, hint="fp16's first loss scale is 2**this"),
    "precision.loss_scale_window": POSITIVE,
    "precision.hysteresis": POSITIVE,
    "precision.min_loss_scale": Range(gt=0, hint="the dynamic scale's floor, e.g. 1"),
    "plan.measure": Range(gt=0, hint="the planner's top layouts parallel=auto runs here before training, or null"),
    "plan.measure_steps": Range(ge=2, hint="each measured run's steps; the first, its warm-up, is not timed"),
    "trainer.max_steps": Range(ge=0),
    "trainer.global_batch_size": POSITIVE,
    "trainer.micro_batch_size": Range(gt=0, hint="an integer, or auto"),
    "trainer.seed": Range(ge=0, lt=2 ** 32, hint="numpy's seeds are 32-bit"),
    "trainer.log_every": POSITIVE,
    "trainer.eval_batches": Range(ge=0),
    "trainer.eval_every": Range(ge=0, hint="0: evaluate only at the end"),
    "trainer.early_stop.patience": Range(ge=0, hint="0: never stop early"),
    "trainer.eval_task_shots": Range(ge=0, hint="0: no few-shot examples"),
    "trainer.early_stop.min_delta": Range(ge=0),
    "trainer.profile.start": Range(ge=0, hint="the first profiled step, counted from 1; 0: no profiling"),
    "trainer.profile.steps": POSITIVE,
    "trainer.sample_tokens": Range(ge=0, hint="0: no sample"),
    "trainer.sample_temperature": Range(ge=0, hint="0: greedy"),
    "trainer.sample_top_k": Range(ge=0, hint="0: the whole vocabulary"),
    "trainer.max_nonfinite_steps": POSITIVE,
    "checkpoint.every": Range(ge=0, hint="0: only on request (signals); auto: from run.mtbf_hours"),
    "run.max_restarts": Range(ge=0, hint="restarts of the ranks inside the job; 0: a failure ends the job"),
    "run.mtbf_hours": Range(gt=0, hint="the job's mean time between failures, in hours"),
    "checkpoint.keep": POSITIVE,
}
def _value(cfg, key: str) -> Any:
    for name in key.split("."):
        cfg = getattr(cfg, name)
    return cfg


def message(key: str, value: Any) -> str:
    r = RANGES[key]
    return f"{key}={value!r} must be {r.text()}" + (f" ({r.hint})" if r.hint else "")


def check_ranges(cfg) -> None:
    """Raise ConfigError for the first key whose value is outside its range (None passes for
    the optional keys; `auto` for the micro-batch, whose other rules zoo.config.validate checks)."""
    for key, r in RANGES.items():
        value = _value(cfg, key)
        if value is None or (key in AUTO_KEYS and value == "auto"):
            continue
        if key == "optim.betas":
            if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(r.holds(b) for b in value)):
                raise ConfigError(f"optim.betas={list(value) if isinstance(value, (list, tuple)) else value!r} "
                                  f"must be two numbers {r.text()} ({r.hint})")
            continue
        if not r.holds(value):  # the schema's types already hold (Hydra refuses 1.5 for an int key)
            raise ConfigError(message(key, value))
    t = cfg.trainer
    if cfg.checkpoint.every == "auto" and cfg.run.mtbf_hours is None:
        raise ConfigError("checkpoint.every=auto sets the interval from the job's failure rate, and run.mtbf_hours is "
                          "not set: give the job's mean time between failures in hours (e.g. run.mtbf_hours=24), or "
                          "a number of steps (checkpoint.every=N)")
    if t.early_stop.patience and not t.eval_every:
        raise ConfigError(f"trainer.early_stop.patience={t.early_stop.patience} needs periodic evaluation: set "
                          f"trainer.eval_every=N (e.g. {max(1, t.max_steps // 10)})")
    if cfg.checkpoint.best and not t.eval_every:
        raise ConfigError("checkpoint.best=true keeps the checkpoint of the best evaluation: set "
                          f"trainer.eval_every=N (e.g. {max(1, t.max_steps // 10)})")
    if t.eval_every and t.eval_batches == 0:
        raise ConfigError(f"trainer.eval_every={t.eval_every} with trainer.eval_batches=0 evaluates nothing: set "
                          f"trainer.eval_batches to a positive number (or null: the whole held-out split)")
    p = t.profile
    if p.start and p.start + p.steps - 1 > t.max_steps:
        last = p.start + p.steps - 1
        fix = (f"trainer.profile.start={max(1, t.max_steps - p.steps + 1)}" if p.steps <= t.max_steps
               else f"trainer.profile.steps={t.max_steps}")
        raise ConfigError(f"trainer.profile.start={p.start} with trainer.profile.steps={p.steps} profiles steps "
                          f"{p.start}-{last}, beyond trainer.max_steps={t.max_steps}: set {fix}, or raise "
                          f"trainer.max_steps to at least {last}")
    o = cfg.optim
    if o.min_lr > o.lr:
        raise ConfigError(f"optim.min_lr={o.min_lr:g} is above optim.lr={o.lr:g}: the cosine decay would raise the "
                          f"learning rate; set optim.min_lr <= optim.lr (e.g. {o.lr / 10:g})")


def range_warnings(cfg) -> List[str]:
    """Values that are legal but surely not meant."""
    t, o, out = cfg.trainer, cfg.optim, []
    schedule = o.decay_steps or t.max_steps
    if t.max_steps and o.warmup_steps >= schedule:
        out.append(f"optim.warmup_steps={o.warmup_steps} is not shorter than the schedule's {schedule} steps "
                   f"({'optim.decay_steps' if o.decay_steps else 'trainer.max_steps'}): the learning rate never "
                   f"reaches optim.lr={o.lr:g}; lower the warmup (e.g. {max(1, schedule // 10)})")
    if t.eval_every > t.max_steps > 0:
        out.append(f"trainer.eval_every={t.eval_every} is more than trainer.max_steps={t.max_steps}: the run "
                   f"evaluates only at the end")
    if cfg.checkpoint.every != "auto" and cfg.checkpoint.every > t.max_steps > 0:
        out.append(f"checkpoint.every={cfg.checkpoint.every} is more than trainer.max_steps={t.max_steps}: no "
                   f"periodic checkpoint is written in this run")
    return out


def numeric_keys(schema_sections: dict) -> List[str]:
    """Every key of the schema sections whose type is a number (or a list of numbers)."""
    out = []
    for section, cls in schema_sections.items():
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(f.default_factory):  # a nested section (trainer.early_stop)
                out += numeric_keys({f"{section}.{f.name}": f.default_factory})
            elif re.search(r"\b(int|float)\b", str(f.type)) or f"{section}.{f.name}" in AUTO_KEYS:
                out.append(f"{section}.{f.name}")
    return out
