"""The config reference, generated from the schema: every key of `zoo.config.schema.Config`
with its type, its default, the docstring under it and its range (zoo.config.ranges, where
each range is written once), each config group's options from
conf/ and each family's size presets. The checked-in docs/config.md is this module's output; a unit test fails when it
is stale:

    python -m zoo.config.reference > docs/config.md
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import typing
from pathlib import Path
from typing import Dict, Iterator, Tuple

from zoo.config import schema

CONF = Path(__file__).resolve().parents[2] / "conf"
GROUPS = ("model", "parallel", "data", "optim", "precision", "logger", "experiment", "debug")


def docstrings(cls) -> Dict[str, str]:
    """{field: the docstring under it, on one line} of a schema class, from the source of the
    class and of each class it composes (a family's keys, in that family's keys.py)."""
    out: Dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):  # object's own last: a subclass's docstring wins
        node = ast.parse(inspect.getsource(klass)).body[0]
        for a, b in zip(node.body, node.body[1:]):
            if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant):
                out[a.target.id] = " ".join(str(b.value.value).split())
    return out


def keys(cls=schema.Config, prefix: str = "") -> Iterator[Tuple[str, object, object, str]]:
    """(dotted key, type, default, docstring) of every leaf key under `cls`, in schema order; a
    numeric key's docstring ends with its range, written once in zoo.config.ranges."""
    from zoo.config.ranges import RANGES

    docs = docstrings(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            yield from keys(type(default), f"{prefix}{f.name}.")
        else:
            key, doc = f"{prefix}{f.name}", docs.get(f.name, "")
            if key in RANGES:
                doc = f"{doc} Range: {RANGES[key].text()}.".strip()
            yield key, hints[f.name], default, doc


def _type(t) -> str:
    text = str(t).replace("typing.", "")
    return {"<class 'int'>": "int", "<class 'float'>": "float", "<class 'str'>": "str",
            "<class 'bool'>": "bool"}.get(text, text)


def _default(value) -> str:
    if value is dataclasses.MISSING or str(value) == "???":
        return "(required)"
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def render() -> str:
    lines = ["# Config reference", "",
             "Generated from `zoo/config/schema.py` by `python -m zoo.config.reference > docs/config.md`;",
             "`tests/unit/config/test_config_reference.py` fails when this file is stale. Every key is typed: a",
             "misspelled key or a wrong type fails at composition, naming the key (exit code 2); a",
             "number outside its range is refused before any process starts.", "",
             "## Groups", "", "`python -m zoo.train group=option ...` picks a file of `conf/<group>/`:", ""]
    for group in GROUPS:
        options = sorted(p.stem for p in (CONF / group).glob("*.yaml"))
        lines.append(f"- `{group}`: " + ", ".join(f"`{o}`" for o in options))
    from zoo.families.registry import FAMILIES

    lines += ["", "## Model sizes", "", "`model.size=` presets of each family (`model=<family>`):", ""]
    lines += [f"- `{name}`: " + ", ".join(f"`{size}`" for size in spec.sizes) for name, spec in FAMILIES.items()]
    lines += ["", "## Keys", "", "| key | type | default | meaning |", "|---|---|---|---|"]
    for key, t, default, doc in keys():
        lines.append(f"| `{key}` | {_type(t)} | `{_default(default)}` | {doc.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
