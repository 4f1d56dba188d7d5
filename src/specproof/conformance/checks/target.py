"""Target invariants: shape, processed, chunk-invariance, causality, restore, checkpoints, capacity.

Every comparison is against a *fresh* target from the same factory fed the same
tokens with plain forwards — the trusted model of what the target computes.
``tolerance`` 0 means bit-for-bit (the reference target is exactly batch-invariant);
a real backend (fp16, BLAS kernels that differ between q=1 and q=K+1) states its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from specproof.contract import Violation, arrays_differ, states_differ
from specproof.engine import Target

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._registry import Invariant

__all__ = [
    "check_capacity",
    "check_causality",
    "check_checkpoints",
    "check_chunk_invariance",
    "check_processed",
    "check_restore",
    "check_shape",
    "compare_logits",
    "compare_states",
]

MakeTarget = Callable[[], Target]


def compare_logits(expected: np.ndarray, actual: np.ndarray, *, tolerance: float) -> str | None:
    """None when equal under the contract's policy (exact at 0, else ``|a - b| <= tolerance``); else what differs."""
    return arrays_differ(expected, actual, atol=tolerance, name="logits")


def compare_states(
    expected: Mapping[str, np.ndarray], actual: Mapping[str, np.ndarray], *, tolerance: float
) -> str | None:
    """Compare ``state_arrays()`` dicts (every array; names first); None when equal."""
    return states_differ(expected, actual, atol=tolerance)


def _prefilled(make: MakeTarget, prefix: Sequence[int]) -> Target:
    """A fresh target from ``make`` that has been fed ``prefix`` in one forward."""
    t = make()
    t.reset()
    if prefix:
        t.forward(list(prefix))
    return t


def _one_by_one(t: Target, tokens: Sequence[int]) -> np.ndarray:
    """Logit rows of ``tokens`` fed with one-token forwards (the plain-decoding reference)."""
    if not tokens:
        return np.zeros((0, t.vocab_size))
    return np.concatenate([np.asarray(t.forward([tok])) for tok in tokens])


def _fresh_logits(make: MakeTarget, prefix: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
    """Logits of ``tokens`` after ``prefix`` on a fresh target, one token per forward."""
    return _one_by_one(_prefilled(make, prefix), tokens)


def _ex(**kw: object) -> dict[str, object]:
    return {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in kw.items()}


def _if_differs(
    why: str | None, *, inv: Invariant, explanation: str, example: dict[str, object], round: int | None = None
) -> list[Violation]:
    """``[]`` when a comparison found nothing (``why`` is None), else one violation: ``explanation: why``."""
    if why is None:
        return []
    return [inv.violation(round=round, explanation=f"{explanation}: {why}", example=example)]


def check_shape(inv: Invariant, make: MakeTarget, prefix: Sequence[int], tokens: Sequence[int]) -> list[Violation]:
    t = make()
    t.reset()
    out: list[Violation] = []
    for what, feed in (("prefix", list(prefix)), ("tokens", list(tokens))):
        if not feed:
            continue
        logits = np.asarray(t.forward(feed))
        if logits.shape != (len(feed), t.vocab_size):
            out.append(
                inv.violation(
                    explanation=f"forward of {len(feed)} {what} returned the wrong shape",
                    expected=[len(feed), t.vocab_size],
                    actual=list(logits.shape),
                    example=_ex(prefix=prefix, tokens=tokens),
                )
            )
        elif not np.issubdtype(logits.dtype, np.floating) or not np.isfinite(logits).all():
            out.append(
                inv.violation(
                    explanation=f"forward of {len(feed)} {what} returned non-finite or non-float logits",
                    expected="finite floats",
                    actual=str(logits.dtype),
                    example=_ex(prefix=prefix, tokens=tokens),
                )
            )
        if out:
            break
    return out


def check_processed(inv: Invariant, make: MakeTarget, prefix: Sequence[int], tokens: Sequence[int]) -> list[Violation]:
    t = make()
    t.reset()
    ex = _ex(prefix=prefix, tokens=tokens)
    if t.processed != 0:
        return [
            inv.violation(
                explanation="processed is not 0 after reset()",
                expected=0,
                actual=t.processed,
                example=ex,
            )
        ]
    if prefix:
        t.forward(list(prefix))
    if t.processed != len(prefix):
        return [
            inv.violation(
                explanation=f"forward of {len(prefix)} tokens did not advance processed by {len(prefix)}",
                expected=len(prefix),
                actual=t.processed,
                example=ex,
            )
        ]
    snap = t.snapshot()
    t.forward(list(tokens))
    if t.processed != len(prefix) + len(tokens):
        return [
            inv.violation(
                explanation=f"forward of {len(tokens)} tokens did not advance processed by {len(tokens)}",
                expected=len(prefix) + len(tokens),
                actual=t.processed,
                example=ex,
            )
        ]
    t.restore(snap)
    if t.processed != len(prefix):
        return [
            inv.violation(
                explanation="restore did not set processed back to the snapshot's",
                expected=len(prefix),
                actual=t.processed,
                example=ex,
            )
        ]
    return []


def check_chunk_invariance(
    inv: Invariant,
    make: MakeTarget,
    prefix: Sequence[int],
    tokens: Sequence[int],
    chunks: Sequence[int],
    *,
    tolerance: float,
) -> list[Violation]:
    """One forward of all ``tokens`` == the same tokens in ``chunks`` == one-token forwards."""
    single = _fresh_logits(make, prefix, tokens)
    t = _prefilled(make, prefix)
    whole = np.asarray(t.forward(list(tokens)))
    found = _if_differs(
        compare_logits(single, whole, tolerance=tolerance),
        inv=inv,
        explanation=f"one forward of {len(tokens)} tokens differs from {len(tokens)} one-token forwards",
        example=_ex(prefix=prefix, tokens=tokens),
    )
    if found:
        return found
    t.reset()
    if prefix:
        t.forward(list(prefix))
    rows, pos = [], 0
    for size in chunks:
        piece = list(tokens[pos : pos + size])
        if not piece:
            break
        rows.append(np.asarray(t.forward(piece)))
        pos += len(piece)
    if pos < len(tokens):
        rows.append(np.asarray(t.forward(list(tokens[pos:]))))
    return _if_differs(
        compare_logits(single, np.concatenate(rows), tolerance=tolerance),
        inv=inv,
        explanation=f"chunked forwards {list(chunks)} differ from one-token forwards",
        example=_ex(prefix=prefix, tokens=tokens, chunks=chunks),
    )


def check_causality(
    inv: Invariant,
    make: MakeTarget,
    prefix: Sequence[int],
    tokens: Sequence[int],
    split: int,
    replacement: Sequence[int],
    *,
    tolerance: float,
) -> list[Violation]:
    """Rows before ``split`` must not change when the tokens from ``split`` on are replaced."""
    split = max(1, min(split, len(tokens)))
    other = [*tokens[:split], *replacement][: len(tokens)]
    if len(other) < len(tokens):
        other += list(tokens[len(other) :])
    a, b = _prefilled(make, prefix), _prefilled(make, prefix)
    ra = np.asarray(a.forward(list(tokens)))[:split]
    rb = np.asarray(b.forward(other))[:split]
    return _if_differs(
        compare_logits(ra, rb, tolerance=tolerance),
        inv=inv,
        explanation=f"rows before position {split} changed when later tokens changed",
        example=_ex(prefix=prefix, tokens=tokens, other=other),
    )


def check_restore(
    inv: Invariant,
    make: MakeTarget,
    prefix: Sequence[int],
    detour: Sequence[int],
    probe: Sequence[int],
    *,
    tolerance: float,
) -> list[Violation]:
    """snapshot after ``prefix``, feed ``detour``, restore, feed ``probe`` == fresh target fed prefix + probe."""
    expected = _fresh_logits(make, prefix, probe)
    t = _prefilled(make, prefix)
    snap = t.snapshot()
    t.forward(list(detour))
    t.restore(snap)
    actual = _one_by_one(t, probe)
    found = _if_differs(
        compare_logits(expected, actual, tolerance=tolerance),
        inv=inv,
        explanation="after restore, forwards differ from a fresh target fed the same prefix",
        example=_ex(prefix=prefix, detour=detour, probe=probe),
    )
    if found:
        return found
    # restoring twice to the same snapshot (a second rejected round) must work too
    t.restore(snap)
    again = _one_by_one(t, probe)
    return _if_differs(
        compare_logits(expected, again, tolerance=tolerance),
        inv=inv,
        explanation="a second restore of the same snapshot differs",
        example=_ex(prefix=prefix, detour=detour, probe=probe),
    )


def check_checkpoints(
    inv: Invariant,
    make: MakeTarget,
    prefix: Sequence[int],
    tokens: Sequence[int],
    probe: Sequence[int],
    *,
    tolerance: float,
) -> list[Violation]:
    """checkpoints[i] of a forward behaves as (and, white-box, equals) the snapshot after tokens[:i+1]."""
    t = make()
    fwc = getattr(t, "forward_with_checkpoints", None)
    if not callable(fwc):
        return []
    t.reset()
    if prefix:
        t.forward(list(prefix))
    _, cps = fwc(list(tokens))
    ex = _ex(prefix=prefix, tokens=tokens, probe=probe)
    if len(cps) != len(tokens):
        return [
            inv.violation(
                explanation=f"{len(cps)} checkpoints for a forward of {len(tokens)} tokens",
                expected=len(tokens),
                actual=len(cps),
                example=ex,
            )
        ]
    fresh = make()
    for i in reversed(range(len(tokens))):  # last first: restoring backwards is the engine's usage
        t.restore(cps[i])
        if t.processed != len(prefix) + i + 1:
            return [
                inv.violation(
                    round=i,
                    explanation=f"checkpoint {i} restores processed={t.processed}",
                    expected=len(prefix) + i + 1,
                    actual=t.processed,
                    example=ex,
                )
            ]
        fresh.reset()
        fresh.forward([*prefix, *tokens[: i + 1]])
        if hasattr(t, "state_arrays") and hasattr(fresh, "state_arrays"):
            found = _if_differs(
                compare_states(fresh.state_arrays(), t.state_arrays(), tolerance=tolerance),  # type: ignore[attr-defined]
                inv=inv,
                round=i,
                explanation=f"checkpoint {i} is not the state after {i + 1} tokens",
                example=ex,
            )
            if found:
                return found
        expected = _one_by_one(fresh, probe)
        actual = _one_by_one(t, probe)
        found = _if_differs(
            compare_logits(expected, actual, tolerance=tolerance),
            inv=inv,
            round=i,
            explanation=f"after restoring checkpoint {i}, forwards differ from the state after {i + 1} tokens",
            example=ex,
        )
        if found:
            return found
    return []


def check_capacity(
    inv: Invariant, make: MakeTarget, fill: Sequence[int], overflow: int, probe_token: int
) -> list[Violation]:
    """Fill to ``max_context - len(fill)``... then a forward past max_context must raise and change nothing.

    ``fill`` tokens are cycled to bring the target within ``overflow - 1`` tokens of
    full; a forward of ``overflow`` tokens must then raise.
    """
    t = make()
    t.reset()
    cap = t.max_context
    room = max(0, overflow - 1)
    target_len = cap - room
    feed = [fill[i % len(fill)] for i in range(target_len)]
    step = 512
    for start in range(0, len(feed), step):
        t.forward(feed[start : start + step])
    ex: dict[str, object] = {"max_context": cap, "processed": t.processed, "overflow": overflow}
    snap = t.snapshot()
    before = np.asarray(t.forward([probe_token])) if room >= 1 else None
    t.restore(snap)
    processed = t.processed
    try:
        t.forward([probe_token] * overflow)
    except Exception as exc:
        if t.processed != processed:
            return [
                inv.violation(
                    explanation=f"the failed forward changed processed ({exc!r})",
                    expected=processed,
                    actual=t.processed,
                    example=ex,
                )
            ]
        if before is not None:
            after = np.asarray(t.forward([probe_token]))
            return _if_differs(
                compare_logits(before, after, tolerance=0.0),
                inv=inv,
                explanation="the failed forward changed the state: the next forward differs",
                example=ex,
            )
        return []
    return [
        inv.violation(
            explanation=f"a forward of {overflow} tokens with {room} free slots (max_context={cap}) did not raise",
            expected="an error, state unchanged",
            actual=f"returned; processed={t.processed}",
            example=ex,
        )
    ]
