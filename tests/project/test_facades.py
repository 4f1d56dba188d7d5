"""A package facade (``specproof.conformance``, ``specproof.bench``) holds the public API only.

What only specproof's command line needs is in the package's ``cli_support`` module (the CLI may
import no private module of another package, ``test_layers.py``), which is not API. A name the
facade exported in 0.1.0 and no longer does still resolves, with a ``DeprecationWarning``
(docs/contract.md, "Deprecation rule").
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import re
import sys
import warnings
from types import ModuleType

import pytest

import specproof

# the repository's sources, not the installed package's (tox tests an installed wheel, beside no docs/)
REPO = pathlib.Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "specproof"
FACADES = ("specproof.conformance", "specproof.bench")

#: the names each facade exported in 0.1.0 that moved to ``cli_support`` (deprecated, still resolve)
DEPRECATED = {
    "specproof.conformance": ("markdown_table", "registry_json", "run_plan"),
    "specproof.bench": ("degeneracy_label", "drafter_table_lines", "peer_lines", "plan_size", "real_context_lines"),
}


def _imported_from(module: str, files: list[pathlib.Path]) -> set[str]:
    """The names ``from <module> import ...`` takes in ``files`` (module level or in functions)."""
    names: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == module:
                names |= {a.name for a in node.names}
    return names


def _documented(name: str, facade: ModuleType) -> bool:
    """Named in code (``name``) in the facade's docstring or a docs page, used by the benchmarks or
    another package, or in ``specproof.__all__``: a user is told about it."""
    code = re.compile(rf"`[^`\n]*\b{re.escape(name)}\b[^`\n]*`")
    if code.search(facade.__doc__ or "") or name in specproof.__all__:
        return True
    if any(code.search(p.read_text()) for p in (REPO / "docs").rglob("*.md")):
        return True
    package = SRC / facade.__name__.split(".")[1]
    others = [p for p in SRC.rglob("*.py") if "_cli" not in p.parts and package not in p.parents]
    return name in _imported_from(facade.__name__, others + sorted((REPO / "benchmarks").rglob("*.py")))


def cli_only_names(facade: ModuleType) -> list[str]:
    """Names the command line imports from ``facade`` that nothing tells a user about."""
    cli = _imported_from(facade.__name__, sorted((SRC / "_cli").rglob("*.py")))
    return sorted(n for n in cli if not _documented(n, facade))


@pytest.mark.parametrize("name", FACADES)
def test_a_facade_exports_nothing_only_the_command_line_needs(name: str) -> None:
    facade = importlib.import_module(name)
    assert cli_only_names(facade) == [], f"{name}: the CLI's own helpers belong in {name}.cli_support"


@pytest.mark.parametrize("name", FACADES)
def test_cli_support_is_apart_from_the_facade(name: str) -> None:
    facade = importlib.import_module(name)
    support = importlib.import_module(f"{name}.cli_support")
    assert "not public API" in (support.__doc__ or "")
    assert set(support.__all__).isdisjoint(facade.__all__)
    for attr in support.__all__:
        assert getattr(support, attr) is not None
        if attr not in DEPRECATED[name]:
            assert not hasattr(facade, attr), f"{name}.{attr} still resolves"


@pytest.mark.parametrize(("facade_name", "attr"), [(f, a) for f, names in DEPRECATED.items() for a in names])
def test_a_name_moved_out_of_a_facade_still_resolves_and_warns(facade_name: str, attr: str) -> None:
    facade = importlib.import_module(facade_name)
    support = importlib.import_module(f"{facade_name}.cli_support")
    assert attr not in facade.__all__
    with pytest.warns(DeprecationWarning, match=rf"{facade_name}\.{attr} is deprecated .*: (use|read) "):
        value = getattr(facade, attr)
    assert value is getattr(support, attr)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        namespace: dict[str, object] = {}
        with pytest.raises(DeprecationWarning):
            exec(f"from {facade_name} import {attr}", namespace)  # the form a user's code has


@pytest.mark.parametrize("name", FACADES)
def test_an_unknown_name_is_still_an_attribute_error(name: str) -> None:
    facade = importlib.import_module(name)
    with pytest.raises(AttributeError, match="NotAName"):
        facade.NotAName  # noqa: B018
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for attr in facade.__all__:  # the public names resolve without a warning
            getattr(facade, attr)


def test_the_cli_only_check_rejects_an_undocumented_helper_and_accepts_a_documented_one(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against a fake tree: a CLI module importing ``helper`` and ``documented`` from a facade whose
    docstring names only ``documented``."""
    src = tmp_path / "src" / "specproof"
    (src / "_cli").mkdir(parents=True)
    (src / "pkg").mkdir()
    (src / "_cli" / "cmd.py").write_text("def run():\n    from specproof.pkg import documented, helper\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "benchmarks").mkdir()
    facade = ModuleType("specproof.pkg", "The pkg: ``documented()`` does it.")
    facade.__path__ = [str(src / "pkg")]
    monkeypatch.setattr(sys.modules[__name__], "SRC", src)
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert cli_only_names(facade) == ["helper"]
    (tmp_path / "docs" / "pkg.md").write_text("Call `specproof.pkg.helper(x)`.\n")
    assert cli_only_names(facade) == []
