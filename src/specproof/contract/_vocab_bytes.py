"""Which bytes each token id of a fixture's vocabulary stands for: the one map a grammar is matched through.

The byte-level fixtures (``trained``, ``trained_small``, the reference model's default config) have 256
ids, id ``i`` being byte ``i``. A smaller vocabulary (the zoo's 64 ids) stands for the first ids' worth of
``SMALL_ALPHABET``, printable characters chosen so that JSON, numbers and a small arithmetic language can be
written with them; ids past the alphabet (and past 256 in a larger vocabulary) stand for no text (special).
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["SMALL_ALPHABET", "token_bytes"]

SMALL_ALPHABET = b'{}[]":,0123456789 abcdefghijklmnopqrstuvwxyz.+-*/()<>=\n_'
"""What ids ``0 .. len-1`` of a vocabulary smaller than 256 stand for, in order."""


@lru_cache(maxsize=16)
def token_bytes(vocab_size: int) -> tuple[bytes | None, ...]:
    """The bytes of each id in ``[0, vocab_size)``; None for an id that stands for no text."""
    if vocab_size >= 256:
        return tuple(bytes([i]) if i < 256 else None for i in range(vocab_size))
    return tuple(SMALL_ALPHABET[i : i + 1] if i < len(SMALL_ALPHABET) else None for i in range(vocab_size))
