"""The reference engine's grammar matcher, advanced through each draft and rolled back (docs/contract.md,
"Decode state").

Its own wrapper of llguidance, written apart from the oracle's (``specproof.contract._grammar_oracle``).
One matcher per request holds the committed output's constrained tokens. A verify forward asks
``row_mask`` for its rows in order: before row ``i`` the matcher is advanced through ``draft[i - 1]``;
past a draft token the grammar forbids (or an EOS id, or a complete grammar) the rest of the forward is
left unconstrained, as no later row can be accepted. ``settle`` rolls the matcher back to the emitted
tokens (llguidance's ``rollback``) and advances it by the rest of them. A stopped (complete) matcher is
never advanced and never asked for a mask: its rows allow the EOS ids only. With a reasoning delimiter
the output is free until the delimiter first ends, whether in the committed output or inside the draft.
Each decision is one method, so a zoo member changes exactly one.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from specproof.contract import Grammar, token_bytes
from specproof.contract.errors import SpecproofError

if TYPE_CHECKING:  # imported where used: a run that draws no grammar never loads llguidance
    import llguidance

__all__ = ["EngineGrammar"]


class _Vocabulary:
    """What ``llguidance.TokenizerWrapper`` reads: each id's bytes, the EOS ids and text-less ids special."""

    bos_token_id = None

    def __init__(self, vocab_size: int, eos: tuple[int, ...]) -> None:
        text = token_bytes(vocab_size)
        special = {i for i in range(vocab_size) if i in eos or text[i] is None}
        self.eos_token_id = eos[0]
        self.special_token_ids = sorted(special)
        self.tokens = [b"\xff<%d>" % i if i in special else text[i] or b"" for i in range(vocab_size)]
        self.ids = {t[0]: i for i, t in enumerate(self.tokens) if i not in special}

    def __call__(self, data: bytes) -> list[int]:
        return [self.ids[b] for b in data if b in self.ids]


@lru_cache(maxsize=32)
def _tokenizer(vocab_size: int, eos: tuple[int, ...]) -> llguidance.LLTokenizer:
    import llguidance

    wrapper = llguidance.TokenizerWrapper(_Vocabulary(vocab_size, eos))
    return llguidance.LLTokenizer(wrapper, n_vocab=vocab_size, eos_token=list(eos))


def _delimiter_end(tokens: Sequence[int], delimiter: tuple[int, ...]) -> int | None:
    """The index just past the delimiter's first occurrence in ``tokens``; 0 without a delimiter."""
    if not delimiter:
        return 0
    n = len(delimiter)
    for end in range(n, len(tokens) + 1):
        if tuple(tokens[end - n : end]) == delimiter:
            return end
    return None


class EngineGrammar:
    """One request's matcher: the committed output's constrained tokens, plus this forward's draft tokens."""

    def __init__(self, grammar: Grammar, eos: frozenset[int], vocab_size: int) -> None:
        self.delimiter = grammar.reasoning_end
        self.eos = frozenset(eos)
        self.eos_only = np.zeros(vocab_size, dtype=bool)
        self.eos_only[sorted(eos)] = True
        self.vocab_size = vocab_size
        import llguidance

        self.matcher = llguidance.LLMatcher(
            _tokenizer(vocab_size, tuple(sorted(eos))), grammar.llguidance(), log_level=0
        )
        self._check("compiling the grammar")
        self.committed = 0  # output tokens settled
        self.start: int | None = 0 if not self.delimiter else None  # where the committed constrained part begins
        self.fed: list[int] = []  # the tokens the matcher holds: committed ones, then this forward's draft ones
        self.settled_fed = 0  # how many of ``fed`` are committed
        self.scanned = 0  # history positions past ``committed`` this forward has looked at
        self.dead = False  # a draft token the grammar forbids (or an EOS) came: later rows are never accepted

    def _check(self, doing: str) -> None:
        if self.matcher.is_error():
            raise SpecproofError(f"the grammar matcher failed {doing}: {self.matcher.get_error().splitlines()[0]}")

    # ------------------------------------------------------------ one verify forward

    def row_mask(self, history: Sequence[int], *, draft_row: int) -> np.ndarray | None:
        """Which ids row ``draft_row`` allows, ``history`` being the committed output and the draft before the
        row; None: the row is unconstrained (free text, or past a token no later row can follow)."""
        if draft_row == 0:
            self.scanned, self.dead = 0, False
        start = self.start_in_forward(history)
        for pos in range(self.committed + self.scanned, len(history)):
            self.scanned += 1
            if self.dead or start is None or pos < start:
                continue
            if not self.advance(int(history[pos])):
                self.dead = True
        if self.dead or start is None or not self.constrains(draft_row):
            return None
        if self.matcher.is_stopped():  # complete: never ask a terminated matcher, only an EOS may follow
            return self.eos_only
        return self.mask()

    def constrained_from(self, history: Sequence[int]) -> int | None:
        """Where the constrained output begins in ``history`` (after the delimiter, wherever it ended)."""
        return _delimiter_end(history, self.delimiter)

    def start_in_forward(self, history: Sequence[int]) -> int | None:
        """Where the constrained output begins for a row: the delimiter may end inside the draft."""
        return self.constrained_from(history)

    def constrains(self, draft_row: int) -> bool:
        return True

    def advance(self, token: int) -> bool:
        """Feed one draft token if the grammar allows it next; False (nothing fed) when it does not, when it is
        an EOS id, or when the matcher is complete."""
        if token in self.eos or self.matcher.is_stopped():
            return False
        if self.matcher.try_consume_tokens([token]) != 1:
            return False
        self.fed.append(token)
        return True

    def mask(self) -> np.ndarray:
        self._check("before a mask")
        bits = np.unpackbits(np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        return bits[: self.vocab_size].astype(bool)

    # ------------------------------------------------------------ the round's outcome

    def settle(self, output: Sequence[int], *, draft: Sequence[int]) -> None:
        """Bring the matcher to the committed ``output`` (this round's emitted tokens included): roll back the
        draft tokens fed past the emitted ones, then feed the emitted tokens it does not hold yet."""
        start = self.constrained_from(output)
        wanted = [] if start is None else [int(t) for t in output[start:] if int(t) not in self.eos]
        same = self.settled_fed
        while same < len(self.fed) and same < len(wanted) and self.fed[same] == wanted[same]:
            same += 1
        self.rewind(len(self.fed) - same)
        for token in wanted[len(self.fed) :]:
            self.commit_token(token)
        self.committed, self.settled_fed, self.scanned, self.start = len(output), len(self.fed), 0, start

    def rewind(self, n: int) -> None:
        """Roll the matcher back by the ``n`` rejected draft tokens it holds."""
        if n > 0:
            if not self.matcher.rollback(n):
                self._check(f"rolling back {n} tokens")
                raise SpecproofError(f"the grammar matcher could not roll back {n} of its {len(self.fed)} tokens")
            del self.fed[len(self.fed) - n :]

    def commit_token(self, token: int) -> None:
        if self.matcher.is_stopped() or not self.matcher.consume_token(token):
            self._check(f"feeding committed token {token}")
            raise SpecproofError(f"the grammar does not allow committed token {token} after {len(self.fed)} tokens")
        self.fed.append(token)

    def state(self) -> dict[str, object]:
        """The matcher's state in the contract's format (``grammar_state``)."""
        free = self.start is None
        stopped = not free and self.matcher.is_stopped()
        allowed = None if free or stopped else self.mask()
        return {
            "phase": "free" if free else "constrained",
            "fed": len(self.fed),
            "stopped": stopped,
            "allowed": None if allowed is None else [int(i) for i in np.flatnonzero(allowed)],
        }
