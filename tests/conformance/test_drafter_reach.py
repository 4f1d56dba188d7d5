"""The drafter checks reach every call, the paths after a full accept and a reset, and later requests.

``drafter.deterministic`` compares every call of every walk with a fresh drafter (not a
sample of positions), drives one drafter as a decoder does (a whole prompt first, drafts
accepted in full or in part), starts its post-``reset()`` walks with whole prompts longer and
shorter than the context held, and drives a declared ``history_dependent`` drafter through a
session of requests (new prompt, edit, shorter prefix, user turn) where a raise is a failure.
``drafter.no-mutation`` checks every call of such a session. Each broken drafter here is
rejected on the path it breaks; its correct-but-different twin is accepted.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from _assertions import by_invariant, explain
from _shared_runs import SharedRuns
from specproof.conformance import get
from specproof.conformance.checks.drafter import check_deterministic, check_no_mutation
from specproof.conformance.zoo import CORRECT_DRAFTERS, ZOO, LookupDrafter
from specproof.conformance.zoo._feature_drafters import head_drafter
from specproof.conformance.zoo._history_drafters import DeclaredPromptOnlyLookup
from specproof.conformance.zoo._reaching_drafters import (
    HeadKeepsChainAfterFullAccept,
    HeadLazyReset,
    HeadLazyResetKeepsLonger,
    HeadReprefills,
    MutatesOnLaterRequest,
    RaisesOnShorterRequest,
    SessionLookup,
)
from specproof.engine.drafters.heads import HeadDrafter

DETERMINISTIC = get("drafter.deterministic")
NO_MUTATION = get("drafter.no-mutation")

# a context with repeats (lookups hit) in the zoo head's vocabulary (64 ids), and an unrelated one
CTX = [(7 * i + (i // 5)) % 23 for i in range(48)]
OTHER = [(11 * i + 3) % 29 + 30 for i in range(20)]


def _head(cls: type[HeadDrafter]) -> Callable[[], HeadDrafter]:
    return lambda: head_drafter(cls)


# ------------------------------------------------------------------------------- every call of a walk


class _WrongOnCall38:
    """A lookup that proposes garbage on its 38th call: a fresh drafter asked once is always right."""

    def __init__(self) -> None:
        self.calls = 0

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        self.calls += 1
        draft = LookupDrafter().propose(context, k)
        return [(t + 1) % 256 for t in draft] + [1] if self.calls == 38 else draft

    def reset(self) -> None:
        self.calls = 0


def test_every_call_of_the_walk_is_compared_not_a_sample() -> None:
    ctx = [i % 9 for i in range(80)]
    found, compared = check_deterministic(DETERMINISTIC, _WrongOnCall38, ctx, [2], called=[True] * 80)
    assert compared >= 80 and len(found) == 1, found
    assert "called at every position" in found[0].explanation
    assert "at context length 38" in found[0].explanation


class _RaisesOnLongContexts(LookupDrafter):
    """Pure and deterministic, but raises past 30 tokens (a fresh drafter raises there too)."""

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        if len(context) > 30:
            raise ValueError("context too long")
        return super().propose(context, k)


def test_a_raise_is_a_failure_not_agreement_with_a_fresh_drafter() -> None:
    found, _ = check_deterministic(DETERMINISTIC, _RaisesOnLongContexts, CTX, [2], other=OTHER)
    assert len(found) == 1, found
    explanation = found[0].explanation
    assert "propose raised ValueError('context too long')" in explanation and "context length 31" in explanation
    assert "a fresh drafter asked once raised too, which is no excuse" in explanation
    assert "history_dependent" not in explanation  # a raise is not a history dependence to declare


# ------------------------------------------------------------------------------- a decoder's walk


def test_a_chain_kept_after_a_full_accept_is_caught_by_the_decoder_walk() -> None:
    make = _head(HeadKeepsChainAfterFullAccept)
    found, compared = check_deterministic(DETERMINISTIC, make, CTX, [3], other=OTHER, accepts=[8], prompt=10)
    assert compared and len(found) == 1, found
    assert "called as a decoder does" in found[0].explanation
    assert "whole prompt of 10 tokens" in found[0].explanation
    assert found[0].example["accepts"] == [8]


def test_the_chain_bug_needs_a_full_accept() -> None:
    """Rejected drafts (0 kept) or partial accepts (1 of 3 kept) never reach it: the full accept is what matters."""
    make = _head(HeadKeepsChainAfterFullAccept)
    for accepts in ([0], [1]):
        found, compared = check_deterministic(
            DETERMINISTIC, make, CTX, [3], other=OTHER, accepts=accepts, prompt=10, called=[True] * len(CTX)
        )
        assert compared and found == [], (accepts, found)


@pytest.mark.parametrize("cls", [HeadDrafter, HeadReprefills, HeadLazyReset])
def test_correct_heads_pass_every_walk(cls: type[HeadDrafter]) -> None:
    """The control, one keeping no head position between calls, one with a lazy reset done right."""
    called = [i % 3 == 0 for i in range(len(CTX))]
    for accepts, prompt in itertools.product(([8], [1, 8, 0]), (1, 10, 30)):
        found, compared = check_deterministic(
            DETERMINISTIC, _head(cls), CTX, [3, 1], other=OTHER, called=called, accepts=accepts, prompt=prompt
        )
        assert compared and found == [], (cls.__name__, accepts, prompt, found)


def test_the_decoder_walk_builds_on_valid_tokens_only() -> None:
    """Tokens past the vocabulary in a draft are not accepted into the built context (token-range's to judge)."""
    seen: list[list[int]] = []

    class _PadsPastVocab(LookupDrafter):
        def propose(self, context: Sequence[int], k: int) -> list[int]:
            seen.append(list(context))
            return [300] * k

    check_deterministic(DETERMINISTIC, _PadsPastVocab, CTX, [2], accepts=[8], prompt=4, vocab_size=256)
    assert seen and all(t < 256 for ctx in seen for t in ctx)


# ------------------------------------------------------------------------------- after reset()


def test_a_lazy_reset_leaking_into_a_longer_prompt_is_caught() -> None:
    found, compared = check_deterministic(
        DETERMINISTIC, _head(HeadLazyResetKeepsLonger), CTX, [2], other=OTHER, prompt=30
    )
    assert compared and len(found) == 1, found
    explanation = found[0].explanation
    assert "after an unrelated generation and reset(), starting with a whole prompt of 30 tokens" in explanation
    assert "longer than the 20 tokens it held" in explanation
    assert found[0].example["held"] == OTHER


class _ForgetsShorterOnly(LookupDrafter):
    """Pure, but its reset() is lazy the other way: a prompt shorter than the last context reads the old one."""

    def __init__(self) -> None:
        super().__init__()
        self._held: list[int] = []
        self._stale = False

    def reset(self) -> None:
        self._stale = True

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        ctx = [int(t) for t in context]
        if self._stale and len(ctx) < len(self._held):
            ctx = ctx + self._held[len(ctx) :]  # the bug: the held tail taken as this request's
        self._stale = False
        self._held = [int(t) for t in context]
        return LookupDrafter().propose(ctx, k)


def test_a_reset_leaking_into_a_shorter_prompt_is_caught() -> None:
    found, _ = check_deterministic(DETERMINISTIC, _ForgetsShorterOnly, CTX, [2], other=OTHER * 3, prompt=30)
    assert len(found) == 1, found
    assert "starting with a whole prompt of 30 tokens (shorter than the 60 tokens it held" in found[0].explanation


# ------------------------------------------------------------------------------- declared history_dependent drafters


class _RaisesOnAnEdit(DeclaredPromptOnlyLookup):
    """Declared; raises when a request shares some, not all, of the previous one (the same way on a replay)."""

    def __init__(self) -> None:
        super().__init__()
        self._last: list[int] = []

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        ctx = [int(t) for t in context]
        last, self._last = self._last, ctx
        if last and ctx[: len(last)] != last and 0 < len(ctx) and ctx[0] == last[0] and ctx[1:2] == last[1:2]:
            raise IndexError("edit")
        return super().propose(context, k)


def test_a_declared_drafter_raising_on_a_later_request_fails_naming_it() -> None:
    found, compared = check_deterministic(DETERMINISTIC, _RaisesOnAnEdit, CTX, [2], other=OTHER, prompt=12)
    assert len(found) == 1 and compared, found
    explanation = found[0].explanation
    assert "propose raised IndexError('edit')" in explanation
    assert "on an edit of the previous request" in explanation and "call " in explanation
    assert str(found[0].example["request"]).startswith("an edit")


def test_the_zoo_drafter_raising_on_a_shorter_request_fails() -> None:
    found, _ = check_deterministic(DETERMINISTIC, RaisesOnShorterRequest, CTX, [2], other=OTHER, prompt=12)
    assert len(found) == 1, found
    assert "StopIteration" in found[0].explanation
    assert "on a shorter prefix of an earlier request" in found[0].explanation


class _UnreplayableOnUserTurns(SessionLookup):
    """Declared; drafts from a process-wide counter only once a request extends an earlier one with a user turn."""

    counter = itertools.count()

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        draft = super().propose(context, k)
        if k > 0 and len(self._archive) >= 3:
            return [next(self.counter) % 50][:k]
        return draft


def test_every_request_of_the_session_is_replayed() -> None:
    found, _ = check_deterministic(DETERMINISTIC, _UnreplayableOnUserTurns, CTX, [2], other=OTHER, prompt=12)
    assert len(found) == 1, found
    assert "not replayable" in found[0].explanation
    session: list[dict[str, Any]] = found[0].example["session"]  # type: ignore[assignment]
    names = [r["request"] for r in session]
    assert len(names) == 5
    assert found[0].example["request"] in names[2:]  # a later request: the first two replay alike


class _ResetKeepsTheArchive(SessionLookup):
    """Declared; reset() forgets the current request but keeps the earlier ones."""

    def reset(self) -> None:
        archive = getattr(self, "_archive", [])
        super().reset()
        self._archive = archive


def test_a_declared_drafter_is_fresh_after_reset_across_the_session() -> None:
    found, _ = check_deterministic(DETERMINISTIC, _ResetKeepsTheArchive, CTX, [2], other=OTHER, prompt=12)
    assert len(found) == 1, found
    assert "after reset()" in found[0].explanation and "(reset() must start a new session)" in found[0].explanation


@pytest.mark.parametrize("make", [SessionLookup, DeclaredPromptOnlyLookup])
def test_correct_declared_drafters_pass_the_session(make: Callable[[], Any]) -> None:
    for prompt in (1, 12, len(CTX)):
        found, compared = check_deterministic(DETERMINISTIC, make, CTX, [2, 0, 3], other=OTHER, prompt=prompt)
        assert compared > 3 * len(CTX) // 2 and found == [], (prompt, found)


# ------------------------------------------------------------------------------- no mutation, every call


def test_a_mutation_on_a_later_request_is_caught() -> None:
    found, checked = check_no_mutation(NO_MUTATION, MutatesOnLaterRequest(), CTX, [2], other=OTHER, prompt=12)
    assert len(found) == 1 and checked > 1, found
    explanation = found[0].explanation
    assert "propose changed the context it was given" in explanation
    assert "a new request (an unrelated prompt)" not in explanation  # not on the first request: on a later one
    assert "of the session" in explanation


class _EditsAnEarlierList(LookupDrafter):
    """Keeps the first list it was handed and, on a later request, writes into it (the caller's history)."""

    def __init__(self) -> None:
        super().__init__()
        self._first: list[int] | None = None

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        if self._first is None and isinstance(context, list):
            self._first = context
        elif self._first is not None and context is not self._first and self._first:
            self._first[0] = (self._first[0] + 1) % 256
        return super().propose(context, k)


def test_a_change_to_an_earlier_requests_list_is_caught() -> None:
    found, _ = check_no_mutation(NO_MUTATION, _EditsAnEarlierList(), CTX, [2], other=OTHER, prompt=12)
    assert len(found) == 1, found
    assert "propose changed the context of a new request (an unrelated prompt)" in found[0].explanation


@pytest.mark.parametrize(
    "make",
    [SessionLookup, LookupDrafter, DeclaredPromptOnlyLookup, RaisesOnShorterRequest, _head(HeadLazyReset)],
)
def test_drafters_that_never_mutate_pass_every_call(make: Callable[[], Any]) -> None:
    found, checked = check_no_mutation(NO_MUTATION, make(), CTX, [2, 3], other=OTHER, prompt=12)
    assert found == [] and checked > len(CTX), found


# ------------------------------------------------------------------------------- through certify, at quick

MEMBERS = {
    # the relation walk's decoder rounds reach it too, and on a simpler example
    "head_keeps_chain_after_full_accept": ("drafter.deterministic", ("called as a decoder does", "a decoder round")),
    "head_lazy_reset_keeps_longer": (
        "drafter.deterministic",
        ("after an unrelated generation and reset()", "a user turn, after reset()", "again, after reset()"),
    ),
    "raises_on_shorter_request": ("drafter.deterministic", "on a shorter prefix of an earlier request"),
    "mutates_on_later_request": ("drafter.no-mutation", "propose changed the context"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MEMBERS))
def test_certify_quick_rejects_the_member_on_its_path(name: str, shared_runs: SharedRuns) -> None:
    invariant, phrase = MEMBERS[name]
    member = ZOO[name]
    assert (member.invariant, member.found_by) == (invariant, "quick")
    # the run test_zoo.py rejects the member with: made once a session
    report = shared_runs.certify("drafter", drafter=member.spec, profile="quick", only=(invariant,))
    result = by_invariant(report)[invariant]
    assert result["status"] == "fail", explain(result)
    phrases = (phrase,) if isinstance(phrase, str) else phrase
    assert any(p in result["violations"][0]["explanation"] for p in phrases), explain(result)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["feature_head_reprefills", "feature_head_lazy_reset", "session_lookup"])
def test_certify_quick_accepts_the_controls(name: str, shared_runs: SharedRuns) -> None:
    report = shared_runs.certify("drafter", drafter=CORRECT_DRAFTERS[name], profile="quick", only=("drafter.*",))
    results = by_invariant(report)
    assert report.verdict == "pass", [explain(r) for r in results.values()]
    for invariant in ("drafter.deterministic", "drafter.no-mutation"):
        assert results[invariant]["status"] == "pass" and results[invariant]["exercised"] > 0, explain(
            results[invariant]
        )
