"""The import graph of zoo/ and data_pipelines/ (every import, function-local ones included,
read with ast) has no cycle, and zoo/'s top level holds at most 6 modules: the entry point,
the worker, the trainer and the three commands (#34 item 3)."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("zoo", "data_pipelines")


def module_names() -> dict:
    """Module name -> its file, for every .py under the packages."""
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def imported(path: Path, name: str, known: dict) -> set:
    """The package modules `path` (module `name`) imports: `import a.b`, `from a.b import c`
    (c itself when it is a module), relative imports resolved; a package's own __init__ is not
    counted as importing its submodules' importer."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` of a non-module attribute: its module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def find_cycle(graph: dict) -> list:
    """One cycle of `graph` (module -> modules), as a path, or []."""
    state, stack = {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return []


def graph() -> dict:
    """Module -> the modules it imports, and the packages above each of them (importing a.b.c
    runs a/__init__ and a/b/__init__), but not a module's own packages (running them is
    what importing it means)."""
    known = module_names()
    edges = {}
    for name, path in known.items():
        targets = imported(path, name, known)
        parents = {".".join(t.split(".")[:i]) for t in targets for i in range(1, t.count(".") + 1)}
        edges[name] = targets | {p for p in parents if p in known and p != name and not name.startswith(p + ".")}
    return edges


def test_no_import_cycle():
    cycle = find_cycle(graph())
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_the_top_level_of_zoo_holds_the_spine_and_the_commands():
    top = sorted(p.stem for p in (REPO / "zoo").glob("*.py") if p.stem != "__init__")
    assert len(top) <= 6, top


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []
