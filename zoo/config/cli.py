"""Exit codes and messages of the Hydra entry points: a config that does not compose is a user
mistake, reported in one line with exit code 2.

Hydra reports composition errors (an unknown group option, a misspelled key, a wrong type,
a bad override) in several lines and exits 1. Until the task function starts, what Hydra
writes to stderr is held; when it then exits 1, the held message is printed as one
`zoo: error:` line instead, with exit code 2. Once the task function has marked that it
started, stderr is the process's again and a later exit 1 (a crash) is left alone.
HYDRA_FULL_ERROR=1 shows Hydra's own output and traceback.

Errors OmegaConf raises after composition (an unknown `+key`, an interpolation that does
not resolve) are condensed by `omegaconf_error_line`, for the entry points to report.
"""
from __future__ import annotations

import io
import os
import re
import sys
from pathlib import Path
from typing import Callable, Iterable, List

from hydra.experimental.callback import Callback

CONF = Path(__file__).resolve().parents[2] / "conf"
OPTIONAL_GROUPS = ("experiment", "debug")  # `optional` in conf/config.yaml: Hydra skips a missing option


class TaskStarted:
    def __init__(self):
        self.value = False
        self._held = None

    def __call__(self) -> None:
        self.value = True
        self.give_back()  # with anything Hydra wrote before the task

    def give_back(self, *, write: bool = True) -> str:
        """Restore stderr if it is held; returns what was held (written to stderr unless not `write`)."""
        if self._held is None:
            return ""
        held, self._held = self._held, None
        sys.stderr = held.real
        if write:
            sys.stderr.write(held.getvalue())
        return held.getvalue()


_ACTIVE: "TaskStarted | None" = None  # the entry point's, while Hydra runs


class ReleaseHeldStderr(Callback):
    """A Hydra callback (conf/config.yaml `hydra.callbacks`): a multirun's launcher starts once
    the sweep's config composed, and from then on stderr is the process's own (the submitit
    launcher pickles what it holds, and its job reports must be seen while it waits)."""

    def on_multirun_start(self, config, **kwargs) -> None:
        if _ACTIVE is not None:
            _ACTIVE()


class _Held(io.StringIO):
    def __init__(self, real):
        super().__init__()
        self.real = real


def run_hydra_app(hydra_main: Callable[[], None], started: TaskStarted, schema=None) -> None:
    """Run a Hydra entry point; a composition error becomes one line and exit 2. `schema` is
    the entry point's config dataclass (default: training's Config), for the nearest-key hint."""
    global _ACTIVE
    _ACTIVE = started
    holding = os.environ.get("HYDRA_FULL_ERROR") != "1"
    if holding:
        started._held = sys.stderr = _Held(sys.stderr)
    try:
        hydra_main()
    except SystemExit as exc:
        if not started.value and exc.code == 1:
            text = started.give_back(write=False)
            if holding:
                print(f"zoo: error: {hydra_message_line(text, schema)}", file=sys.stderr, flush=True)
            sys.exit(2)
        raise
    finally:
        started.give_back()  # no task ran (--help, --cfg), or it exited otherwise: pass on what was held


def schema_keys(schema=None) -> List[str]:
    """Every dotted key of a config schema (default: training's; `trainer.max_steps`, ...)."""
    import dataclasses
    import typing

    from zoo.config.schema import Config

    schema = schema or Config

    def walk(cls, prefix: str):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            kind = hints[f.name]
            if dataclasses.is_dataclass(kind):
                yield from walk(kind, f"{prefix}{f.name}.")
            else:
                yield f"{prefix}{f.name}"

    return list(walk(schema, ""))


def nearest_key(key: str, schema=None) -> str | None:
    """The schema key closest to a misspelled one (`trainer.max_step` -> `trainer.max_steps`)."""
    import difflib

    keys = schema_keys(schema)
    found = difflib.get_close_matches(key, keys, n=1, cutoff=0.75)
    if not found:  # the right leaf in another group (`model.max_steps`)
        leaf = key.rsplit(".", 1)[-1]
        by_leaf = {k.rsplit(".", 1)[-1]: k for k in keys}
        close = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.8)
        found = [by_leaf[close[0]]] if close else []
    return found[0] if found else None


ALIASES = {"run_dir": "hydra.run.dir", "output_dir": "hydra.run.dir", "out_dir": "hydra.run.dir"}
_NOT_A_KEY = re.compile(r"Could not override '([^']+)'")


def unknown_key_line(text: str, schema=None) -> str | None:
    """Hydra's 'Could not override KEY ... To append to your config use +KEY' for a key that
    is not in zoo's schema: one line with the nearest real key instead of Hydra's advice."""
    m = _NOT_A_KEY.search(text)
    if not m or "not in '" not in text:
        return None
    key = m.group(1)
    if key.split(".", 1)[0] in ("hydra", "deepspeed"):
        return None
    near = ALIASES.get(key) or nearest_key(key, schema)
    hint = f"did you mean {near}?" if near else "check its spelling"
    return f"{key} is not a key of the config: {hint} (`--cfg job` prints every key)"


def hydra_message_line(text: str, schema=None) -> str:
    """Hydra's multi-line composition error as one line: the message, the available options
    joined, without the search path and the HYDRA_FULL_ERROR hint."""
    unknown = unknown_key_line(text, schema)
    if unknown:
        return unknown
    parts: List[str] = []
    options: List[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith(("Set the environment variable HYDRA_FULL_ERROR", "reference_type=",
                                                "object_type=")):
            continue
        if stripped.startswith("Config search path"):
            break
        if line.startswith("\t") and parts and parts[-1].startswith("Available options"):
            options.append(stripped)
            continue
        if options:
            parts[-1] += " " + ", ".join(options)
            options = []
        parts.append(stripped)
    if options:
        parts[-1] += " " + ", ".join(options)
    return "; ".join(parts) or "the config did not compose (HYDRA_FULL_ERROR=1 shows why)"


def omegaconf_error_line(err) -> str:
    """An OmegaConf error (omegaconf.errors.OmegaConfBaseException) as one line with the fix."""
    from omegaconf.errors import ConfigKeyError, InterpolationResolutionError

    key, msg = getattr(err, "full_key", None) or "", str(getattr(err, "msg", "") or err).splitlines()[0]
    if isinstance(err, ConfigKeyError):
        near = (ALIASES.get(key) or nearest_key(key)) if key else None
        hint = f"did you mean {near}?" if near else "check its spelling"
        return (f"{key or 'a key'} is not a key of the config ({msg}); {hint} "
                f"(`python -m zoo.train --cfg job` prints every key) or drop the override")
    if isinstance(err, InterpolationResolutionError):
        return (f"{key}: {msg}; set what it refers to, or give the interpolation a default "
                f"(e.g. ${{oc.env:VAR,default}})")
    return f"{key}: {msg}" if key else msg


def unknown_optional_choices(choices: dict, groups: Iterable[str] = OPTIONAL_GROUPS) -> List[str]:
    """`experiment=nope`: Hydra skips an `optional` group's missing option without a word.
    Returns one line per chosen option that has no file under conf/."""
    out = []
    for group in groups:
        choice = choices.get(group)
        if choice and not (CONF / group / f"{choice}.yaml").exists():
            known = sorted(p.stem for p in (CONF / group).glob("*.yaml"))
            out.append(f"{group}={choice} is not one of conf/{group}/: choose one of {known}")
    return out
