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


def test_the_profile_capacities_in_the_docs_are_the_profiles() -> None:
    """Every "quick N, ci N, release N" capacity list in the README and docs/ says what the
    profiles hold (``conformance._profiles.PROFILES``); so does the --max-context help text."""
    from specproof.conformance._options import get
    from specproof.conformance._profiles import PROFILES

    want = tuple(PROFILES[name].max_capacity for name in ("quick", "ci", "release"))
    pattern = re.compile(r"quick\s+(\d+)(?: tokens)?,\s+ci\s+(\d+),\s+release\s+(\d+)")
    pages = [README, *sorted((README.parent / "docs").glob("*.md"))]
    found = [(p.name, tuple(int(n) for n in m.groups())) for p in pages for m in pattern.finditer(p.read_text())]
    assert found, "no page lists the profile capacities (the pattern or the docs changed)"
    assert all(got == want for _, got in found), f"the profiles' capacities are {want}; the docs say {found}"
    help_text = get("max_context").help
    assert tuple(int(n) for n in pattern.search(help_text).groups()) == want, help_text  # type: ignore[union-attr]
