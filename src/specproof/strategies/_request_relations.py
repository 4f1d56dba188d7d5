"""The coverage model of requests: how a request (or a drafter call) relates to the one before it.

One enumeration, the single source of truth for what the drafter walks and the session
machine must reach, what the certificate's request-coverage table shows, and how a shrunk
session history labels its requests. ``relation_of`` classifies a new context ``after``
against the previous one, ``before``, whose first ``given`` tokens were given (the prompt;
for a drafter call, the whole context it was called on) and the rest generated (the
output; for a drafter call, the draft it proposed):

- ``fresh``: the first request of an instance (nothing before it);
- ``same``: the previous prompt again (a regenerate);
- ``extension``: the previous prompt and some of what was generated after it, nothing new
  (the prompt grew by generated tokens only);
- ``continuation``: the whole previous prompt, then new tokens (a user turn; the decoder's
  bonus token after an accepted draft; an edit inside the generated part);
- ``edit_early`` / ``edit_late``: the previous prompt kept up to a position in its first /
  second half, then something else;
- ``shorter``: a strict prefix of the previous prompt;
- ``shared_block``: a different prefix, then a block of ``SHARED_BLOCK`` tokens equal to the
  previous context's at the same positions (what a cache keyed by a block without its
  prefix serves wrongly);
- ``unrelated``: shares no first token and no such block.

Beside the relation, ``RelationTracker`` tags what surrounds the call: ``after_reset`` (the
first call after ``reset()``, its relation taken to the context before the reset, so
``same_after_reset`` is a regenerate after ``reset()`` and ``continuation_after_reset`` a
user turn after it), and for a drafter ``k_larger`` / ``k_equal`` / ``k_smaller``: a call at a
context length already called at, with a larger, the same or a smaller ``k`` than last time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import attrs

__all__ = [
    "COVERAGE",
    "DESCRIPTIONS",
    "K_TAGS",
    "RELATIONS",
    "RESET_TAGS",
    "SESSION_KIND",
    "SHARED_BLOCK",
    "RelationTracker",
    "relation_of",
    "unreached",
]

RELATIONS: tuple[str, ...] = (
    "fresh",
    "same",
    "extension",
    "continuation",
    "edit_early",
    "edit_late",
    "shorter",
    "shared_block",
    "unrelated",
)
RESET_TAGS: tuple[str, ...] = ("after_reset", "same_after_reset", "continuation_after_reset")
K_TAGS: tuple[str, ...] = ("k_larger", "k_equal", "k_smaller")
#: every column of the request-coverage table, in order
COVERAGE: tuple[str, ...] = (*RELATIONS, *RESET_TAGS, *K_TAGS)

DESCRIPTIONS: dict[str, str] = {
    "fresh": "the first request of an instance",
    "same": "the previous prompt again (a regenerate)",
    "extension": "the previous prompt extended by tokens generated after it",
    "continuation": "the previous prompt, then new tokens (a user turn, a bonus token)",
    "edit_early": "an edit of the previous prompt in its first half",
    "edit_late": "an edit of the previous prompt in its second half",
    "shorter": "a strict prefix of the previous prompt",
    "shared_block": "a different prefix, then a block equal to the previous context's at the same positions",
    "unrelated": "shares nothing with the previous context",
    "after_reset": "the first request after reset()",
    "same_after_reset": "the previous prompt again, right after reset()",
    "continuation_after_reset": "the previous prompt and new tokens, right after reset()",
    "k_larger": "a call at a context length called before, with a larger k",
    "k_equal": "a call at a context length called before, with the same k",
    "k_smaller": "a call at a context length called before, with a smaller k",
}

#: the session request kind (``REQUEST_KINDS``) a relation to the previous request is
SESSION_KIND: dict[str, str] = {
    "fresh": "new_prompt",
    "same": "regenerate",
    "extension": "earlier_prefix",
    "continuation": "multi_turn",
    "edit_early": "edit",
    "edit_late": "edit",
    "shorter": "earlier_prefix",
    "shared_block": "new_prompt",
    "unrelated": "new_prompt",
}

SHARED_BLOCK = 4  # tokens of an equal block after a different prefix


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _shares_block(before: Sequence[int], after: Sequence[int], start: int) -> bool:
    """An aligned block of ``SHARED_BLOCK`` equal tokens at or after ``start``."""
    end = min(len(before), len(after)) - SHARED_BLOCK
    run = 0
    for i in range(start, end + SHARED_BLOCK):
        run = run + 1 if before[i] == after[i] else 0
        if run >= SHARED_BLOCK:
            return True
    return False


def relation_of(before: Sequence[int] | None, after: Sequence[int], *, given: int) -> str:
    """How ``after`` relates to ``before`` (its first ``given`` tokens given, the rest generated): one of
    ``RELATIONS`` (the module docstring); ``fresh`` when there is no ``before``."""
    if before is None:
        return "fresh"
    before = [int(t) for t in before]
    after = [int(t) for t in after]
    g = max(0, min(given, len(before)))
    c = _common(before, after)
    if c >= g:
        if len(after) == g:
            return "same"
        if c == len(after):
            return "extension"
        return "continuation"
    if c == len(after):
        return "shorter"
    if _shares_block(before, after, c + 1):
        return "shared_block"
    if c == 0:
        return "unrelated"
    return "edit_early" if 2 * c < g else "edit_late"


@attrs.define
class RelationTracker:
    """Tags each call of one instance with its relation to the call before (and its reset and k tags).

    ``call(context, k, generated)`` after each call, ``reset()`` when the instance is reset;
    ``counts`` holds the tags seen. ``k`` is None for an engine (its k is its own).
    """

    counts: Counter[str] = attrs.Factory(Counter)
    _before: tuple[int, ...] | None = None
    _given: int = 0
    _reset: bool = False
    _k_at: dict[int, int] = attrs.Factory(dict)

    def reset(self) -> None:
        self._reset = self._before is not None

    def call(self, context: Sequence[int], generated: Sequence[int] = (), *, k: int | None = None) -> list[str]:
        """Count the call on ``context`` (followed by ``generated``) and return its tags."""
        ctx = tuple(int(t) for t in context)
        relation = relation_of(self._before, ctx, given=self._given)
        tags = [relation]
        if self._reset:
            tags.append("after_reset")
            if relation in ("same", "continuation"):
                tags.append(f"{relation}_after_reset")
        if k is not None:
            last = self._k_at.get(len(ctx))
            if last is not None:
                tags.append("k_larger" if k > last else "k_smaller" if k < last else "k_equal")
            self._k_at[len(ctx)] = k
        self._before = (*ctx, *(int(t) for t in generated))
        self._given = len(ctx)
        self._reset = False
        self.counts.update(tags)
        return tags


def unreached(counts: Counter[str] | dict[str, int], applicable: Iterable[str]) -> list[str]:
    """The applicable tags ``counts`` never reached, in ``COVERAGE`` order."""
    wanted = set(applicable)
    return [tag for tag in COVERAGE if tag in wanted and not counts.get(tag)]
