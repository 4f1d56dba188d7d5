"""The public API is ``specproof.__all__``: at most 40 names, each the object its home module
defines, loaded lazily (``import specproof`` imports no layer), and the README's examples import
only from it (docs/contract.md, "Stability")."""

from __future__ import annotations

import importlib
import pathlib
import re
import subprocess
import sys

import specproof

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_the_public_api_is_small_and_every_name_resolves_to_its_home() -> None:
    names = [n for n in specproof.__all__ if n != "__version__"]
    assert len(specproof.__all__) <= 40, f"specproof.__all__ has {len(specproof.__all__)} names (at most 40)"
    assert len(set(names)) == len(names)
    for name in names:
        home = importlib.import_module(specproof._EXPORTS[name])
        assert getattr(specproof, name) is getattr(home, name), name
    assert sorted(dir(specproof)) == sorted(specproof.__all__)


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        specproof.NotAName  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as e:
        assert "NotAName" in str(e)
    else:
        raise AssertionError("specproof.NotAName resolved")


def test_import_specproof_loads_no_layer() -> None:
    code = "import sys, specproof; print(sorted(m for m in sys.modules if m.startswith('specproof')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['specproof', 'specproof._version']", out


def test_the_readme_examples_import_only_from_the_public_api() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    imports = [
        line.strip() for block in blocks for line in block.splitlines() if re.match(r"\s*(from|import) specproof", line)
    ]
    wrong = [line for line in imports if not re.match(r"(from specproof import |import specproof$)", line)]
    assert wrong == [], f"README examples import from below the public API: {wrong}"
