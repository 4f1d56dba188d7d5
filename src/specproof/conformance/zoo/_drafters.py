"""Broken drafters: a prompt-lookup drafter with one bug each.

``LookupDrafter`` is the correct control: it finds the most recent earlier
occurrence of the last context token and proposes up to ``k`` tokens that followed
it. Each subclass changes one thing. The zoo drafters assume the default target's
vocabulary (``reference``: 256 ids) where they need a vocabulary size.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence

__all__ = [
    "DEFAULT_VOCAB",
    "LookupDrafter",
    "MatchPointer",
    "MutatesInput",
    "Nondeterministic",
    "OutOfRange",
    "ReadsPastContext",
    "ReturnsGenerator",
    "StickyCache",
    "TooLong",
    "lookup_continuation",
]

DEFAULT_VOCAB = 256  # the vocabulary of the default certification target, `reference`


def lookup_continuation(context: Sequence[int], k: int) -> list[int]:
    """Up to ``k`` tokens that followed the most recent earlier occurrence of ``context[-1]``."""
    n = len(context)
    if k <= 0 or n < 2:
        return []
    last = context[-1]
    for start in range(n - 2, -1, -1):
        if context[start] == last:
            return [int(t) for t in context[start + 1 : start + 1 + k]]
    return []


class LookupDrafter:
    """The correct control: one-token prompt lookup, at most ``k`` tokens, pure function of the context."""

    bug = "none (the correct control)"

    def __init__(self) -> None:
        self.name = f"specproof.zoo.{type(self).__name__}"

    def __repr__(self) -> str:
        return f"<{self.name}; bug: {self.bug}>"

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        return lookup_continuation(context, k)


class TooLong(LookupDrafter):
    """``drafter.max-length``: fills the draft to ``k + 1`` tokens, the verify width, instead of ``k``.

    Shipped as: a drafter that confused the verify forward's length (pending token
    plus draft, ``k + 1``) with the draft length, padding with the last token.
    """

    bug = "pads the draft to k + 1 tokens"

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        draft = lookup_continuation(context, k)
        return draft + [int(context[-1])] * (k + 1 - len(draft))


class OutOfRange(LookupDrafter):
    """``drafter.token-range``: pads short drafts to ``k`` with the sentinel id ``vocab_size``.

    Shipped as: batched drafters that pad ragged drafts with a "no token" id one past
    the vocabulary and forget to strip it before verification.
    """

    bug = "pads drafts with the id vocab_size"

    def __init__(self, vocab_size: int = DEFAULT_VOCAB) -> None:
        super().__init__()
        self.vocab_size = vocab_size

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        draft = lookup_continuation(context, k)
        return draft + [self.vocab_size] * (k - len(draft))


class Nondeterministic(LookupDrafter):
    """``drafter.deterministic``: samples its draft from an RNG seeded by the OS, not by the history.

    Shipped as: a sampling draft head left at temperature > 0 with an unseeded
    generator: the same context gives different drafts from run to run.
    """

    bug = "drafts are random (OS-seeded RNG)"

    def __init__(self, vocab_size: int = DEFAULT_VOCAB) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self._rng = random.Random(os.urandom(16))

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        return [self._rng.randrange(self.vocab_size) for _ in range(max(k, 0))]


class MutatesInput(LookupDrafter):
    """``drafter.no-mutation``: multi-step lookup that extends the caller's list in place.

    It drafts one token at a time, appending each to a working context to look up the
    next. To save a copy it works on the context itself when handed a ``list`` (the
    decoder hands a read-only view, so this only bites callers that pass their own
    list: the drafter then appends its draft to the caller's history).
    """

    bug = "appends its draft to the context list it was given"

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        work = context if isinstance(context, list) else list(context)
        draft: list[int] = []
        for _ in range(max(k, 0)):
            step = lookup_continuation(work, 1)
            if not step:
                break
            draft.append(step[0])
            work.append(step[0])
        return draft


class StickyCache(LookupDrafter):
    """``drafter.deterministic``: caches drafts keyed by ``(len(context), k)``; ``reset()`` does nothing.

    Shipped as: a drafter that memoises by position to save work across rounds and
    forgets to key on the content, with a ``reset()`` stub: the next generation gets the
    previous generation's drafts wherever the lengths coincide.
    """

    bug = "drafts cached by (len(context), k); reset() is a no-op"

    def __init__(self) -> None:
        super().__init__()
        self._cache: dict[tuple[int, int], list[int]] = {}

    def reset(self) -> None:
        pass

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        key = (len(context), k)
        if key not in self._cache:
            self._cache[key] = lookup_continuation(context, k)
        return list(self._cache[key])


class MatchPointer(LookupDrafter):
    """``drafter.deterministic``: resumes the previous call's match instead of looking up again.

    Shipped as: an incremental prompt-lookup drafter that keeps a pointer into the
    context where its last draft came from and, if the context grew, continues from
    there. Right when it is called every round; wrong when an engine skips calls
    (``k_eff = 0`` near the budget, a varying k): the pointer then points at stale text.
    """

    bug = "drafts from the previous call's match pointer"

    def __init__(self) -> None:
        super().__init__()
        self._pointer: int | None = None
        self._seen = 0

    def reset(self) -> None:
        self._pointer, self._seen = None, 0

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        n = len(context)
        if self._pointer is not None and n > self._seen:
            start = self._pointer + (n - self._seen)
        else:
            last = context[-1] if n else None
            start = next((i + 1 for i in range(n - 2, -1, -1) if context[i] == last), n)
        self._pointer, self._seen = start, n
        return [int(t) for t in context[start : start + max(k, 0)] if start < n]


class ReturnsGenerator(LookupDrafter):
    """``drafter.token-range``: returns a generator of ids, not a sequence.

    Shipped as: ``return (t for t in ...)`` in a drafter; iterating once works, so a naive
    check passes, but engines need ``len()`` and a second look (the decoder rejects it).
    """

    bug = "returns a generator"

    def propose(self, context: Sequence[int], k: int) -> object:  # type: ignore[override]
        return (t for t in lookup_continuation(context, k))


class ReadsPastContext(LookupDrafter):
    """``drafter.deterministic``: looks up in its own buffer, which still holds an older, longer context.

    Shipped as: a drafter that copies the context into a preallocated buffer and searches
    the whole buffer instead of the valid prefix, so text from an earlier (longer)
    generation is matched as if it were in the context.
    """

    bug = "searches a stale buffer past the end of the context"

    def __init__(self) -> None:
        super().__init__()
        self._buffer: list[int] = []

    def reset(self) -> None:
        pass  # the buffer is "overwritten" by the next context anyway (it is not: it may be shorter)

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        n = len(context)
        self._buffer[:n] = [int(t) for t in context]
        if k <= 0 or n < 1:
            return []
        last = self._buffer[n - 1]
        for start in range(len(self._buffer) - 2, -1, -1):
            if start != n - 1 and self._buffer[start] == last:
                return self._buffer[start + 1 : start + 1 + k]
        return []
