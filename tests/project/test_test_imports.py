"""The tests import their shared helpers the one way that works under every runner.

``tests/conftest.py`` puts ``tests/`` on ``sys.path`` (pytest's rootdir conftest insertion), so a helper is
imported as ``from _targets import ...``. ``from tests._targets import ...`` imports only under
``python -m pytest``, which adds the working directory to ``sys.path``; tox and CI run plain ``pytest``,
where it is a collection error. A stop once went red on exactly this, so it is checked here.
"""

from __future__ import annotations

import ast
import pathlib

TESTS = pathlib.Path(__file__).resolve().parents[1]


def _package_imports(path: pathlib.Path, *, root: pathlib.Path) -> list[str]:
    """``file:line`` (relative to ``root``) for each import of the ``tests`` package in one file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        if any(name == "tests" or name.startswith("tests.") for name in names):
            found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_no_test_imports_the_tests_package() -> None:
    offenders = [where for path in sorted(TESTS.rglob("*.py")) for where in _package_imports(path, root=TESTS.parent)]
    assert not offenders, (
        "these lines import the `tests` package, which plain `pytest` (as tox and CI run it) cannot "
        f"import; write `from _helper import ...` instead: {offenders}"
    )


def test_the_scan_finds_a_package_import_and_nothing_else(tmp_path: pathlib.Path) -> None:
    # The check must be able to fail: each wrong spelling is found, the right ones are not.
    wrong = tmp_path / "wrong.py"
    wrong.write_text("import os\nfrom tests._targets import x\nimport tests.conftest\nimport tests\n")
    right = tmp_path / "right.py"
    right.write_text("from _targets import x\nimport testsuite\nfrom .tests import y\n")
    assert _package_imports(wrong, root=tmp_path) == ["wrong.py:2", "wrong.py:3", "wrong.py:4"]
    assert _package_imports(right, root=tmp_path) == []
