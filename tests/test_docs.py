"""The docs the code points at exist in the repository, and the README's layout lists every package."""

from __future__ import annotations

import pathlib
import re

import specproof

ROOT = pathlib.Path(specproof.__file__).parent
README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_no_source_points_at_a_design_document_outside_the_repository() -> None:
    offenders = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py") if "DESIGN.md" in p.read_text()]
    assert offenders == [], f"point at docs/contract.md instead: {offenders}"


def test_readme_layout_lists_every_package() -> None:
    block = re.search(r"## Layout and dependencies\n\n```\n(.*?)```", README.read_text(), re.S)
    assert block is not None, "README has no layout block"
    listed = set(re.findall(r"^src/specproof/(\w+)/", block.group(1), re.M))
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages, "no package found"
    assert packages - listed == set(), f"packages missing from the README layout: {sorted(packages - listed)}"
