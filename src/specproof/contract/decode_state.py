"""Decode state: the contract's own logits processors and stops, and plain decoding with them (the oracle).

docs/contract.md ("Decode state") is the reference. Lossless with ``DecodeParams`` means: the
output, and its stop reason, equal plain decoding's with the same processors; every processor's
state after a round equals ``OracleProcessors`` fed only the committed tokens.

This is the checks' oracle. The reference engine keeps an independent copy of the processor math
(``specproof.engine._processors``) on purpose: an oracle must not share code with the subject it
judges.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from specproof.contract._decode_params import DecodeParams
from specproof.contract._grammar_oracle import OracleGrammar, first_invalid_token, grammar_state
from specproof.contract._logprobs import TokenLogprob
from specproof.contract._protocols import Target
from specproof.contract._records import Generation, Stats, Step, StopReason
from specproof.contract.errors import InvalidSettingError, TokenRangeError

__all__ = [
    "ends_a_stop_string",
    "first_invalid_token",
    "grammar_state",
    "log_softmax",
    "OracleGrammar",
    "OracleProcessors",
    "plain_decode_with",
    "processor_state",
    "prompt_rows",
    "score_output",
    "scored_rows",
    "token_text",
    "top_alternatives",
]


def token_text(token: int) -> bytes:
    """A token's text on the byte vocabularies stop strings are judged on: id ``t < 256`` is the byte ``t``;
    any other id has none."""
    return bytes((token,)) if 0 <= token < 256 else b""


def ends_a_stop_string(output: Sequence[int], stop_strings: Sequence[bytes]) -> bool:
    """Whether the output's last token completes a stop string: one occurs in the output's text ending
    inside that token's bytes (the prompt's text never counts)."""
    if not output or not stop_strings:
        return False
    last = len(token_text(output[-1]))
    if last == 0:
        return False
    whole = b"".join(token_text(t) for t in output)
    before = len(whole) - last  # a match must end after this offset, inside the last token's bytes
    return any(whole.find(text, max(0, before - len(text) + 1)) != -1 for text in stop_strings)


def processor_state(output: Sequence[int]) -> dict[str, object]:
    """The comparable state of a request's processors after ``output`` (what an engine reports per round):
    how many tokens are out and each output token's count."""
    counts = Counter(int(t) for t in output)
    return {"generated": len(output), "counts": {str(t): counts[t] for t in sorted(counts)}}


class OracleProcessors:
    """One request's processors, fed one committed token at a time (the oracle's copy).

    ``apply(row)`` gives the processed logits of the next position, in the contract's order:
    repetition penalty, presence and frequency penalties, logit bias, bad words, ``min_tokens``, the grammar.
    """

    def __init__(
        self,
        params: DecodeParams,
        prompt: Sequence[int],
        *,
        eos_token_id: int | None = None,
        vocab_size: int | None = None,
    ) -> None:
        self.params = params
        self.eos = params.grammar_eos(eos_token_id)
        self.grammar: OracleGrammar | None = None
        if params.grammar is not None:
            if vocab_size is None:
                raise InvalidSettingError("OracleProcessors with a grammar needs the vocab_size")
            self.grammar = OracleGrammar(params.grammar, self.eos, vocab_size)
        self.seen = {int(t) for t in prompt}  # the repetition penalty counts the prompt too
        self.output: list[int] = []
        self.counts: Counter[int] = Counter()

    def feed(self, token: int) -> None:
        self.output.append(int(token))
        self.counts[int(token)] += 1
        self.seen.add(int(token))
        if self.grammar is not None:
            self.grammar.feed(int(token))

    def state(self) -> dict[str, object]:
        return processor_state(self.output)

    def apply(self, row: np.ndarray) -> np.ndarray:
        p = self.params
        out = np.array(row, dtype=np.float64)
        if p.repetition_penalty != 1.0:
            for t in self.seen:
                out[t] = out[t] / p.repetition_penalty if out[t] > 0 else out[t] * p.repetition_penalty
        for t, n in self.counts.items():
            out[t] -= p.frequency_penalty * n + p.presence_penalty
        for t, bias in p.logit_bias:
            out[t] += bias
        for word in p.bad_words:
            *before, banned = word
            tail = self.output[len(self.output) - len(before) :] if len(self.output) >= len(before) else None
            if not before or tail == before:
                out[banned] = -np.inf
        if len(self.output) < p.min_tokens:
            for t in self.eos:
                out[t] = -np.inf
        allowed = None if self.grammar is None else self.grammar.allowed()
        if allowed is not None:  # the grammar last: a token it forbids is out whatever the others did
            out[~allowed] = -np.inf
        if not np.isfinite(out).any():
            raise InvalidSettingError(f"the decode processors masked every token at output position {len(self.output)}")
        return out

    def stopped(self) -> StopReason | None:
        """``eos`` when the last output token is an EOS id, ``stop_sequence`` when the output ends with a stop."""
        if not self.output:
            return None
        if self.output[-1] in self.eos:
            return "eos"
        for seq in self.params.stop:
            if len(self.output) >= len(seq) and tuple(self.output[-len(seq) :]) == seq:
                return "stop_sequence"
        if ends_a_stop_string(self.output, self.params.stop_strings):
            return "stop_sequence"
        return None


def plain_decode_with(
    target: Target,
    prompt: Sequence[int],
    max_new_tokens: int,
    *,
    decode: DecodeParams,
    eos_token_id: int | None = None,
) -> Generation:
    """Plain greedy decoding with ``decode``'s processors and stops: the oracle a speculative engine's output
    (tokens and stop reason) must equal. One one-token forward per emitted token; the first maximum of the
    processed row wins a tie."""
    ctx = [int(t) for t in prompt]
    if not ctx or any(not 0 <= t < target.vocab_size for t in ctx):
        raise TokenRangeError(f"plain_decode_with: the prompt must be non-empty token ids in [0, {target.vocab_size})")
    decode.check_vocab(target.vocab_size)
    processors = OracleProcessors(decode, ctx, eos_token_id=eos_token_id, vocab_size=target.vocab_size)
    target.reset()
    if len(ctx) > 1:
        target.forward(ctx[:-1])
    steps: list[Step] = []
    stop: StopReason = "max_new_tokens"
    while len(processors.output) < max_new_tokens:
        if target.processed >= target.max_context:
            stop = "context_full"
            break
        base = target.processed
        row = processors.apply(np.asarray(target.forward([ctx[-1]]), dtype=np.float64)[0])
        token = int(np.argmax(row))
        steps.append(Step(base=base, draft=(), argmax=(token,), accepted=(token,), processed=target.processed))
        processors.feed(token)
        ctx.append(token)
        reason = processors.stopped()
        if reason is not None:
            stop = reason
            break
    n = len(processors.output)
    stats = Stats(rounds=n, emitted=n, prefill_forwards=int(len(prompt) > 1), verify_forwards=n)
    return Generation(tokens=processors.output, stop_reason=stop, steps=tuple(steps), stats=stats)


def log_softmax(row: np.ndarray) -> np.ndarray:
    """The processed row's log-probabilities (a masked token's is -inf), in float64."""
    z = np.asarray(row, dtype=np.float64)
    top = np.max(z)
    return z - (top + np.log(np.sum(np.exp(z - top))))


def top_alternatives(logprobs: np.ndarray, n: int) -> tuple[tuple[int, float], ...]:
    """The ``n`` most likely tokens of a row as (id, logprob), most likely first, the lower id first on a tie;
    a masked token (-inf) is never an alternative."""
    order = np.lexsort((np.arange(len(logprobs)), -logprobs))[:n]
    return tuple((int(t), float(logprobs[t])) for t in order if np.isfinite(logprobs[t]))


def score_output(
    target: Target,
    prompt: Sequence[int],
    output: Sequence[int],
    *,
    decode: DecodeParams,
    eos_token_id: int | None = None,
) -> tuple[TokenLogprob, ...]:
    """Teacher-forced scoring of ``output`` after ``prompt``: one forward of the whole text on a fresh model,
    each row processed with the processors fed the output before it, then log-softmax (docs/contract.md,
    "Decode state", "Logprobs"); ``decode.logprobs`` alternatives per position (0 when not asked)."""
    ctx = [int(t) for t in prompt]
    tokens = [int(t) for t in output]
    if not ctx or any(not 0 <= t < target.vocab_size for t in (*ctx, *tokens)):
        raise TokenRangeError(f"score_output: the prompt and output must be token ids in [0, {target.vocab_size})")
    rows = scored_rows(target, ctx, tokens, decode=decode, eos_token_id=eos_token_id)
    n = decode.logprobs or 0
    return tuple(
        TokenLogprob(token=token, logprob=float(row[token]), top=top_alternatives(row, n))
        for row, token in zip(rows, tokens, strict=True)
    )


def scored_rows(
    target: Target, prompt: Sequence[int], output: Sequence[int], *, decode: DecodeParams, eos_token_id: int | None
) -> np.ndarray:
    """``score_output``'s whole rows: ``[i, t]`` is token ``t``'s logprob at output position ``i``."""
    ctx, tokens = [int(t) for t in prompt], [int(t) for t in output]
    decode.check_vocab(target.vocab_size)
    if not tokens:
        return np.zeros((0, target.vocab_size))
    target.reset()
    rows = np.asarray(target.forward([*ctx, *tokens[:-1]]), dtype=np.float64)[len(ctx) - 1 :]
    processors = OracleProcessors(decode, ctx, eos_token_id=eos_token_id, vocab_size=target.vocab_size)
    out = np.empty_like(rows)
    for i, (row, token) in enumerate(zip(rows, tokens, strict=True)):
        out[i] = log_softmax(processors.apply(row))
        processors.feed(token)
    return out


def prompt_rows(target: Target, prompt: Sequence[int]) -> np.ndarray:
    """The prompt's teacher-forced scoring (docs/contract.md, "Decode state", "Prompt logprobs"): one forward
    of ``prompt[:-1]`` on a fresh model, log-softmax of each raw row; ``[i, t]`` is token ``t``'s logprob at
    prompt position ``i + 1``. No processor applies: they act on the output."""
    ctx = [int(t) for t in prompt]
    if not ctx or any(not 0 <= t < target.vocab_size for t in ctx):
        raise TokenRangeError(f"prompt_rows: the prompt must be non-empty token ids in [0, {target.vocab_size})")
    if len(ctx) == 1:
        return np.zeros((0, target.vocab_size))
    target.reset()
    rows = np.asarray(target.forward(ctx[:-1]), dtype=np.float64)
    return np.stack([log_softmax(row) for row in rows])
