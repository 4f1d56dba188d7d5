"""No class over 300 lines and no function over 80 in ``src/specproof``: a reader can hold each
one in mind (the structure issue's bar; a new driver or format is a new module, not a longer one)."""

from __future__ import annotations

import ast
import pathlib

import specproof

ROOT = pathlib.Path(specproof.__file__).parent
MAX_CLASS, MAX_FUNCTION = 300, 80


def oversized(root: pathlib.Path) -> list[str]:
    """``path:line name (N lines)`` for every class over ``MAX_CLASS`` and function over ``MAX_FUNCTION``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                limit = MAX_CLASS if isinstance(node, ast.ClassDef) else MAX_FUNCTION
                if size > limit:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({size} lines)")
    return found


def test_no_class_or_function_is_over_its_size() -> None:
    assert oversized(ROOT) == [], "split these into named helpers or modules"


def test_the_size_check_rejects_a_long_function_and_accepts_a_long_module(tmp_path: pathlib.Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION))
    (pkg / "long.py").write_text(f"def too_long():\n{body}")
    half = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION // 2))
    (pkg / "many.py").write_text("".join(f"def f{i}():\n{half}" for i in range(5)))
    assert [line.split()[1] for line in oversized(pkg)] == ["too_long"]
