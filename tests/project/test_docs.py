"""The docs hold together: every relative link and anchor resolves, every page is reachable,
the README stays short and keeps its two commands, and its layout lists every package."""

from __future__ import annotations

import pathlib
import re
from collections import Counter

import pytest

import specproof

ROOT = pathlib.Path(specproof.__file__).parent
REPO = pathlib.Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
README_MAX_LINES = 220

# The main job and the test command; .ci/run runs the second (`python3 -m tox`).
INSTALL_AND_CERTIFY = "python3 -m pip install . && specproof certify"
TEST_COMMAND = "python3 -m pip install tox && tox"

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$", re.M)
_HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def _pages() -> list[pathlib.Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _prose(text: str) -> str:
    """The text outside fenced code blocks and code spans (links there are not links)."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: pathlib.Path) -> set[str]:
    """Every anchor a page defines: its headings (duplicates numbered as GitHub does), <a id>."""
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    seen: Counter[str] = Counter()
    found = set(_HTML_ANCHOR.findall(text))
    for _, title in _HEADING.findall(text):
        base = slug(title)
        found.add(base if seen[base] == 0 else f"{base}-{seen[base]}")
        seen[base] += 1
    return found


def links(page: pathlib.Path) -> list[str]:
    return _LINK.findall(_prose(page.read_text(encoding="utf-8")))


def _resolve(page: pathlib.Path, target: str) -> tuple[pathlib.Path, str]:
    path, _, anchor = target.partition("#")
    return (page if not path else (page.parent / path).resolve()), anchor


def _is_external(target: str) -> bool:
    return re.match(r"[a-z][a-z0-9+.-]*:", target) is not None


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


def test_readme_says_which_dependency_does_what() -> None:
    text = README.read_text()
    table = re.search(r"\| dependency \| what it does here \|\n\|[-|]+\|\n((?:\|.*\|\n)+)", text)
    assert table is not None, "README has no dependency table"
    names = table.group(1).lower()
    for dependency in ("numpy", "hypothesis", "pytest", "attrs", "jsonschema"):
        assert dependency in names, f"the README's dependency table does not say what {dependency} does"


def test_readme_keeps_its_two_commands_and_stays_short() -> None:
    text = README.read_text()
    for command in (INSTALL_AND_CERTIFY, TEST_COMMAND):
        assert f"\n    {command}\n" in text, f"README lost the command {command!r}"
    assert "redis-server" in text, "README no longer says the campaign tests need redis-server"
    assert "python3 -m tox" in (REPO / ".ci" / "run").read_text(), ".ci/run no longer runs the README's tox"
    lines = text.count("\n")
    assert lines <= README_MAX_LINES, f"README has {lines} lines (at most {README_MAX_LINES}): move a manual to docs/"


def test_readme_verdict_table_is_the_exit_codes() -> None:
    from specproof.conformance.reports import EXIT_CODES

    rows = dict(re.findall(r"^\| `?([A-Za-z ]+?)`? \| (\d+) \|", README.read_text(), re.M))
    documented = {name.lower(): int(code) for name, code in rows.items()}
    assert documented.pop("usage error", None) == 2, "README's verdict table lost the usage error (exit 2)"
    assert documented == EXIT_CODES, f"README's verdict table {documented} is not the code's {EXIT_CODES}"


def test_capacities_in_the_docs_are_the_profiles() -> None:
    from specproof.conformance._profiles import PROFILES

    actual = tuple(PROFILES[name].max_capacity for name in ("quick", "ci", "release"))
    found = 0
    for page in _pages():
        for stated in re.findall(r"quick\s+(\d+)\s+tokens,\s+ci\s+(\d+),\s+release\s+(\d+)", page.read_text()):
            found += 1
            assert tuple(map(int, stated)) == actual, f"{page.name} states capacities {stated}, profiles have {actual}"
    assert found, "no page states the profiles' capacities (certify.md should)"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: pathlib.Path) -> None:
    targets = [t for t in links(page) if not _is_external(t)]
    broken = []
    for target in targets:
        path, anchor = _resolve(page, target)
        if not path.exists():
            broken.append(f"{target} (no file {path.relative_to(REPO) if path.is_relative_to(REPO) else path})")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target} (no heading with anchor #{anchor} in {path.relative_to(REPO)})")
    assert broken == [], f"{page.relative_to(REPO)}: broken links: {broken}"


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    reached, todo = {README}, [README]
    while todo:
        page = todo.pop()
        for target in links(page):
            if _is_external(target):
                continue
            path, _ = _resolve(page, target)
            if path.suffix == ".md" and path.exists() and path not in reached:
                reached.add(path)
                todo.append(path)
    pages = set(DOCS.glob("*.md"))
    assert pages, "no docs page found"
    unreached = sorted(str(p.relative_to(REPO)) for p in pages - reached)
    assert unreached == [], f"docs pages no link from README.md or docs/index.md leads to: {unreached}"
    index_links = {_resolve(DOCS / "index.md", t)[0] for t in links(DOCS / "index.md") if not _is_external(t)}
    assert (DOCS / "index.md") in {_resolve(README, t)[0] for t in links(README)}, "README does not link docs/index.md"
    unlisted = sorted(str(p.relative_to(REPO)) for p in pages - index_links - {DOCS / "index.md"})
    assert unlisted == [], f"docs/index.md does not list: {unlisted}"


def test_the_link_checker_rejects_a_broken_link_and_accepts_a_good_one(tmp_path: pathlib.Path) -> None:
    """Meta-test: the checker's own pieces catch a missing file and a missing anchor."""
    page = tmp_path / "page.md"
    page.write_text(
        "# Engines in any language: `specproof-engine/1`\n\n## Draft models: `--drafter model:…`\n\n"
        "## Again\n\n## Again\n\n[ok](#engines-in-any-language-specproof-engine1) [ok](#again-1)\n"
        "[code](`not a link`) `[no](nope.md)`\n```\n[no](fenced.md)\n```\n[gone](missing.md#x)\n"
    )
    expected = {"engines-in-any-language-specproof-engine1", "draft-models---drafter-model", "again", "again-1"}
    assert anchors(page) >= expected
    assert links(page) == ["#engines-in-any-language-specproof-engine1", "#again-1", "missing.md#x"]
    assert not _resolve(page, "missing.md#x")[0].exists()
    assert "again-2" not in anchors(page)


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


CONTRACT = pathlib.Path(__file__).resolve().parents[2] / "docs" / "contract.md"


def _contract_record_example() -> dict[str, object]:
    text = CONTRACT.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    (block,) = [b for b in blocks if "def generation_record" in b]
    namespace: dict[str, object] = {}
    exec(compile(block, str(CONTRACT), "exec"), namespace)  # the documented code, as a user copies it
    return namespace


def test_contract_record_example_passes_engine_cost_one_token_prompt_included() -> None:
    """docs/contract.md's Step/Stats example, rebuilt from real decodings (checkpoint and replay, prompts of
    one and several tokens), passes engine.cost: `Stats(prefill_forwards=1)` as once shown failed it on a
    one-token prompt. And the check can fail: the old constant 1 is caught."""
    import attrs

    from specproof.conformance import get
    from specproof.conformance.checks import check_cost
    from specproof.engine import NgramDrafter, SpecDecoder
    from specproof.engine.targets import load_target

    example = _contract_record_example()
    round_record, generation_record = example["round_record"], example["generation_record"]
    inv = get("engine.cost")
    for rollback in ("checkpoint", "replay"):
        for prompt in ([5], [5, 9, 5, 9, 5]):
            gen = SpecDecoder(load_target("reference"), NgramDrafter(), k=3, rollback=rollback).generate(prompt, 24)
            steps = [
                round_record(s.base, list(s.draft), list(s.argmax), list(s.accepted), s.processed)  # type: ignore[operator]
                for s in gen.steps
            ]
            rebuilt = generation_record(  # type: ignore[operator]
                prompt,
                list(gen.tokens),
                steps,
                replay_forwards=gen.stats.replay_forwards,
                stop_reason=gen.stop_reason,
            )
            assert rebuilt.stats.drafted > 0, "the example must be exercised on rounds with drafts"
            found = check_cost(inv, rebuilt, rollback=rollback, prompt_length=len(prompt))
            assert found == [], (rollback, prompt, [v.explanation for v in found])
            if len(prompt) == 1:
                wrong = attrs.evolve(rebuilt, stats=attrs.evolve(rebuilt.stats, prefill_forwards=1))
                assert check_cost(inv, wrong, rollback=rollback, prompt_length=1)


BENCH_PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "bench.md"
BENCH_RUN = "benchmarks/bench-quick.json"


def test_bench_figures_in_the_docs_are_generated_from_the_committed_run() -> None:
    """docs/bench.md's figures block is exactly what benchmarks/update_bench_doc.py renders from the committed
    run file (a valid specproof-bench/2 result), names that run, and is consistent row by row:
    efficiency = speedup / tok/round, no verify-cost figure beside it."""
    import json

    from specproof.bench._doc import BEGIN, END, figures_block
    from specproof.formats import validate

    run = json.loads((BENCH_PAGE.parents[1] / BENCH_RUN).read_text())
    assert validate("bench-2", run) == []
    text = BENCH_PAGE.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    block = text[text.index(BEGIN) : text.index(END) + len(END)]
    assert block == figures_block(run, source=BENCH_RUN), "run `python benchmarks/update_bench_doc.py`"
    assert BENCH_RUN in block and run["platform"]["recorded_utc"] in block
    lines = block.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| workload"))
    table = lines[header + 2 : lines.index("", header)]  # the cells table (a sampled-figures table may follow)
    rows = [line.split("|")[1:-1] for line in table]
    assert len(rows) == len(run["cells"]) > 0
    for cells in rows:
        tpr, speedup, efficiency = float(cells[3]), float(cells[7].rstrip("x ")), float(cells[8])
        assert abs(efficiency - speedup / tpr) <= 0.011, cells
    assert "verify cost" not in block
