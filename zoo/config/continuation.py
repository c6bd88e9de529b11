"""The config of a resumed run: the run directory's own config.yaml, with what the command
line sets on top.

`python -m zoo.train hydra.run.dir=RUN resume=auto trainer.max_steps=400` continues RUN as it
was composed (its model, data, optimizer, layout, ...), not conf/'s defaults: a key=value
takes that key from the command line, a group choice (`parallel=tp`, `debug=fast`) the whole
section of its name and every other key its file sets, and everything
else comes from config.yaml. Keys the schema gained since the run was written take their
defaults; keys it lost are dropped.
"""
from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any, Dict, Iterable, Set

import yaml

from zoo.config.cli import CONF


def _leaf_paths(data: Any, prefix: str) -> Iterable[str]:
    if isinstance(data, dict) and data:
        for key, value in data.items():
            yield from _leaf_paths(value, f"{prefix}.{key}" if prefix else str(key))
    elif prefix:
        yield prefix


def group_paths(group: str, option: str, conf: Path = CONF) -> Set[str]:
    """The config paths a group choice sets: the whole section of the group's name (a preset
    of it), the other keys a `# @package _global_` file sets, and those of the choices its
    defaults list overrides (`override /parallel: 3d`)."""
    path = conf / group / f"{option}.yaml"
    if not path.is_file():
        return set()
    text = path.read_text()
    data = yaml.safe_load(text) or {}
    defaults = data.pop("defaults", []) if isinstance(data, dict) else []
    from zoo.config.schema import Config

    out = set(_leaf_paths(data, "")) if "@package _global_" in text else set()
    if group in {f.name for f in dataclasses.fields(Config)} or not out:  # the preset of a section: all of it
        out.add(group)
    for entry in defaults or []:
        if isinstance(entry, dict):
            for key, value in entry.items():
                name = str(key).split()[-1].lstrip("/")
                if (conf / name).is_dir() and isinstance(value, str):
                    out |= group_paths(name, value, conf)
    return out


def overridden_paths(overrides: Iterable[str], conf: Path = CONF) -> Set[str]:
    """The config paths the command line's overrides (Hydra's task overrides) set."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    out: Set[str] = set()
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key = override.key_or_group
        if (conf / key).is_dir() and "." not in key:
            value = override.value()
            out |= group_paths(key, value, conf) if isinstance(value, str) else {key}
        else:
            out.add(key)
    return out


def _from_saved(schema, fresh: Dict[str, Any], saved: Dict[str, Any]) -> Dict[str, Any]:
    """`fresh`'s structure with `saved`'s values where it has them (typed sections recursed)."""
    hints = typing.get_type_hints(schema)
    out = {}
    for f in dataclasses.fields(schema):
        name, kind = f.name, hints[f.name]
        if name not in saved:
            out[name] = fresh.get(name)
        elif dataclasses.is_dataclass(kind) and isinstance(saved[name], dict):
            out[name] = _from_saved(kind, fresh.get(name) or {}, saved[name])
        else:
            out[name] = saved[name]
    return out


_ABSENT = object()


def _lookup(data: Dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        if not isinstance(data, dict) or part not in data:
            return _ABSENT
        data = data[part]
    return data


def _assign(data: Dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for part in parents:
        data = data.setdefault(part, {})
    data[leaf] = value


def continued_config(fresh: Dict[str, Any], saved_yaml: str, overrides: Iterable[str]) -> Dict[str, Any]:
    """The resumed run's config (a plain dict): config.yaml's values, the command line's on top.
    `fresh` is the composed config as a plain dict, its interpolations unresolved (they resolve
    in the result, as they would have in the composed config)."""
    from zoo.config.schema import Config

    saved = yaml.safe_load(saved_yaml) or {}
    merged = _from_saved(Config, fresh, saved)
    for path in sorted(overridden_paths(overrides)):
        value = _lookup(fresh, path)
        if value is not _ABSENT:  # a `~key` deletion leaves the run's value
            _assign(merged, path, value)
    return merged


def refusal_at_step(resume: str, checkpoint: Path, step: int, max_steps: int) -> str:
    """resume=...: the checkpoint at `step` leaves no step to train under trainer.max_steps (a
    run that trains no step would write over the finished run's results)."""
    return (f"resume={resume}: the run is at step {step} ({checkpoint}) and trainer.max_steps={max_steps} leaves "
            f"no step to train; nothing was changed: continue with trainer.max_steps=N, N > {step} (e.g. "
            f"trainer.max_steps={2 * step})")
