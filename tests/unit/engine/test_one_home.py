"""DeepSpeed in one home: outside zoo/engine/, no module of zoo, data_pipelines or the
benchmarks imports one of DeepSpeed's internal modules or names one of the private
attributes zoo relies on (zoo.engine.versions), as an attribute or as a string."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO
from zoo.engine.versions import PRIVATE_ATTRIBUTES, PUBLIC_MODULES

SCANNED = ("zoo", "data_pipelines", "benchmarks")
HOME = REPO / "zoo" / "engine"


def _reaches(path: Path):
    """(line, what) for each reach into DeepSpeed's internals in one file."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        modules = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module]
        for module in modules:
            if module.split(".")[0] == "deepspeed" and module not in PUBLIC_MODULES:
                yield node.lineno, f"imports {module}"
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE_ATTRIBUTES:
            yield node.lineno, f".{node.attr}"
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in PRIVATE_ATTRIBUTES:
            yield node.lineno, f"{node.value!r}"


def test_no_module_outside_the_engine_package_reaches_into_deepspeed():
    found = [f"{path.relative_to(REPO)}:{line}: {what}"
             for top in SCANNED for path in sorted((REPO / top).rglob("*.py")) if HOME not in path.parents
             for line, what in _reaches(path)]
    assert not found, "DeepSpeed's internals outside zoo/engine/ (move the access into zoo.engine):\n" + "\n".join(found)


def test_the_scan_finds_each_kind_of_reach(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from deepspeed.runtime.utils import clip_grad_norm_\nimport deepspeed.ops\n"
                      "x = p.ds_tensor\ny = hasattr(p, '_hp_mapping')\nimport deepspeed\nfrom deepspeed.pipe import LayerSpec\n")
    assert [line for line, _ in _reaches(sample)] == [1, 2, 3, 4]
