"""Hypothesis strategies for byte-level stop strings (docs/contract.md, "Decode state", "Stop strings").

A stop string is matched on the text of the output, whatever the rounds that emitted it; a matcher
breaks where the string is longer than what it keeps of the text before a round, or where it reads the
prompt's text too. ``stop_string_sets`` draws the strings of one request on plain decoding's
continuation in one of ``STOP_STRING_SHAPES``, so each of those places is searched at quick, not left
to chance: the placed stop sequences as text (1-3 bytes, at any offset of a block, beside an EOS), one
string longer than a draft block (it straddles two or three rounds), or one that begins in the prompt's
last bytes (plain decoding does not stop there: the prompt's text never counts).
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

__all__ = ["STOP_STRING_SHAPES", "stop_string_sets"]

STOP_STRING_SHAPES: tuple[str, ...] = ("placed", "longer than a block", "begins in the prompt")
"""Where a request's stop strings lie on the continuation (see ``stop_string_sets``)."""


def _text(tokens: Sequence[int]) -> bytes:
    """The text of token ids on a byte vocabulary (an id past 256 has none)."""
    return bytes(int(t) for t in tokens if 0 <= int(t) < 256)


@st.composite
def stop_string_sets(
    draw: st.DrawFn, prompt: Sequence[int], continuation: Sequence[int], *, k: int, placed: Sequence[bytes]
) -> tuple[bytes, ...]:
    """Stop strings for a request whose plain continuation (no stops) is ``continuation``, drafts of up to ``k``.

    ``placed``: the strings of the placed stop sequences. ``longer than a block``: one string of ``k + 2`` to
    ``2k + 2`` bytes of the continuation ending at a drawn offset (more than a round emits, so its bytes come
    from two rounds or more), the placed ones beside it or not. ``begins in the prompt``: the prompt's last
    1-3 bytes and the continuation's first 1-3 bytes, beside the placed ones."""
    shape = draw(st.sampled_from(STOP_STRING_SHAPES), label="stop string shape")
    text = _text(continuation)
    if shape == "longer than a block" and len(text) > k + 1:
        length = draw(st.integers(k + 2, min(len(text), 2 * k + 2)), label="stop string length")
        end = draw(st.integers(length, len(text)), label="stop string ends after byte")
        long = text[end - length : end]
        return (long, *placed) if draw(st.booleans(), label="the placed strings too") else (long,)
    head = _text(prompt)
    if shape == "begins in the prompt" and head and text:
        before = draw(st.integers(1, min(3, len(head))), label="prompt bytes")
        after = draw(st.integers(1, min(3, len(text))), label="output bytes")
        return (*placed, head[-before:] + text[:after])
    return tuple(placed)
