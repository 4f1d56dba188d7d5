"""The package is layered: no import cycles, and the bottom layer imports nothing above it."""

from __future__ import annotations

import ast
import pathlib

import specproof

ROOT = pathlib.Path(specproof.__file__).parent


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports() -> dict[str, set[str]]:
    """Module -> the specproof modules it imports at module level (TYPE_CHECKING and function bodies excluded)."""
    graph: dict[str, set[str]] = {}
    modules = {_module_name(p) for p in ROOT.rglob("*.py")}
    for path in ROOT.rglob("*.py"):
        name = _module_name(path)
        tree = ast.parse(path.read_text())
        found: set[str] = set()
        for node in tree.body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            for sub in ast.walk(node) if isinstance(node, (ast.Import, ast.ImportFrom, ast.If, ast.Try)) else ():
                targets: list[str] = []
                if isinstance(sub, ast.Import):
                    targets = [a.name for a in sub.names]
                elif isinstance(sub, ast.ImportFrom) and sub.module and sub.level == 0:
                    targets = [sub.module] + [f"{sub.module}.{a.name}" for a in sub.names]
                for t in targets:
                    if t.startswith("specproof") and t in modules and t != name:
                        found.add(t)
        graph[name] = found
    return graph


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else parts[0]


def test_no_import_cycle_between_packages() -> None:
    """Collapsing modules into their top-level package (specproof.engine, .conformance, ...), the graph is acyclic."""
    graph = _imports()
    edges: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        for dep in deps:
            a, b = _package(mod), _package(dep)
            if a != b and a != "specproof" and b != "specproof":
                edges.setdefault(a, set()).add(b)
    seen: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        seen[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if seen.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path[path.index(nxt) :], nxt]))
            if nxt not in seen:
                visit(nxt)
        path.pop()
        seen[node] = 2

    for node in sorted(edges):
        if node not in seen:
            visit(node)


def test_contract_imports_nothing_above_it() -> None:
    graph = _imports()
    for mod, deps in graph.items():
        if mod.startswith("specproof.contract"):
            above = sorted(d for d in deps if not d.startswith("specproof.contract"))
            assert not above, f"{mod} imports {above}"


def test_strategies_do_not_import_conformance() -> None:
    graph = _imports()
    for mod, deps in graph.items():
        if mod.startswith("specproof.strategies"):
            assert not [d for d in deps if d.startswith("specproof.conformance")], mod
