"""conf/ follows one package style, and every model x parallel pair and every experiment
composes and validates as expected (compose API only: no process is started).

The rule: a group file is group-scoped (no package header) and sets its own group's keys
only, unless it must set keys of other groups; then it is `# @package _global_` and the
comment right under the header says which other keys it sets and why.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tests.conftest import REPO
from zoo.config.schema import SECTIONS, Config, register_configs
from zoo.config.validate import ConfigError, resolve_layout, validate
from zoo.plan.settings import ClusterConfig

CONF = REPO / "conf"
GLOBAL = "# @package _global_"
SCHEMAS = {**SECTIONS, "cluster": ClusterConfig}  # group -> the dataclass its files fill
MODELS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
PARALLELS = sorted(p.stem for p in (CONF / "parallel").glob("*.yaml"))
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
GROUP_FILES = sorted(p for p in CONF.glob("*/*.yaml"))
# What validation refuses among the plain model x parallel pairs: the CNN takes no tensor parallelism,
# and only the causal decoders context parallelism.
REFUSED = {("cnn", "tp"): r"parallel\.tp=2 with model\.family=cnn", ("cnn", "3d"): r"parallel\.tp=2 with model\.family=cnn",
           ("cnn", "cp"): r"parallel\.cp=2: model\.family=cnn has no context parallelism",
           ("bert", "cp"): r"parallel\.cp=2: model\.family=bert has no context parallelism"}

# Model groups that are presets of another family (its variants).
FAMILY_OF = {"qwen2": "llama", "qwen3": "llama", "mistral": "llama"}

register_configs()


def rel(path: Path) -> str:
    return str(path.relative_to(CONF))


def header_comment(lines: list[str]) -> list[str]:
    """The comment lines right under a `# @package` header."""
    block = []
    for line in lines[1:]:
        if not line.startswith("#"):
            break
        block.append(line)
    return block


def foreign_keys(group: str, body: dict) -> list[str]:
    """What a file of `group` sets outside its group, as the why-comment names it:
    `data=digits` for a defaults override, `trainer.eval_batches` for a key."""
    found = []
    for entry in body.get("defaults", []) or []:
        if isinstance(entry, dict):
            for key, value in entry.items():
                if key.startswith("override /") and key[len("override /"):] != group:
                    found.append(f"{key[len('override /'):]}={value}")
    for section, value in body.items():
        if section in ("defaults", group):
            continue
        if isinstance(value, dict):
            found += [f"{section}.{key}" for key in value]
        else:
            found.append(section)
    return found


def mentioned(key: str, comment: str) -> bool:
    section = key.split(".")[0].split("=")[0]
    return re.search(rf"(?<![\w.]){re.escape(key)}(?![\w])", comment) is not None or f"{section}.*" in comment


@pytest.mark.parametrize("path", GROUP_FILES + [CONF / "config.yaml", CONF / "plan.yaml"], ids=rel)
def test_header_is_none_or_global_followed_by_a_comment(path):
    lines = path.read_text().splitlines()
    headers = [i for i, line in enumerate(lines) if line.startswith("# @package")]
    if not headers:
        return
    assert headers == [0], f"conf/{rel(path)}: a package header belongs on the first line, once"
    assert lines[0] == GLOBAL, f"conf/{rel(path)}: {lines[0]!r}; the only package header used is {GLOBAL!r}"
    assert len(lines) > 1 and lines[1].startswith("# ") and lines[1][2:].strip(), \
        f"conf/{rel(path)}: {GLOBAL} must be followed by a comment line"


@pytest.mark.parametrize("path", [p for p in GROUP_FILES if p.parent.name != "experiment"], ids=rel)
def test_group_files_are_group_scoped_unless_they_say_why_not(path):
    group, lines = path.parent.name, path.read_text().splitlines()
    body = yaml.safe_load(path.read_text()) or {}
    if lines[0] != GLOBAL:  # group-scoped: only the group's own schema keys (plus its defaults)
        schema = SCHEMAS.get(group)
        assert schema is not None, f"conf/{rel(path)} is group-scoped but group {group!r} has no schema here"
        fields = {f.name for f in dataclasses.fields(schema)}
        assert set(body) - {"defaults"} <= fields, f"conf/{rel(path)}: {sorted(set(body) - fields)} are not {group} keys"
        return
    foreign = foreign_keys(group, body)
    assert foreign, f"conf/{rel(path)} sets only {group} keys: drop the {GLOBAL} header and the {group}: level"
    why = header_comment(lines)
    assert why[0].startswith("# Global because"), \
        f"conf/{rel(path)}: the line under {GLOBAL} says why: '# Global because it also sets ...'"
    comment = " ".join(line.lstrip("# ") for line in why)
    missing = [key for key in foreign if not mentioned(key, comment)]
    assert not missing, f"conf/{rel(path)}: the comment under {GLOBAL} does not name {missing}"


def composed(*overrides: str) -> Config:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return OmegaConf.to_object(compose(config_name="config", overrides=list(overrides)))


def check(cfg: Config):
    layout, warnings = resolve_layout(cfg, None)
    return layout, warnings + validate(cfg, layout, cuda_available=False)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("parallel", PARALLELS)
def test_every_model_parallel_pair_validates_or_is_refused(model, parallel):
    cfg = composed(f"model={model}", f"parallel={parallel}")
    assert (cfg.model.family, cfg.experiment) == (FAMILY_OF.get(model, model), None)
    if (model, parallel) in REFUSED:
        with pytest.raises(ConfigError, match=REFUSED[model, parallel]):
            check(cfg)
    else:
        layout, _ = check(cfg)
        assert (layout.tp, layout.cp, layout.pp) == (cfg.parallel.tp, cfg.parallel.cp, cfg.parallel.pp)


def experiment_defaults(name: str) -> dict:
    body = yaml.safe_load((CONF / "experiment" / f"{name}.yaml").read_text())
    return {k[len("override /"):]: v for entry in body["defaults"] for k, v in entry.items()}


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_is_named_after_what_it_pins_and_validates(name):
    lines = (CONF / "experiment" / f"{name}.yaml").read_text().splitlines()
    assert lines[0] == GLOBAL and lines[1].startswith("# "), f"experiment/{name}.yaml: {GLOBAL} and a comment"
    model, size, layout_name, *_purpose = name.split("_", 3)  # family_size_layout[_purpose]: qwen2_tiny_ddp_sft
    picks = experiment_defaults(name)
    family = FAMILY_OF.get(model, model)
    assert (picks.get("model"), picks.get("parallel")) == (model, layout_name), \
        f"experiment/{name}.yaml picks model={picks.get('model')} parallel={picks.get('parallel')}"
    cfg = composed(f"experiment={name}")
    assert (cfg.experiment, cfg.model.family) == (name, family) and cfg.model.size in (size, f"{model}-{size}")
    assert cfg.trainer.max_steps <= 1000, "an experiment file pins a short schedule"
    layout, _ = check(cfg)  # its own batch sizes fit its layout
    plain = composed(f"model={family}", f"parallel={layout_name}").parallel
    assert (layout.tp, layout.pp, layout.zero_stage) == (plain.tp, plain.pp, plain.zero_stage)


def test_experiments_cover_every_family_and_3d():
    picks = {name: experiment_defaults(name) for name in EXPERIMENTS}
    assert {p["model"] for p in picks.values()} >= set(MODELS) - set(FAMILY_OF), f"an experiment per family: {picks}"
    assert any(p["parallel"] == "3d" for p in picks.values()), f"a 3d experiment: {picks}"
