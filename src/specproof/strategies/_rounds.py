"""Scripted rounds: ``PlannedRound``/``RoundPlan``, the ``round_plans`` strategy and ``ScriptedDrafter``.

A plan says, round by round, how long the draft is and how many of its leading tokens
are right. ``ScriptedDrafter`` knows the true greedy continuation, so it can make
exactly that many right and the next one wrong: every accept/reject/rollback path of a
speculative engine can be reached on purpose instead of by luck.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from numbers import Integral
from typing import Any

import attrs
import numpy as np
from hypothesis import strategies as st

from specproof.contract.errors import InvalidSettingError, SpecproofError, TokenRangeError
from specproof.contract.validation import int_at_least, int_at_least_validator
from specproof.strategies._contexts import StrategyArgumentError, check_kinds

__all__ = [
    "ROUND_KINDS",
    "PlannedRound",
    "RoundPlan",
    "ScriptMismatchError",
    "ScriptedDrafter",
    "planned_round",
    "round_plans",
]

# Named round kinds, simplest first (``st.sampled_from`` shrinks toward the first):
#   all_accepted     draft of k tokens, all right (no rollback; the bonus token is the target's)
#   empty_draft      the drafter proposes nothing (a one-token verify)
#   rejected_at_0    draft of k tokens, the first wrong (roll back everything but one token)
#   partial          draft of k tokens, 1..k-1 right (roll back into the middle of the draft)
#   short_draft      draft of 1..k-1 tokens (< k), any number right
#   full_then_empty  an all-accepted round, then an empty draft right after it (the
#                    "stale recurrent state after a zero-draft step" bug class)
ROUND_KINDS: tuple[str, ...] = (
    "all_accepted",
    "empty_draft",
    "rejected_at_0",
    "partial",
    "short_draft",
    "full_then_empty",
)
_MIN_K = {"all_accepted": 1, "empty_draft": 0, "rejected_at_0": 1, "partial": 2, "short_draft": 2, "full_then_empty": 1}


class ScriptMismatchError(SpecproofError, ValueError):
    """A ``ScriptedDrafter`` was asked to draft for a context its script does not describe."""


@attrs.frozen
class PlannedRound:
    """One scripted round: a draft of ``draft_length`` tokens whose first ``correct`` are right.

    When ``correct < draft_length`` the token at index ``correct`` is wrong, so the
    engine accepts exactly ``correct`` draft tokens plus its own bonus token. The
    engine may ask for fewer than ``draft_length`` tokens (near ``max_new_tokens`` or
    ``max_context``); the draft is then cut and stays right up to ``correct``.
    """

    draft_length: int = attrs.field(validator=int_at_least_validator(0))
    correct: int = attrs.field(validator=int_at_least_validator(0))

    def __attrs_post_init__(self) -> None:
        if self.correct > self.draft_length:
            raise InvalidSettingError(
                f"PlannedRound.correct={self.correct} must be <= draft_length={self.draft_length}"
            )

    @property
    def kind(self) -> str:
        """``empty_draft``, ``all_accepted``, ``rejected_at_0`` or ``partial`` (what the round does to a k-draft)."""
        if self.draft_length == 0:
            return "empty_draft"
        if self.correct == self.draft_length:
            return "all_accepted"
        return "rejected_at_0" if self.correct == 0 else "partial"

    def __str__(self) -> str:
        return f"{self.kind}({self.correct}/{self.draft_length})"


def _to_rounds(value: Iterable[PlannedRound]) -> tuple[PlannedRound, ...]:
    if isinstance(value, PlannedRound):
        return (value,)
    return tuple(value)


def _check_rounds(instance: object, attribute: attrs.Attribute[Any], value: tuple[PlannedRound, ...]) -> None:
    if not value:
        raise InvalidSettingError("RoundPlan.rounds=() must hold at least one PlannedRound")
    for i, rnd in enumerate(value):
        if not isinstance(rnd, PlannedRound):
            raise InvalidSettingError(f"RoundPlan.rounds[{i}]={rnd!r} is not a PlannedRound")


@attrs.frozen
class RoundPlan:
    """The drafter's script: round ``r`` (its ``r``-th ``propose`` call) follows ``rounds[r % len(rounds)]``."""

    rounds: tuple[PlannedRound, ...] = attrs.field(converter=_to_rounds, validator=_check_rounds)

    def __len__(self) -> int:
        return len(self.rounds)

    def round_at(self, index: int) -> PlannedRound:
        """The round for call ``index``; plans cycle, so any index >= 0 has one."""
        return self.rounds[index % len(self.rounds)]

    def describe(self) -> str:
        return "[" + ", ".join(str(r) for r in self.rounds) + "]"


# --------------------------------------------------------------------------- strategies


@st.composite
def _kind_rounds(draw: Any, kind: str, k: int) -> list[PlannedRound]:
    if kind == "all_accepted":
        return [PlannedRound(k, k)]
    if kind == "empty_draft":
        return [PlannedRound(0, 0)]
    if kind == "rejected_at_0":
        return [PlannedRound(k, 0)]
    if kind == "partial":
        return [PlannedRound(k, draw(st.integers(1, k - 1)))]
    if kind == "short_draft":
        length = draw(st.integers(1, k - 1))
        return [PlannedRound(length, draw(st.integers(0, length)))]
    return [PlannedRound(k, k), PlannedRound(0, 0)]  # full_then_empty


def _check_k(k: object, where: str) -> int:
    return int_at_least(k, name="k", minimum=0, where=where, error=StrategyArgumentError)


def _usable_kinds(kinds: Iterable[str] | None, k: int, where: str) -> tuple[str, ...]:
    chosen = check_kinds(kinds, known=ROUND_KINDS, where=where)
    usable = tuple(name for name in chosen if k >= _MIN_K[name])
    # with k too small for every chosen kind, the only round an engine can run is an empty draft
    return usable or ("empty_draft",)


def planned_round(*, k: int, kinds: Iterable[str] | None = None) -> st.SearchStrategy[PlannedRound]:
    """One ``PlannedRound`` for a draft budget of ``k``, of a named kind (``ROUND_KINDS`` minus the two-round one).

    Kinds that need a larger ``k`` (``partial`` and ``short_draft`` need ``k >= 2``) are
    left out; with ``k == 0`` every round is an empty draft. Shrinks toward ``all_accepted``.
    """
    where = "planned_round()"
    k = _check_k(k, where)
    usable = tuple(name for name in _usable_kinds(kinds, k, where) if name != "full_then_empty")
    if not usable:
        raise StrategyArgumentError(f"{where}: kinds={kinds!r} selects only the two-round kind 'full_then_empty'")
    return st.sampled_from(usable).flatmap(lambda name: _kind_rounds(name, k)).map(lambda rounds: rounds[0])


def round_plans(
    *, k: int, min_rounds: int = 1, max_rounds: int = 12, kinds: Iterable[str] | None = None
) -> st.SearchStrategy[RoundPlan]:
    """``RoundPlan`` s of ``min_rounds..max_rounds`` rounds built from named round kinds.

    Each segment of the plan is a kind drawn with ``st.sampled_from(ROUND_KINDS)``
    (restricted to ``kinds`` and to what ``k`` allows), so every path is reachable:
    all accepted (``correct == draft_length == k``), rejected at 0, partial, an empty
    draft, a draft shorter than ``k``, and an empty draft right after a fully accepted
    round (``full_then_empty``; cut to its first round when it would pass ``max_rounds``).
    Shrinks toward fewer rounds of the first kinds (all accepted, empty draft).
    """
    where = "round_plans()"
    k = _check_k(k, where)
    min_rounds = int_at_least(min_rounds, name="min_rounds", minimum=1, where=where, error=StrategyArgumentError)
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < min_rounds:
        raise StrategyArgumentError(f"{where}: max_rounds={max_rounds!r} must be an integer >= min_rounds={min_rounds}")
    usable = _usable_kinds(kinds, k, where)

    @st.composite
    def plan(draw: Any) -> RoundPlan:
        n = draw(st.integers(min_rounds, max_rounds))
        rounds: list[PlannedRound] = []
        while len(rounds) < n:  # each segment adds >= 1 round
            name = draw(st.sampled_from(usable))
            rounds.extend(draw(_kind_rounds(name, k)))
        return RoundPlan(tuple(rounds[:n]))

    return plan()


# --------------------------------------------------------------------------- the drafter


def _check_tokens(values: Sequence[int], *, name: str, vocab_size: int, allow_empty: bool) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)):
        raise TokenRangeError(f"ScriptedDrafter: {name} must be a sequence of token ids, got {type(values).__name__}")
    out = tuple(values)
    if not out and not allow_empty:
        raise InvalidSettingError(f"ScriptedDrafter: {name} is empty; it needs at least one token")
    for i, tok in enumerate(out):
        if isinstance(tok, (bool, np.bool_)) or not isinstance(tok, Integral) or not 0 <= int(tok) < vocab_size:
            raise TokenRangeError(f"ScriptedDrafter: {name}[{i}]={tok!r} is not a token id in [0, {vocab_size})")
    return tuple(int(t) for t in out)


class ScriptedDrafter:
    """A ``Drafter`` that follows a ``RoundPlan`` against a known greedy continuation.

    ``continuation`` is the target's greedy output after ``prompt``. In its ``r``-th
    ``propose(context, k)`` call the drafter follows ``plan.round_at(r)``: it proposes
    ``min(draft_length, k)`` tokens of the continuation from position
    ``len(context) - len(prompt)``, with the token at index ``correct`` (if inside the
    draft) replaced by ``(t + 1) % vocab_size``, so exactly ``correct`` leading tokens
    are right. Drafts stop where the continuation ends.

    The round counter counts calls, not engine rounds: an engine does not call
    ``propose`` in a round whose effective k is 0. ``reset()`` (called by engines at
    the start of every generation) sets it back to 0. ``context`` must start with
    ``prompt``; otherwise ``ScriptMismatchError`` says where they differ.
    ``calls`` records ``(round index, planned round, k, draft)`` for failure messages.
    """

    def __init__(self, prompt: Sequence[int], continuation: Sequence[int], plan: RoundPlan, *, vocab_size: int) -> None:
        int_at_least(
            vocab_size, name="vocab_size", minimum=2, where="ScriptedDrafter", hint=" (a wrong token needs a second id)"
        )
        if not isinstance(plan, RoundPlan):
            raise InvalidSettingError(f"ScriptedDrafter: plan must be a RoundPlan, got {type(plan).__name__}")
        self.vocab_size = vocab_size
        self.prompt = _check_tokens(prompt, name="prompt", vocab_size=vocab_size, allow_empty=False)
        self.continuation = _check_tokens(continuation, name="continuation", vocab_size=vocab_size, allow_empty=True)
        self.plan = plan
        self.rounds_done = 0
        self.calls: list[tuple[int, PlannedRound, int, tuple[int, ...]]] = []
        self.name = f"ScriptedDrafter(plan={plan.describe()})"

    def __repr__(self) -> str:
        return (
            f"ScriptedDrafter(prompt=<{len(self.prompt)} tokens>, continuation=<{len(self.continuation)} tokens>, "
            f"plan={self.plan.describe()}, rounds_done={self.rounds_done})"
        )

    def reset(self) -> None:
        """Start the plan again from its first round."""
        self.rounds_done = 0
        self.calls.clear()

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        int_at_least(k, name="k", minimum=0, where="ScriptedDrafter.propose")
        k = int(k)
        m = len(self.prompt)
        head = [int(t) for t in context[:m]]
        if len(context) < m or head != list(self.prompt):
            at = next((i for i, (a, b) in enumerate(zip(head, self.prompt)) if a != b), len(head))
            raise ScriptMismatchError(
                f"ScriptedDrafter.propose: the context ({len(context)} tokens) does not start with the scripted "
                f"prompt ({m} tokens); first difference at index {at}"
            )
        index = self.rounds_done
        planned = self.plan.round_at(index)
        pos = len(context) - m
        draft = list(self.continuation[pos : pos + min(planned.draft_length, k)])
        if planned.correct < len(draft):
            draft[planned.correct] = (draft[planned.correct] + 1) % self.vocab_size
        self.rounds_done += 1
        self.calls.append((index, planned, k, tuple(draft)))
        return draft
