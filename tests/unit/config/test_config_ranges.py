"""Every numeric key of the training schema has a range (zoo.config.ranges, written there
only), the generated reference says that range, and a value outside it is refused in the validation pass with one line
naming the key, the value and the range."""
from __future__ import annotations

import re

import pytest

import zoo.config.schema as schema
from tests.unit.config.test_config import check, composed
from zoo.config.ranges import RANGES, numeric_keys
from zoo.run.errors import ConfigError

SECTIONS = {"model": schema.ModelConfig, "parallel": schema.ParallelConfig, "data": schema.DataConfig,
            "optim": schema.OptimConfig, "precision": schema.PrecisionConfig, "trainer": schema.TrainerConfig,
            "checkpoint": schema.CheckpointConfig, "logger": schema.LoggerConfig, "plan": schema.MeasureConfig,
            "run": schema.RunConfig}


def test_the_sections_walked_are_every_section_of_the_schema():
    import dataclasses

    sections = {f.name for f in dataclasses.fields(schema.Config) if dataclasses.is_dataclass(f.default_factory)}
    assert [k for k in numeric_keys({"top": schema.Config}) if k.count(".") == 1] == []  # no number at the top
    assert sections == set(SECTIONS)


def test_every_numeric_key_has_a_range_and_nothing_else_does():
    keys = numeric_keys(SECTIONS)
    assert len(keys) >= 40
    assert set(keys) == set(RANGES), (sorted(set(keys) - set(RANGES)), sorted(set(RANGES) - set(keys)))


def _docstrings() -> dict:
    """{section.key: the docstring under the key} (zoo.config.reference reads them)."""
    from zoo.config.reference import keys

    return {key: doc for key, _, _, doc in keys()}


def test_every_range_is_written_once_and_the_reference_states_the_one_checked():
    docs = _docstrings()
    wrong = [k for k, r in RANGES.items() if not docs.get(k, "").endswith(f"Range: {r.text()}.")]
    assert not wrong, wrong
    import inspect

    from zoo.config.reference import docstrings

    written = [(cls.__name__, k) for cls in SECTIONS.values() for k, d in docstrings(cls).items() if "Range:" in d]
    assert not written, f"a range written in a docstring again (zoo.config.ranges holds them): {written}"
    assert "Range:" not in inspect.getsource(schema)


# One value outside each range: (override, what the line must say).
OUTSIDE = {
    "model.n_layer": ("0", "must be positive"),
    "model.n_head": ("-2", "must be positive"),
    "model.n_embd": ("0", "must be positive"),
    "model.n_kv_head": ("0", "must be positive (it must also divide model.n_head)"),
    "model.intermediate_size": ("-1", "must be positive"),
    "model.rope_theta": ("0", "must be positive"),
    "model.head_dim": ("0", "must be positive"),
    "model.sliding_window": ("-4", "must be positive"),
    "model.ffn_mult": ("0", "must be positive"),
    "model.block_size": ("0", "must be positive"),
    "model.vocab_size": ("0", "must be positive"),
    "model.vocab_pad_multiple": ("0", "must be positive"),
    "model.dropout": ("1.5", "must be in [0, 1)"),
    "parallel.tp": ("0", "must be positive"),
    "parallel.pp": ("-1", "must be positive"),
    "parallel.cp": ("0", "must be positive"),
    "parallel.dp": ("0", "must be positive (or null)"),
    "parallel.world_size": ("0", "must be positive (the ranks parallel=auto starts, or null: one per GPU or CPU core)"),
    "parallel.zero_stage": ("7", "must be in [0, 3]"),
    "parallel.num_microbatches": ("0", "must be positive"),
    "parallel.timeout_s": ("0", "must be positive"),
    "data.image_size": ("0", "must be positive"),
    "data.mlm_probability": ("1.0", "must be in (0, 1)"),
    "data.vocab_size": ("1", "must be >= 260"),
    "data.eval_fraction": ("0", "must be in (0, 1)"),
    "data.num_proc": ("0", "must be >= 1"),
    "data.num_workers": ("-1", "must be >= 0"),
    "optim.lr": ("0", "must be positive"),
    "optim.min_lr": ("-1e-4", "must be >= 0"),
    "optim.warmup_steps": ("-1", "must be >= 0"),
    "optim.decay_steps": ("0", "must be positive"),
    "optim.weight_decay": ("-0.1", "must be >= 0"),
    "optim.betas": ("[1.5,0.9]", "optim.betas=[1.5, 0.9] must be two numbers in [0, 1)"),
    "optim.eps": ("-1", "must be positive"),
    "optim.grad_clip": ("-1", "must be >= 0 (0 disables clipping)"),
    "precision.initial_scale_power": ("40", "must be in [0, 32]"),
    "precision.loss_scale_window": ("0", "must be positive"),
    "precision.loss_scale": ("-2", "must be >= 0 (0: dynamic loss scaling)"),
    "precision.hysteresis": ("0", "must be positive"),
    "precision.min_loss_scale": ("0", "must be positive (the dynamic scale's floor, e.g. 1)"),
    "trainer.max_steps": ("-5", "must be >= 0"),
    "trainer.global_batch_size": ("0", "must be positive"),
    "trainer.micro_batch_size": ("-2", "must be positive (an integer, or auto)"),
    "trainer.seed": ("-3", "must be in [0, 4294967296)"),
    "trainer.log_every": ("0", "must be positive"),
    "trainer.eval_batches": ("-1", "must be >= 0"),
    "trainer.eval_every": ("-1", "must be >= 0 (0: evaluate only at the end)"),
    "optim.decay_fraction": ("0", "must be in (0, 1]"),
    "optim.momentum": ("1.0", "must be in [0, 1) (SGD's momentum; 0: none)"),
    "trainer.early_stop.patience": ("-2", "must be >= 0 (0: never stop early)"),
    "trainer.eval_task_shots": ("-1", "must be >= 0 (0: no few-shot examples)"),
    "trainer.early_stop.min_delta": ("-0.1", "must be >= 0"),
    "trainer.profile.start": ("-1", "must be >= 0 (the first profiled step, counted from 1; 0: no profiling)"),
    "trainer.profile.steps": ("0", "must be positive"),
    "trainer.sample_tokens": ("-1", "must be >= 0"),
    "trainer.sample_temperature": ("-0.5", "must be >= 0"),
    "trainer.sample_top_k": ("-1", "must be >= 0"),
    "trainer.max_nonfinite_steps": ("0", "must be positive"),
    "checkpoint.every": ("-5", "must be >= 0"),
    "run.max_restarts": ("-1", "must be >= 0 (restarts of the ranks inside the job; 0: a failure ends the job)"),
    "run.mtbf_hours": ("0", "must be positive (the job's mean time between failures, in hours)"),
    "checkpoint.keep": ("0", "must be positive"),
    "plan.measure": ("0", "must be positive (the planner's top layouts parallel=auto runs here before training, or "
                          "null)"),
    "plan.measure_steps": ("1", "must be >= 2 (each measured run's steps; the first, its warm-up, is not timed)"),
}


def test_every_range_has_a_case_here():
    assert set(OUTSIDE) == set(RANGES)


@pytest.mark.parametrize("key", sorted(OUTSIDE))
def test_a_value_outside_the_range_is_refused_naming_key_value_and_range(key):
    value, says = OUTSIDE[key]
    with pytest.raises(ConfigError) as err:
        check(composed(f"{key}={value}"))
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{key}=") and says in line, line


def test_values_at_the_edges_of_the_ranges_pass():
    check(composed("model.dropout=0", "optim.grad_clip=0", "optim.min_lr=0", "optim.betas=[0,0.999]",
                   "trainer.max_steps=0", "trainer.seed=0", "data.num_workers=0", "optim.warmup_steps=0"))


def test_min_lr_above_lr_is_refused():
    with pytest.raises(ConfigError, match=r"optim.min_lr=0.01 is above optim.lr=0.001: .* set optim.min_lr <= optim.lr"):
        check(composed("optim.min_lr=0.01"))


def test_legal_but_surely_unintended_values_warn():
    warnings = check(composed("trainer.max_steps=10", "optim.warmup_steps=20", "checkpoint.every=50"))
    assert any("optim.warmup_steps=20 is not shorter than the schedule's 10 steps" in w for w in warnings), warnings
    assert any("checkpoint.every=50 is more than trainer.max_steps=10" in w for w in warnings), warnings
    assert not any("warmup" in w for w in check(composed("trainer.max_steps=10", "optim.warmup_steps=2")))


@pytest.mark.parametrize("overrides, says", [
    (["trainer.early_stop.patience=3"], "trainer.early_stop.patience=3 needs periodic evaluation: set trainer.eval_every"),
    (["checkpoint.best=true"], "checkpoint.best=true keeps the checkpoint of the best evaluation: set trainer.eval_every"),
    (["trainer.eval_every=10", "trainer.eval_batches=0"], "trainer.eval_every=10 with trainer.eval_batches=0 evaluates "
                                                          "nothing"),
])
def test_evaluation_keys_that_need_each_other_are_refused(overrides, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        check(composed(*overrides))
    assert any("trainer.eval_every=500 is more than trainer.max_steps=200" in w
               for w in check(composed("trainer.eval_every=500")))
