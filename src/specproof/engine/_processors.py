"""The reference engine's logits processors and stops, per draft position (docs/contract.md, "Decode state").

This is the engine's own copy of the processor math, written separately from the contract's
``specproof.contract.decode_state`` on purpose: the checks judge the engine with that module, and an
oracle must not share code with its subject.

A verify forward's row ``i`` is processed with the state advanced through ``draft[:i]`` (on a
scratch copy); only the tokens a round emits are committed, so a rejection needs no undo: the
committed state is the checkpoint, and the scratch copy is dropped. Each decision is one method, so
a variant (or a zoo member) changes exactly one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specproof.contract import DecodeParams, StopReason, TokenLogprob
from specproof.contract.errors import InvalidSettingError
from specproof.engine._grammar import EngineGrammar

__all__ = ["RequestProcessors"]


class RequestProcessors:
    """One request's processors: ``params``, the call's prompt and EOS ids, and the committed output."""

    grammar_class: type[EngineGrammar] = EngineGrammar

    def __init__(self, params: DecodeParams, prompt: Sequence[int], eos: frozenset[int], vocab_size: int) -> None:
        self.params = params
        self.eos = np.array(sorted(eos), dtype=np.int64)
        self.vocab_size = vocab_size
        self.in_prompt = np.zeros(vocab_size, dtype=bool)
        self.in_prompt[np.asarray(list(prompt), dtype=np.int64)] = True
        self.output: list[int] = []  # the committed output (stops, bad words, min_tokens)
        self.counted: list[int] = []  # the penalty buffer: the committed output, once per token
        self.finished: StopReason | None = None
        bias = np.zeros(vocab_size)
        for token, value in params.logit_bias:
            bias[token] += value
        self.bias = bias
        self.grammar = None if params.grammar is None else self.grammar_class(params.grammar, eos, vocab_size)

    @classmethod
    def for_call(
        cls, decode: DecodeParams | None, context: Sequence[int], eos_token_id: int | None, vocab_size: int
    ) -> RequestProcessors | None:
        """One call's processors over the context so far, checked before any forward; None without ``decode``."""
        if decode is None:
            return None
        if not isinstance(decode, DecodeParams):
            raise InvalidSettingError(f"decode={decode!r} must be a DecodeParams or None")
        decode.check_vocab(vocab_size)
        return cls(decode, context, decode.grammar_eos(eos_token_id), vocab_size)

    # ------------------------------------------------------------ one position

    def process(self, row: np.ndarray, ahead: Sequence[int], *, draft_row: int = 0) -> np.ndarray:
        """Row of logits after the processors, for the position after the committed output and ``ahead`` (the
        draft tokens before this row); ``draft_row``: the row's index in the verify forward."""
        p = self.params
        z = np.asarray(row, dtype=np.float64).copy()
        history = [*self.output, *ahead]
        counts = np.bincount(np.asarray([*self.counted, *ahead], dtype=np.int64), minlength=self.vocab_size)
        if p.repetition_penalty != 1.0:
            seen = self.in_prompt | (counts > 0)
            z = np.where(seen, np.where(z > 0, z / p.repetition_penalty, z * p.repetition_penalty), z)
        z = z - (p.frequency_penalty * counts + p.presence_penalty * (counts > 0))  # one subtraction, as the contract
        z = self.apply_bias(z, draft_row=draft_row)
        for word in p.bad_words:
            head = list(word[:-1])
            if not head or list(history[len(history) - len(head) :]) == head:
                z[word[-1]] = -np.inf
        if self.masks_eos(len(history), draft_row=draft_row):
            z[self.eos] = -np.inf
        allowed = None if self.grammar is None else self.grammar.row_mask(history, draft_row=draft_row)
        if allowed is not None:  # the grammar last (docs/contract.md, "Decode state")
            z[~allowed] = -np.inf
        return z

    def apply_bias(self, z: np.ndarray, *, draft_row: int) -> np.ndarray:
        return z + self.bias

    def masks_eos(self, generated: int, *, draft_row: int) -> bool:
        """``min_tokens``: EOS is masked while fewer than that many tokens are out."""
        return generated < self.params.min_tokens

    # ------------------------------------------------------------ one verify forward

    def verify_rows(self, logits: np.ndarray, draft: Sequence[int]) -> np.ndarray:
        """Each row of a verify forward processed with the state advanced through the draft before it."""
        rows = np.empty(logits.shape, dtype=np.float64)
        for i in range(logits.shape[0]):
            rows[i] = self.process(logits[i], draft[:i], draft_row=i)
        return rows

    def cut(self, emitted: Sequence[int]) -> tuple[list[int], StopReason | None]:
        """``emitted`` cut after its first stop (an EOS id, or a stop sequence ending there, which may
        have begun in an earlier round) and that stop's reason."""
        tail = list(self.output)
        for i, token in enumerate(emitted):
            tail.append(int(token))
            reason = self.stop_at(tail)
            if reason is not None:
                return list(emitted[: i + 1]), reason
        return list(emitted), None

    def stop_at(self, output: Sequence[int]) -> StopReason | None:
        if output[-1] in self.eos:
            return "eos"
        if any(len(output) >= len(seq) and tuple(output[-len(seq) :]) == seq for seq in self.params.stop):
            return "stop_sequence"
        if self.params.stop_strings and self.completes_string(output):
            return "stop_sequence"
        return None

    def completes_string(self, output: Sequence[int]) -> bool:
        """A stop string ends with the last token's byte (a byte vocabulary: id ``t < 256`` is the byte ``t``,
        one byte a token, so the text ends with it exactly when the last token completes it)."""
        if output[-1] >= 256:
            return False
        text = bytes(int(t) for t in output if int(t) < 256)
        return any(text.endswith(stop) for stop in self.params.stop_strings)

    def commit(self, emitted: Sequence[int], *, draft: Sequence[int]) -> None:
        """Advance the committed state by the round's emitted tokens (never a rejected draft token)."""
        self.output.extend(int(t) for t in emitted)
        self.counted.extend(int(t) for t in emitted)

    def settle(self, emitted: Sequence[int], *, draft: Sequence[int]) -> list[int]:
        """The round's output after the stops, committed; ``finished`` says why the request ended, if it did."""
        kept, reason = self.cut(emitted)
        self.commit(kept, draft=draft)
        if self.grammar is not None:  # rolled back to the emitted tokens, advanced by the rest
            self.grammar.settle(self.output, draft=draft)
        self.finished = reason
        return kept

    # ------------------------------------------------------------ logprobs

    def score(self, rows: np.ndarray, emitted: Sequence[int], *, raw: np.ndarray, q: np.ndarray) -> list[TokenLogprob]:
        """The emitted tokens' logprobs: row ``i`` of the processed verify forward (``rows``) scores
        ``emitted[i]``, after the processors and before any sampling transform; ``raw`` (the rows before the
        processors) and ``q`` (the draft's rows) are what a wrong engine would score from instead."""
        n = self.params.logprobs or 0
        scored = []
        for i, token in enumerate(emitted):
            logprobs = _log_probabilities(rows[i])
            scored.append(TokenLogprob(token=token, logprob=float(logprobs[token]), top=_top(logprobs, n)))
        return scored

    def score_prompt(self, rows: np.ndarray, prompt: Sequence[int]) -> list[TokenLogprob]:
        """The prompt's logprobs: row ``i`` of the prefill (``prompt[:-1]`` forwarded) scores ``prompt[i + 1]``,
        before any processor (they act on the output); ``prompt_logprobs`` alternatives each."""
        n = self.params.prompt_logprobs or 0
        scored = []
        for i, token in enumerate(prompt[1:]):
            logprobs = _log_probabilities(np.asarray(rows[i], dtype=np.float64))
            scored.append(TokenLogprob(token=int(token), logprob=float(logprobs[token]), top=_top(logprobs, n)))
        return scored

    def state(self) -> dict[str, object]:
        """The processors' state in the contract's format: the output length and each output token's count."""
        values, counts = np.unique(np.asarray(self.counted, dtype=np.int64), return_counts=True)
        state: dict[str, object] = {
            "generated": len(self.output),
            "counts": {str(int(v)): int(c) for v, c in zip(values, counts)},
        }
        if self.grammar is not None:  # the matcher's, beside the counts (contract: grammar_state)
            state["grammar"] = self.grammar.state()
        return state


def _log_probabilities(row: np.ndarray) -> np.ndarray:
    shifted = row - np.max(row)
    return shifted - np.log(np.exp(shifted).sum())


def _top(logprobs: np.ndarray, n: int) -> tuple[tuple[int, float], ...]:
    """The ``n`` most likely tokens, most likely first, ties by the lower id; masked tokens left out."""
    if n == 0:
        return ()
    ranked = sorted(range(len(logprobs)), key=lambda t: (-logprobs[t], t))[:n]
    return tuple((t, float(logprobs[t])) for t in ranked if logprobs[t] > -np.inf)
