"""The Hypothesis internals specproof uses: each one named here, and each still there with the
shape specproof relies on in the installed Hypothesis.

pyproject bounds Hypothesis (``<7``) because of these. A new use of an internal in
``src/specproof`` without a listing here fails ``test_every_internal_used_is_listed``; an
internal Hypothesis renamed or reshaped fails its own check below, naming it — before a
certification misbehaves.

What counts as an internal use (found by reading the source, not by a hand-kept list):

- a name imported from ``hypothesis.internal.*``, or from a public Hypothesis module that does
  not export it (not in its ``__all__``; for the modules without one, not in ``_DOCUMENTED``);
- an ``_hypothesis_internal_*`` attribute (Hypothesis reads these off a test function);
- a private keyword argument (``_name=``) passed to a function imported from Hypothesis;
- the attributes ``.inner_test`` (of a ``@given`` test's ``.hypothesis``) and ``.conjecture_data``
  (of ``st.data()``'s object).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import re
from collections.abc import Callable

import hypothesis
import pytest
from hypothesis import strategies as st
from hypothesis.database import InMemoryExampleDatabase

import specproof

SRC = pathlib.Path(specproof.__file__).parent

#: public names of the Hypothesis modules that have no ``__all__`` (from Hypothesis' API docs)
_DOCUMENTED: dict[str, set[str]] = {
    "hypothesis.stateful": {
        "Bundle",
        "RuleBasedStateMachine",
        "consumes",
        "initialize",
        "invariant",
        "multiple",
        "precondition",
        "rule",
        "run_state_machine_as_test",
    },
    "hypothesis.extra.redis": {"RedisExampleDatabase"},
    "hypothesis.configuration": set(),
}
_ATTRIBUTES = ("inner_test", "conjecture_data")


def _public(module: str, name: str) -> bool:
    if ".internal" in module or name.startswith("_"):
        return False
    mod = importlib.import_module(module)
    if inspect.ismodule(getattr(mod, name, None)):  # ``from hypothesis import strategies``
        return True
    exported = getattr(mod, "__all__", None)
    if exported is not None:
        return name in exported
    if module in _DOCUMENTED:
        return name in _DOCUMENTED[module]
    return isinstance(getattr(mod, name, None), type) and issubclass(getattr(mod, name), Exception)  # hypothesis.errors


def internals_used(root: pathlib.Path = SRC) -> dict[str, list[str]]:
    """Internal name -> the files (relative to ``root``) that use it."""
    found: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        rel = str(path.relative_to(root))
        tree = ast.parse(text)
        from_hypothesis: dict[str, str] = {}  # local name -> module.name
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "hypothesis":
                for alias in node.names:
                    qual = f"{node.module}.{alias.name}"
                    from_hypothesis[alias.asname or alias.name] = qual
                    if not _public(node.module or "", alias.name):
                        found.setdefault(qual, set()).add(rel)
            if isinstance(node, ast.Attribute) and node.attr in _ATTRIBUTES:
                found.setdefault(f".{node.attr}", set()).add(rel)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in from_hypothesis:
                for kw in node.keywords:
                    if kw.arg and kw.arg.startswith("_"):
                        found.setdefault(f"{from_hypothesis[node.func.id]}({kw.arg}=)", set()).add(rel)
        for name in re.findall(r"\b_hypothesis_internal_\w+", text):
            found.setdefault(name, set()).add(rel)
    return {name: sorted(files) for name, files in sorted(found.items())}


# --------------------------------------------------------------------------- each internal, checked


def _function_digest() -> None:
    from hypothesis.internal.reflection import function_digest

    def f(x: int) -> int:
        return x

    def g(x: int) -> int:
        return x + 1

    assert isinstance(function_digest(f), bytes) and function_digest(f) == function_digest(f)
    assert function_digest(f) != function_digest(g)


def _int_from_bytes() -> None:
    from hypothesis.internal.compat import int_from_bytes

    assert int_from_bytes(b"\x01\x00") == 256


def _choices_bytes() -> None:
    from hypothesis.database import choices_from_bytes, choices_to_bytes

    choices = (1, True, 2.5, "a", b"\x00")
    assert choices_from_bytes(choices_to_bytes(choices)) == choices
    assert choices_from_bytes(b"\xff\xff\xff") is None  # what the store's view skips


def _get_state_machine_test() -> None:
    from hypothesis.stateful import RuleBasedStateMachine, get_state_machine_test, rule

    class Counter(RuleBasedStateMachine):
        n = 0

        @rule()
        def inc(self) -> None:
            self.n += 1

    params = inspect.signature(get_state_machine_test).parameters
    assert {"settings", "_flaky_state"} <= set(params)
    test = get_state_machine_test(
        Counter, settings=hypothesis.settings(max_examples=2, database=None), _flaky_state={"selecting_rule": False}
    )
    assert callable(test) and hasattr(test, "hypothesis")
    test()


def _drawn(seed: int | None, key: bytes | None = None, db: object = None) -> list[int]:
    seen: list[int] = []

    @hypothesis.settings(max_examples=5, database=db, phases=[hypothesis.Phase.reuse, hypothesis.Phase.generate])
    @hypothesis.given(st.integers(0, 10**9))
    def test(x: int) -> None:
        seen.append(x)

    if seed is not None:
        test._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]
    if key is not None:
        test._hypothesis_internal_database_key = key  # type: ignore[attr-defined]
    test()
    return seen


def _use_seed() -> None:
    assert _drawn(1234) == _drawn(1234)  # the seed fixes the examples drawn
    assert _drawn(1234) != _drawn(4321)


def _database_key() -> None:
    from hypothesis.database import choices_to_bytes

    db = InMemoryExampleDatabase()
    db.save(b"my-key", choices_to_bytes((777,)))
    assert _drawn(1, key=b"my-key", db=db)[0] == 777  # Phase.reuse reads the entries at the key set


def _inner_test() -> None:
    def body(x: int) -> None:
        pass

    test = hypothesis.given(st.integers())(body)
    assert test.hypothesis.inner_test is body  # type: ignore[attr-defined]


def _conjecture_data() -> None:
    seen: list[tuple[object, ...]] = []

    @hypothesis.settings(max_examples=1, database=None)
    @hypothesis.given(st.data())
    def test(data: st.DataObject) -> None:
        data.draw(st.integers(0, 5))
        seen.append(tuple(data.conjecture_data.choices))  # type: ignore[attr-defined]

    test()
    assert seen and len(seen[0]) == 1 and isinstance(seen[0][0], int)


def _set_home_dir() -> None:
    from hypothesis.configuration import set_hypothesis_home_dir, storage_directory

    assert list(inspect.signature(set_hypothesis_home_dir).parameters) == ["directory"]
    assert callable(storage_directory)


def _local_constants() -> None:
    """What ``no_local_constants()`` swaps: the provider's lookup of the local pool (called per test case,
    returning a ``Constants``) and its cache of (global, local) pools per choice, both module globals the
    provider reads at each draw."""
    from hypothesis.internal.cache import LRUCache
    from hypothesis.internal.conjecture import providers
    from hypothesis.internal.constants_ast import Constants

    assert isinstance(providers._get_local_constants(), Constants)
    assert isinstance(providers.CONSTANTS_CACHE, LRUCache) and isinstance(providers.CONSTANTS_CACHE.cache, dict)
    lookup = inspect.getsource(providers.HypothesisProvider)
    assert "_get_local_constants()" in lookup and "CONSTANTS_CACHE[key]" in lookup
    assert len(Constants()) == 0


#: every internal specproof uses -> the check that it is still there, shaped as specproof uses it
INTERNALS: dict[str, Callable[[], None]] = {
    "hypothesis.internal.reflection.function_digest": _function_digest,
    "hypothesis.internal.compat.int_from_bytes": _int_from_bytes,
    "hypothesis.database.choices_to_bytes": _choices_bytes,
    "hypothesis.database.choices_from_bytes": _choices_bytes,
    "hypothesis.stateful.get_state_machine_test": _get_state_machine_test,
    "hypothesis.stateful.get_state_machine_test(_flaky_state=)": _get_state_machine_test,
    "hypothesis.configuration.set_hypothesis_home_dir": _set_home_dir,
    "hypothesis.internal.conjecture.providers": _local_constants,
    "hypothesis.internal.constants_ast.Constants": _local_constants,
    "_hypothesis_internal_use_seed": _use_seed,
    "_hypothesis_internal_database_key": _database_key,
    ".inner_test": _inner_test,
    ".conjecture_data": _conjecture_data,
}


def test_every_internal_used_is_listed() -> None:
    used = internals_used()
    unlisted = {name: files for name, files in used.items() if name not in INTERNALS}
    assert not unlisted, f"Hypothesis internals used but not listed in INTERNALS (add a check): {unlisted}"
    assert used, "no internal found: the detector is broken (specproof uses function_digest)"


def test_no_listed_internal_is_stale() -> None:
    """A listing whose use is gone is removed, so the list says what the bound protects."""
    stale = sorted(set(INTERNALS) - set(internals_used()))
    assert not stale, f"listed but no longer used in src/specproof: {stale}"


@pytest.mark.parametrize("name", sorted(INTERNALS))
def test_internal_still_has_the_shape_used(name: str) -> None:
    INTERNALS[name]()


def test_pyproject_bounds_hypothesis_below_the_next_major() -> None:
    # the repository's pyproject (under tox the package is an installed wheel: no pyproject beside it)
    pyproject = (pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert re.search(r'"hypothesis\[redis\]>=6\.\d+,\s*<7"', pyproject), "hypothesis needs an upper bound (<7)"


# --------------------------------------------------------------------------- the detector itself


def test_detector_finds_each_kind_of_use_and_passes_public_ones(tmp_path: pathlib.Path) -> None:
    (tmp_path / "a.py").write_text(
        "from hypothesis import given, settings\n"
        "from hypothesis.database import ReadOnlyDatabase, choices_to_bytes\n"
        "from hypothesis.internal.reflection import function_digest\n"
        "from hypothesis.stateful import rule, get_state_machine_test\n"
        "from hypothesis.errors import InvalidArgument\n"
        "def f(t, d):\n"
        "    t._hypothesis_internal_use_seed = 1\n"
        "    get_state_machine_test(t, _flaky_state={})\n"
        "    return t.hypothesis.inner_test, d.conjecture_data\n"
    )
    assert internals_used(tmp_path) == {
        ".conjecture_data": ["a.py"],
        ".inner_test": ["a.py"],
        "_hypothesis_internal_use_seed": ["a.py"],
        "hypothesis.database.choices_to_bytes": ["a.py"],
        "hypothesis.internal.reflection.function_digest": ["a.py"],
        "hypothesis.stateful.get_state_machine_test": ["a.py"],
        "hypothesis.stateful.get_state_machine_test(_flaky_state=)": ["a.py"],
    }
    (tmp_path / "a.py").write_text("from hypothesis import given\nfrom hypothesis.stateful import rule\n")
    assert internals_used(tmp_path) == {}
