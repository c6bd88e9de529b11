"""A resume's config (zoo.config.continuation): the run directory's config.yaml, with the keys
the command line sets (a key=value, every key a group choice sets) taken from the command line."""
from __future__ import annotations

from omegaconf import OmegaConf

from zoo.config.continuation import continued_config, group_paths, overridden_paths
from zoo.config.schema import Config, to_yaml


def _fresh(**sections):
    """A composed config as conf/'s defaults give it (the GPT, ddp), with `sections` set."""
    cfg = OmegaConf.to_container(OmegaConf.structured(Config))
    cfg["model"]["family"] = "gpt"
    for path, value in sections.items():
        section, key = path.split("__")
        cfg[section][key] = value
    return cfg


def _saved_llama_tp():
    saved = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.create(
        {"model": {"family": "llama", "n_layer": 2}, "parallel": {"tp": 2, "zero_stage": 1,
                                                               "sequence_parallel": True},
         "data": {"name": "files", "path": "/corpus.jsonl"}, "optim": {"lr": 3e-4},
         "trainer": {"max_steps": 100}, "checkpoint": {"every": 50}})))
    return to_yaml(saved)


def test_a_key_override_takes_that_key_and_everything_else_comes_from_the_run():
    out = continued_config({**_fresh(trainer__max_steps=400), "resume": "auto"},
                           _saved_llama_tp(), ["resume=auto", "trainer.max_steps=400"])
    assert out["resume"] == "auto" and out["trainer"]["max_steps"] == 400
    assert (out["model"]["family"], out["model"]["n_layer"]) == ("llama", 2)
    assert (out["data"]["name"], out["data"]["path"]) == ("files", "/corpus.jsonl")
    assert out["optim"]["lr"] == 3e-4 and out["checkpoint"]["every"] == 50
    assert (out["parallel"]["tp"], out["parallel"]["sequence_parallel"]) == (2, True)


def test_a_group_choice_takes_its_whole_section_on_another_layout():
    fresh = {**_fresh(), "resume": "auto"}  # parallel=ddp composed: tp 1, no sequence parallelism
    out = continued_config(fresh, _saved_llama_tp(), ["resume=auto", "parallel=ddp", "parallel.dp=2"])
    assert (out["parallel"]["tp"], out["parallel"]["sequence_parallel"], out["parallel"]["zero_stage"]) == (1, False, 0)
    assert out["model"]["family"] == "llama"  # untouched by the layout


def test_global_group_files_set_only_their_keys_and_their_defaults_overrides():
    assert group_paths("parallel", "tp") == {"parallel"}
    assert group_paths("debug", "fast") == {f"trainer.{k}" for k in ("max_steps", "global_batch_size", "micro_batch_size",
                                                                    "log_every", "eval_batches", "sample_tokens",
                                                                    "progress")}
    exp = group_paths("experiment", "gpt_tiny_3d")
    assert {"parallel", "model", "experiment", "trainer.max_steps", "trainer.global_batch_size"} <= exp
    assert "data" not in exp and "optim.lr" not in exp
    assert group_paths("model", "bert") == {"model", "model.family", "model.size", "data.eval_fraction",
                                            "trainer.sample_tokens"}
    assert "parallel" in group_paths("parallel", "3d")  # a global preset of the section still takes all of it
    assert overridden_paths(["trainer.max_steps=5", "+deepspeed.wall_clock_breakdown=true", "model=llama"]) == {
        "trainer.max_steps", "deepspeed.wall_clock_breakdown", "model"}


def test_keys_the_schema_gained_take_their_defaults_and_lost_keys_are_dropped():
    saved = _saved_llama_tp().replace("trainer:\n", "trainer:\n  a_removed_key: 3\n")
    fresh = {**_fresh(), "resume": "auto"}
    fresh["trainer"]["seed"] = 7  # as if a new field: absent from the saved file below
    saved = "\n".join(line for line in saved.splitlines() if not line.strip().startswith("seed:"))
    out = continued_config(fresh, saved, ["resume=auto"])
    assert "a_removed_key" not in out["trainer"] and out["trainer"]["seed"] == 7
    OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.create(out))  # the schema takes it
