"""The invariant registry is the one source of truth: the docs' table, --only and the zoo derive from it."""

from __future__ import annotations

import json
import pathlib
import re

import pytest

from specproof.cli import main
from specproof.conformance import REGISTRY, select
from specproof.conformance.cli_support import markdown_table
from specproof.conformance.zoo import ZOO
from specproof.contract import UsageError

INVARIANTS_PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "invariants.md"


def test_docs_table_is_the_registry() -> None:
    text = INVARIANTS_PAGE.read_text()
    block = re.search(r"<!-- invariants:start[^>]*-->\n(.*?)\n<!-- invariants:end -->", text, re.S)
    assert block is not None, "docs/invariants.md has no generated invariant table"
    assert block.group(1) == markdown_table(), "regenerate it: specproof invariants --markdown"


def test_ids_are_unique_and_well_formed() -> None:
    ids = [inv.id for inv in REGISTRY]
    assert len(ids) == len(set(ids))
    assert all(re.fullmatch(r"[a-z]+\.[a-z0-9-]+", i) for i in ids)
    assert all(inv.summary and inv.draws for inv in REGISTRY)


def test_every_zoo_member_names_a_registered_invariant() -> None:
    ids = {inv.id for inv in REGISTRY}
    for member in ZOO.values():
        assert member.invariant in ids and set(member.also) <= ids


@pytest.mark.parametrize(
    ("patterns", "expected"),
    [
        (["engine.kv-length,engine.lossless"], ("engine.lossless", "engine.kv-length")),
        (["engine.kv-length", "engine.lossless"], ("engine.lossless", "engine.kv-length")),
        (
            ["drafter.*"],
            (
                "drafter.max-length",
                "drafter.token-range",
                "drafter.deterministic",
                "drafter.no-mutation",
                "drafter.features",
                "drafter.tree-well-formed",
                "drafter.tree-deterministic",
                "drafter.proposal-distribution",
            ),
        ),
    ],
)
def test_select_takes_ids_and_globs(patterns: list[str], expected: tuple[str, ...]) -> None:
    assert select(patterns) == expected


def test_unknown_id_is_a_usage_error_with_the_closest_ids() -> None:
    with pytest.raises(UsageError, match=r"did you mean engine\.kv-length"):
        select(["engine.kv-lenght"])


def test_invariants_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["invariants", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [d["id"] for d in data] == [inv.id for inv in REGISTRY]
    assert main(["invariants"]) == 0
    assert "engine.session" in capsys.readouterr().out


def test_a_record_check_counts_what_it_reached_and_never_hides_a_violation() -> None:
    """The one rule for a record check's outcome (``_counted``), which every record check uses."""
    from specproof.conformance import _registry

    def never() -> str:
        raise AssertionError("held() is called only when the check held")

    inv = REGISTRY[0]
    found = [inv.violation("x")]
    assert _registry._counted([], 0, never) == _registry.Outcome([], exercised=0, note="nothing reached it")
    assert _registry._counted([], 0, never, unreached="no features").note == "no features"
    assert _registry._counted([], 3, lambda: "3 held") == _registry.Outcome([], exercised=3, note="3 held")
    # a violation found where the count says nothing was reached still counts as exercised
    assert _registry._counted(found, 0, never) == _registry.Outcome(found, exercised=1, note="nothing reached it")
    assert _registry._counted(found, 5, never) == _registry.Outcome(found, exercised=5, note="")
