"""The package is layered: no import cycles between packages or between files, counting imports
inside functions and ``import_module("literal")`` calls, and the bottom layer imports nothing above it.

A package's ``__main__`` (an entry point nothing imports) is its own node, above every package.
"""

from __future__ import annotations

import ast
import pathlib

import specproof

ROOT = pathlib.Path(specproof.__file__).parent


def _module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _targets(node: ast.AST, *, package: str) -> list[str]:
    """The module names one AST node imports (relative imports resolved against ``package``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        # ``from pkg import submodule`` names the submodule; ``from pkg import name`` the package
        return [module, *(f"{module}.{a.name}" for a in node.names)]
    if isinstance(node, ast.Call) and node.args:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        first = node.args[0]
        if name == "import_module" and isinstance(first, ast.Constant) and isinstance(first.value, str):
            return [first.value]
    return []


def import_graph(root: pathlib.Path) -> dict[str, set[str]]:
    """Module -> the modules of the package at ``root`` it imports anywhere (module level, function
    bodies, ``import_module`` with a literal name); ``if TYPE_CHECKING:`` blocks excluded."""
    files = sorted(root.rglob("*.py"))
    modules = {_module_name(p, root) for p in files}
    graph: dict[str, set[str]] = {}
    for path in files:
        name = _module_name(path, root)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        skipped: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skipped.update(id(sub) for stmt in node.body for sub in ast.walk(stmt))
        found: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            targets = [t for t in _targets(node, package=package) if t in modules and t != name]
            if (
                isinstance(node, ast.ImportFrom)
                and len(targets) > 1
                and all(f"{targets[0]}.{a.name}" in modules for a in node.names)
            ):
                targets = targets[1:]  # only submodules named: the package's __init__ runs, as for any import
            found.update(targets)
        graph[name] = found
    return graph


def _node(module: str, depth: int | None) -> str:
    """``depth=None``: the module itself; ``depth=2``: its top-level package (``specproof.engine``).
    A ``__main__`` module stays its own node (an entry point)."""
    parts = module.split(".")
    if depth is None or parts[-1] == "__main__":
        return module
    return ".".join(parts[:depth])


def find_cycle(graph: dict[str, set[str]], *, depth: int | None) -> list[str] | None:
    """A cycle (as a path that returns to its start) in ``graph`` collapsed to ``depth``, or None.

    At package depth the root package itself (``specproof/__init__.py``) is left out.
    """
    root = {m.split(".")[0] for m in graph}
    edges: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        for dep in deps:
            a, b = _node(mod, depth), _node(dep, depth)
            if a != b and not (depth is not None and (a in root or b in root)):
                edges.setdefault(a, set()).add(b)
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_cycle_between_packages() -> None:
    """Collapsing modules into their top-level package (specproof.engine, .conformance, ...), the graph is acyclic."""
    cycle = find_cycle(import_graph(ROOT), depth=2)
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle or [])


def test_no_import_cycle_between_files() -> None:
    graph = import_graph(ROOT)
    cycle = find_cycle(graph, depth=None)
    assert cycle is None, "import cycle between files: " + " -> ".join(cycle or [])


def test_contract_imports_nothing_above_it() -> None:
    graph = import_graph(ROOT)
    for mod, deps in graph.items():
        if mod.startswith("specproof.contract"):
            above = sorted(d for d in deps if not d.startswith("specproof.contract"))
            assert not above, f"{mod} imports {above}"


def test_formats_import_only_contract() -> None:
    """``specproof.formats`` (one module per file format) sits just above ``contract``: every layer
    that writes or reads a file can import it."""
    graph = import_graph(ROOT)
    for mod, deps in graph.items():
        if mod.startswith("specproof.formats"):
            above = sorted(d for d in deps if not d.startswith(("specproof.contract", "specproof.formats")))
            assert not above, f"{mod} imports {above}"


def test_strategies_do_not_import_conformance() -> None:
    graph = import_graph(ROOT)
    for mod, deps in graph.items():
        if mod.startswith("specproof.strategies"):
            assert not [d for d in deps if d.startswith("specproof.conformance")], mod


def test_engine_wire_fixtures_do_not_import_plugins() -> None:
    """Spec resolution (``specproof.plugins``) sits above the packages it resolves into."""
    graph = import_graph(ROOT)
    below = ("specproof.engine", "specproof.wire", "specproof.fixtures", "specproof.contract")
    for mod, deps in graph.items():
        if mod.startswith(below) and not mod.endswith("__main__"):
            assert "specproof.plugins" not in deps, mod


def test_nothing_imports_an_entry_point() -> None:
    graph = import_graph(ROOT)
    for mod, deps in graph.items():
        assert not [d for d in deps if d.endswith("__main__")], mod


# --------------------------------------------------------------------------- the detector itself


def _tree(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    root = tmp_path / "pkg"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_detector_finds_a_function_level_cycle_between_packages(tmp_path: pathlib.Path) -> None:
    root = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "low/__init__.py": "def f():\n    from pkg.high import thing\n",
            "high/__init__.py": "from pkg.low import f\nthing = 1\n",
        },
    )
    graph = import_graph(root)
    assert graph["pkg.low"] == {"pkg.high"}
    assert find_cycle(graph, depth=2) == ["pkg.high", "pkg.low", "pkg.high"]


def test_detector_finds_an_import_module_cycle_between_files(tmp_path: pathlib.Path) -> None:
    root = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "a/__init__.py": "",
            "a/one.py": "import importlib\ndef g():\n    return importlib.import_module('pkg.a.two')\n",
            "a/two.py": "from pkg.a import one\n",
        },
    )
    graph = import_graph(root)
    assert find_cycle(graph, depth=2) is None  # one package: no cycle between packages
    assert find_cycle(graph, depth=None) == ["pkg.a.one", "pkg.a.two", "pkg.a.one"]


def test_detector_accepts_a_layered_tree(tmp_path: pathlib.Path) -> None:
    """Downward imports (at module level, in functions, relative, under TYPE_CHECKING upward) are no cycle."""
    root = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "low/__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.high import x\n",
            "low/core.py": "from . import helpers\n",
            "low/helpers.py": "",
            "high/__init__.py": "def f():\n    from pkg.low import core\n",
            "high/__main__.py": "from pkg import high\n",
        },
    )
    graph = import_graph(root)
    assert graph["pkg.low"] == set()
    assert graph["pkg.low.core"] == {"pkg.low.helpers"}
    assert graph["pkg.high"] == {"pkg.low.core"}
    assert find_cycle(graph, depth=2) is None
    assert find_cycle(graph, depth=None) is None


def _specproof_imports(root: pathlib.Path) -> list[tuple[str, int, str]]:
    """(file, line, module) for every ``import specproof...`` / ``from specproof... import``,
    module level or inside a function: what ``import_graph`` keeps only when the module exists."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            found += [(str(path.relative_to(root.parent)), node.lineno, n) for n in names if n.startswith("specproof")]
    return found


def test_every_import_of_specproof_names_a_module_that_exists() -> None:
    """A module deleted or renamed leaves no import behind, even inside a function body (mypy, with
    ``ignore_missing_imports``, does not say so; the import graph above skips unknown names)."""
    import importlib.util

    imports = _specproof_imports(ROOT)
    missing = [f"{f}:{line} imports {m}" for f, line, m in imports if importlib.util.find_spec(m) is None]
    assert missing == [], f"imports of modules that do not exist: {missing}"


def test_the_missing_import_check_can_fail(tmp_path: pathlib.Path) -> None:
    pkg = tmp_path / "specproof"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from specproof.engine.errors import X\n    import specproof.contract\n")
    assert [m for _, _, m in _specproof_imports(pkg)] == ["specproof.engine.errors", "specproof.contract"]


def private_reaches(graph: dict[str, set[str]]) -> list[str]:
    """``importer -> module`` for every import of another package's private module (a path part
    after the top-level package that starts with ``_``): packages meet at their facades."""
    found = []
    for importer, targets in sorted(graph.items()):
        own = importer.split(".")[:2]
        for target in sorted(targets):
            parts = target.split(".")
            if parts[:2] != own and any(p.startswith("_") and not p.startswith("__") for p in parts[2:]):
                found.append(f"{importer} -> {target}")
    return found


def test_no_package_imports_another_packages_private_module() -> None:
    assert private_reaches(import_graph(ROOT)) == [], "import it from the package's facade (or make the module public)"


def test_the_private_import_check_rejects_a_reach_and_accepts_a_facade(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "specproof"
    for pkg in ("a", "b"):
        (root / pkg).mkdir(parents=True)
        (root / pkg / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "a" / "_inner.py").write_text("X = 1\n")
    (root / "a" / "public.py").write_text("from specproof.a._inner import X\n")  # its own package: fine
    (root / "b" / "reach.py").write_text("def f():\n    from specproof.a._inner import X\n")
    (root / "b" / "facade.py").write_text("from specproof.a import public\n")
    assert private_reaches(import_graph(root)) == ["specproof.b.reach -> specproof.a._inner"]
