"""Plain decoding's grammar matcher (the oracle's own small wrapper of llguidance; docs/contract.md,
"Decode state").

Fed one committed token at a time, as plain decoding commits them: while a reasoning grammar's delimiter
has not ended, the output is free; from the token after it, each token must be one the matcher allows. An
EOS id is never fed (it ends the output); a stopped matcher (the grammar is complete) allows only the EOS
ids, and is never asked for a mask. The engine keeps its own wrapper (``specproof.engine._grammar``): an
oracle must not share code with the subject it judges.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from specproof.contract._grammar import Grammar
from specproof.contract._vocab_bytes import token_bytes
from specproof.contract.errors import InvalidSettingError

if TYPE_CHECKING:  # imported where used: a run that draws no grammar never loads llguidance
    import llguidance

__all__ = ["OracleGrammar", "first_invalid_token", "grammar_state"]


class _VocabTokenizer:
    """What ``llguidance.TokenizerWrapper`` reads: each id's bytes (EOS and text-less ids special)."""

    bos_token_id = None

    def __init__(self, vocab_size: int, eos: tuple[int, ...]) -> None:
        text = token_bytes(vocab_size)
        self.eos_token_id = eos[0]
        self.special_token_ids = [i for i in range(vocab_size) if i in eos or text[i] is None]
        special = set(self.special_token_ids)
        self.tokens = [b"\xff[%d]" % i if i in special else text[i] or b"" for i in range(vocab_size)]
        self._ids = {tok[0]: i for i, tok in enumerate(self.tokens) if i not in special}

    def __call__(self, data: bytes) -> list[int]:
        return [self._ids[b] for b in data if b in self._ids]


@lru_cache(maxsize=32)
def _tokenizer(vocab_size: int, eos: tuple[int, ...]) -> llguidance.LLTokenizer:
    import llguidance

    wrapper = llguidance.TokenizerWrapper(_VocabTokenizer(vocab_size, eos))
    return llguidance.LLTokenizer(wrapper, n_vocab=vocab_size, eos_token=list(eos))


class OracleGrammar:
    """One request's grammar as plain decoding applies it."""

    def __init__(self, grammar: Grammar, eos: frozenset[int], vocab_size: int) -> None:
        if not eos:
            raise InvalidSettingError("decode grammar needs an EOS id to end on")
        self.eos, self.vocab_size, self.delimiter = eos, vocab_size, grammar.reasoning_end
        import llguidance

        self.matcher = llguidance.LLMatcher(
            _tokenizer(vocab_size, tuple(sorted(eos))), grammar.llguidance(), log_level=0
        )
        if self.matcher.is_error():
            raise InvalidSettingError(f"decode grammar does not compile: {self.matcher.get_error()}")
        self.free: list[int] | None = [] if self.delimiter else None  # the free text so far; None: constrained
        self.fed = 0

    def fork(self) -> OracleGrammar:
        """An independent copy at this point (a walk ahead that leaves this one as it is)."""
        twin = object.__new__(OracleGrammar)
        twin.eos, twin.vocab_size, twin.delimiter, twin.fed = self.eos, self.vocab_size, self.delimiter, self.fed
        twin.matcher = self.matcher.deep_copy()
        twin.free = None if self.free is None else list(self.free)
        return twin

    def allowed(self) -> np.ndarray | None:
        """Which ids may come next (a bool row), or None while the output is free text."""
        if self.free is not None:
            return None
        allowed = np.zeros(self.vocab_size, dtype=bool)
        if self.matcher.is_stopped():  # complete: only an EOS id may follow
            allowed[sorted(self.eos)] = True
            return allowed
        bits = np.unpackbits(np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        return bits[: self.vocab_size].astype(bool)

    def feed(self, token: int) -> None:
        if token in self.eos:
            return
        if self.free is not None:
            self.free.append(token)
            if tuple(self.free[-len(self.delimiter) :]) == self.delimiter:
                self.free = None
            return
        if self.matcher.is_stopped() or not self.matcher.consume_token(token):
            raise InvalidSettingError(f"token {token} is not allowed by the grammar after {self.fed} tokens")
        self.fed += 1

    def state(self) -> dict[str, object]:
        """The comparable state: the phase, how many tokens the matcher holds, whether it is complete, and the
        ids it allows next (None while free or complete)."""
        stopped = self.free is None and self.matcher.is_stopped()
        allowed = None if stopped else self.allowed()
        return {
            "phase": "free" if self.free is not None else "constrained",
            "fed": self.fed,
            "stopped": stopped,
            "allowed": None if allowed is None else [int(i) for i in np.flatnonzero(allowed)],
        }


def grammar_state(grammar: Grammar, eos: frozenset[int], vocab_size: int, output: Sequence[int]) -> dict[str, object]:
    """A fresh matcher's state after ``output`` (what an engine's matcher must equal after a round)."""
    oracle = OracleGrammar(grammar, eos, vocab_size)
    for token in output:
        oracle.feed(int(token))
    return oracle.state()


def first_invalid_token(grammar: Grammar, eos: frozenset[int], vocab_size: int, output: Sequence[int]) -> int | None:
    """The index of the first token of ``output`` the grammar does not allow there (an EOS id included, where
    the grammar is not complete), or None when every prefix of ``output`` is valid."""
    oracle = OracleGrammar(grammar, eos, vocab_size)
    for i, token in enumerate(output):
        allowed = oracle.allowed()
        if allowed is not None and not allowed[int(token)]:
            return i
        oracle.feed(int(token))
    return None
