"""``contexts``: token sequences that drive drafters and targets into their edge cases.

Each kind is its own ``st.composite`` strategy, named after the kind so a failing
example's repr says which shape it was. ``contexts`` mixes them with ``st.one_of`` in
``CONTEXT_KINDS`` order, simplest first, because ``one_of`` shrinks toward its first
alternative: a failure found on source code shrinks, where it can, to a constant run.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from specproof.contract.errors import InvalidSettingError
from specproof.contract.validation import int_at_least
from specproof.strategies._corpus import corpus_bytes

__all__ = ["CONTEXT_KINDS", "contexts", "text_tokens"]

CONTEXT_KINDS: tuple[str, ...] = ("constant", "periodic", "copy_spans", "near_periodic", "random", "text")

_MAX_UNIT = 8  # longest period of a periodic context: n-gram drafters look back a few tokens
_MAX_SPAN = 16  # longest copied span


class StrategyArgumentError(InvalidSettingError, InvalidArgument):
    """A strategy's argument is invalid: specproof's ``InvalidSettingError`` and Hypothesis'
    ``InvalidArgument`` (what Hypothesis raises for its own strategies' arguments)."""


def check_kinds(kinds: Iterable[str] | None, *, known: tuple[str, ...], where: str) -> tuple[str, ...]:
    """The selected kinds in canonical (simplest-first) order; None selects all of them."""
    if kinds is None:
        return known
    if isinstance(kinds, str):
        raise StrategyArgumentError(f"{where}: kinds={kinds!r} must be a collection of kind names, not a string")
    try:
        chosen = list(kinds)
    except TypeError:
        raise StrategyArgumentError(f"{where}: kinds={kinds!r} must be a collection of kind names") from None
    if not chosen:
        raise StrategyArgumentError(f"{where}: kinds=[] selects nothing; known kinds: {', '.join(known)}")
    for name in chosen:
        if name not in known:
            raise StrategyArgumentError(f"{where}: unknown kind {name!r}; known kinds: {', '.join(known)}")
    return tuple(name for name in known if name in chosen)


@functools.lru_cache(maxsize=32)
def text_tokens(vocab_size: int) -> tuple[int, ...]:
    """The whole text corpus as token ids: its bytes, taken mod ``vocab_size`` when the vocabulary has < 256 ids.

    Cached per vocabulary size: strategies are rebuilt often (a state machine builds one per rule).
    """
    data = corpus_bytes()
    return tuple(data) if vocab_size >= 256 else tuple(b % vocab_size for b in data)


# --------------------------------------------------------------------------- kinds
# Every kind draws its length first, from [min_size, max_size]: lengths shrink toward min_size.


@st.composite
def constant_run(draw: Any, vocab_size: int, min_size: int, max_size: int) -> list[int]:
    """One token repeated: the drafter's best case (every n-gram matches). Shrinks toward ``[0] * min_size``."""
    n = draw(st.integers(min_size, max_size))
    token = draw(st.integers(0, vocab_size - 1))
    return [token] * n


@st.composite
def periodic(draw: Any, vocab_size: int, min_size: int, max_size: int) -> list[int]:
    """A short unit (1..8 tokens, at most half the length) repeated and cut to length.

    Shrinks toward a one-token unit of id 0, i.e. a constant run.
    """
    n = draw(st.integers(min_size, max_size))
    unit = draw(st.lists(st.integers(0, vocab_size - 1), min_size=1, max_size=max(1, min(_MAX_UNIT, n // 2))))
    return (unit * (n // len(unit) + 1))[:n]


@st.composite
def copy_spans(draw: Any, vocab_size: int, min_size: int, max_size: int) -> list[int]:
    """Random segments where later segments copy earlier spans (retrieval, code, chat templates).

    The first segment is fresh and at most half the length; the second is always a copy
    (so a context of 2+ tokens repeats something); after that each segment is a copy or
    fresh. Shrinks toward short fresh segments of id 0 and copies of the first span.
    """
    n = draw(st.integers(min_size, max_size))
    if n < 2:
        return draw(st.lists(st.integers(0, vocab_size - 1), min_size=n, max_size=n))
    fresh_len = draw(st.integers(1, max(1, min(_MAX_SPAN, n // 2))))
    out = draw(st.lists(st.integers(0, vocab_size - 1), min_size=fresh_len, max_size=fresh_len))
    op = "copy"
    while len(out) < n:  # every segment adds >= 1 token, so at most n iterations
        room = n - len(out)
        if op == "copy":
            start = draw(st.integers(0, len(out) - 1))
            length = draw(st.integers(1, min(_MAX_SPAN, len(out) - start, room)))
            out.extend(out[start : start + length])
        else:
            length = draw(st.integers(1, min(_MAX_SPAN, room)))
            out.extend(draw(st.lists(st.integers(0, vocab_size - 1), min_size=length, max_size=length)))
        op = draw(st.sampled_from(("copy", "fresh")))
    return out


@st.composite
def near_periodic(draw: Any, vocab_size: int, min_size: int, max_size: int) -> list[int]:
    """A periodic context with 1..max(1, n // 4) point mutations (each a *different* id).

    Drafts built from the period are right up to a mutation and wrong at it: partial
    acceptance. Shrinks toward one mutation (id + 1) at position 0 of a constant run.
    With a one-id vocabulary no mutation is possible and the context stays periodic.
    """
    out = draw(periodic(vocab_size, min_size, max_size))
    if not out or vocab_size < 2:
        return out
    for _ in range(draw(st.integers(1, max(1, len(out) // 4)))):
        pos = draw(st.integers(0, len(out) - 1))
        out[pos] = (out[pos] + draw(st.integers(1, vocab_size - 1))) % vocab_size
    return out


def uniform_random(vocab_size: int, min_size: int, max_size: int) -> st.SearchStrategy[list[int]]:
    """Independent uniform ids: drafts rarely match (rejection at position 0). Shrinks toward ``[0] * min_size``."""
    return st.lists(st.integers(0, vocab_size - 1), min_size=min_size, max_size=max_size)


@st.composite
def text(draw: Any, vocab_size: int, min_size: int, max_size: int) -> list[int]:
    """A window of real text (stdlib docstrings, then source) as byte tokens, mod ``vocab_size`` if < 256.

    Shrinks toward a short window at the start of the corpus (a docstring's first words).
    """
    tokens = text_tokens(vocab_size)
    n = draw(st.integers(min_size, min(max_size, len(tokens))))
    start = draw(st.integers(0, len(tokens) - n))
    return list(tokens[start : start + n])


_BUILDERS = {
    "constant": constant_run,
    "periodic": periodic,
    "copy_spans": copy_spans,
    "near_periodic": near_periodic,
    "random": uniform_random,
    "text": text,
}


def contexts(
    vocab_size: int, *, min_size: int = 1, max_size: int = 64, kinds: Iterable[str] | None = None
) -> st.SearchStrategy[list[int]]:
    """Token contexts of ``min_size..max_size`` ids in ``[0, vocab_size)``, a mixture of shapes.

    Kinds (``CONTEXT_KINDS``, simplest first): ``constant`` runs, ``periodic`` (a short
    unit repeated), ``copy_spans`` (later segments repeat earlier spans), ``near_periodic``
    (periodic with point mutations), ``random`` (uniform ids) and ``text`` (CPython
    standard-library docstrings and source as bytes, mod ``vocab_size`` when it is < 256).
    ``kinds`` selects a subset by name.

    Shrinking goes toward the first selected kind, then toward ``min_size`` tokens and
    small ids: a failing context shrinks to a short constant run where it can.
    """
    where = "contexts()"
    vocab_size = int_at_least(vocab_size, name="vocab_size", minimum=1, where=where, error=StrategyArgumentError)
    min_size = int_at_least(min_size, name="min_size", minimum=0, where=where, error=StrategyArgumentError)
    max_size = int_at_least(max_size, name="max_size", minimum=0, where=where, error=StrategyArgumentError)
    if max_size < min_size:
        raise StrategyArgumentError(f"{where}: max_size={max_size} must be >= min_size={min_size}")
    chosen = check_kinds(kinds, known=CONTEXT_KINDS, where=where)
    if "text" in chosen and len(text_tokens(vocab_size)) < min_size:
        raise StrategyArgumentError(
            f"{where}: min_size={min_size} is longer than the text corpus ({len(text_tokens(vocab_size))} tokens)"
        )
    return st.one_of(*(_BUILDERS[name](vocab_size, min_size, max_size) for name in chosen))
