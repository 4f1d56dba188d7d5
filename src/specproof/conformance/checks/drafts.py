"""``engine.drafts-used``: an engine the suite drove with its drafter verified what it was sent.

A pure function over two records: the drafts the suite's drafter handed out (each with the
context length and the k it was asked for) and the rounds the engine reported. The rule
(docs/contract.md, "Engines"):

- every round whose draft is not empty was preceded by a request for a draft at that
  context (``len(ctx) == base + 1``), and its draft is what the suite answered, cut to the
  ``k`` the engine asked for or not cut at all (an over-long draft may be cut to k; verifying
  it whole is judged by ``engine.accept-bounds`` and ``engine.stop``); an engine may never
  verify tokens of its own;
- when the suite answered with a token outside ``[0, vocab_size)`` the engine may instead
  cut the draft before that token (or refuse the request: the harness judges a refusal);
- an engine the suite set a drafter on that asked for no draft at all, in a generation
  with a round that had room for one, ignored the suite.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral
from typing import Any

from specproof.conformance._records import Proposal
from specproof.contract import Violation

__all__ = ["check_drafts_used"]


def _short(tokens: Sequence[object], limit: int = 12) -> str:
    items = list(tokens)
    return "[" + ", ".join(str(t) for t in items[:limit]) + (", ...]" if len(items) > limit else "]")


def _in_range(token: object, vocab_size: int | None) -> bool:
    # any integer type a drafter may return (numpy's included), never a bool
    if isinstance(token, bool) or not isinstance(token, Integral):
        return False
    return vocab_size is None or 0 <= int(token) < vocab_size


def check_drafts_used(
    inv: Any,
    steps: Sequence[object],
    proposals: Sequence[Proposal],
    *,
    max_new_tokens: int,
    k: int | None,
    max_context: int | None,
    vocab_size: int | None,
) -> tuple[list[Violation], int]:
    """The violations of the drafts-used rule (built by ``inv``) and how many rounds were compared.

    ``steps`` are the engine's ``Step`` records (``base`` and ``draft`` are read);
    ``proposals`` the suite drafter's answers in call order.
    """
    if not proposals:
        violations = _never_asked(inv, steps, max_new_tokens=max_new_tokens, k=k, max_context=max_context)
        return violations, len(steps) if violations else 0
    by_length: dict[int, Proposal] = {}
    for p in proposals:
        by_length[p.context_length] = p  # the last request at a context (an engine may retry)
    violations = []
    compared = 0
    for index, step in enumerate(steps):
        base = int(getattr(step, "base", 0))
        draft = [int(t) for t in getattr(step, "draft", ())]
        asked = by_length.get(base + 1)
        if asked is None:
            if draft:
                compared += 1
                violations.append(
                    inv.violation(
                        round=index,
                        explanation=(
                            f"round {index} (context of {base + 1} tokens) verified the draft {_short(draft)}, but the "
                            f"engine asked the suite for no draft at that context (it asked at context lengths "
                            f"{sorted(by_length)[:8]})"
                        ),
                        actual=draft,
                    )
                )
            continue
        compared += 1
        breach = _draft_against_sent(inv, index, base, draft, asked, vocab_size)
        if breach is not None:
            violations.append(breach)
    return violations, compared


def _never_asked(
    inv: Any, steps: Sequence[object], *, max_new_tokens: int, k: int | None, max_context: int | None
) -> list[Violation]:
    """The engine asked the suite for no draft: a breach when a round had room for one or drafted its own."""
    # could any round have asked? k_eff = min(k, remaining - 1, room - 1) >= 1
    bound = k if k is not None else 1
    emitted = 0
    room_rounds = 0
    for step in steps:
        base = int(getattr(step, "base", 0))
        remaining = max_new_tokens - emitted
        room = (max_context - base) if max_context is not None else remaining
        if min(bound, remaining - 1, room - 1) >= 1:
            room_rounds += 1
        emitted += len(getattr(step, "accepted", ()) or ())
    drafted = sum(1 for s in steps if getattr(s, "draft", ()))
    if not (room_rounds or drafted):
        return []
    return [
        inv.violation(
            explanation=(
                f"the suite set a drafter, the engine asked for 0 drafts in {len(steps)} rounds "
                f"({room_rounds} of them had room for a draft, {drafted} reported a draft of its own)"
            ),
        )
    ]


def _draft_against_sent(
    inv: Any, index: int, base: int, draft: list[int], asked: Proposal, vocab_size: int | None
) -> Violation | None:
    """Round ``index`` must verify what the suite sent at its context, cut to the k asked for (or longer, by the
    engine's own bound) or cut before an id outside the vocabulary; None when it did."""
    sent = list(asked.draft)
    want = sent[: asked.k]
    bad = next((i for i, t in enumerate(want) if not _in_range(t, vocab_size)), None)
    if bad is not None and len(draft) > bad:
        return inv.violation(  # type: ignore[no-any-return]
            round=index,
            explanation=(
                f"round {index} (context of {base + 1} tokens) verified the draft {_short(draft)}, whose "
                f"token {bad} ({want[bad]!r}) is outside [0, {vocab_size}): a draft with an id outside the "
                "vocabulary must be cut before it or refused (docs/contract.md, the hostile-drafter rule)"
            ),
            expected=want[:bad],
            actual=draft,
            example={"sent_draft": sent, "k_asked": asked.k},
        )
    if draft == sent[: len(draft)] and len(draft) >= len(want):
        return None  # what was sent, cut to the k asked for or (an engine's own bound) longer
    if bad is not None and draft == want[: len(draft)]:
        return None  # cut before an out-of-range token: allowed
    cut = f" (cut to the k={asked.k} it asked for: {_short(want)})" if len(sent) > asked.k else ""
    return inv.violation(  # type: ignore[no-any-return]
        round=index,
        explanation=(
            f"round {index} (context of {base + 1} tokens): the suite's drafter sent {_short(sent)}{cut}, "
            f"but the round reports the draft {_short(draft)}"
        ),
        expected=want,
        actual=draft,
        example={"sent_draft": sent, "k_asked": asked.k},
    )
