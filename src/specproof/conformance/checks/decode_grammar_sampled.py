"""Sampled decoding under a grammar: every emitted prefix valid, and the emitted tokens follow plain sampling
from the **grammar-masked** processed ``p`` (docs/contract.md, "Decode state", "Sampled runs").

Each example is one request: a prompt, one of the grammar check's grammars (``grammars()``), half the time
after a reasoning delimiter of 1-2 tokens taken from plain decoding's free continuation, maybe the
processors the engine declares, one of ``decode.sampled``'s sampling settings and ``GENERATIONS`` seeded
generations. The suite's drafter (``GrammarWalkDrafter``) drafts, from whatever the sampled output is so
far, the rest of the delimiter and then tokens the grammar allows: a sampled draft token is accepted with
probability ``p(x)``, so blocks are accepted, cut, and the matcher fed and rolled back in every run.

Every generation is judged three ways: each emitted prefix against a fresh matcher (a token the grammar
forbids fails at once, whatever the statistics), the matcher's state after every round where the engine
reports it, and every emitted token's randomized PIT value against the oracle's processed ``p`` (teacher
forcing with ``OracleProcessors``, the grammar last, then the sampling contract's processing), one
DKW-Massart test an example at ``alpha`` (``decode.sampled``'s false-fail bound split over the examples).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs
import numpy as np
from hypothesis import strategies as st

from specproof.conformance._pit import PitTest, pit_values
from specproof.conformance.checks.decode_grammar import draw_grammar_request
from specproof.conformance.checks.decode_sampled import SAMPLINGS, SampledDecodeExample
from specproof.conformance.checks.decode_state import DecodeSubject
from specproof.contract import DecodeParams, Generation, Grammar, Violation
from specproof.contract.decode_state import (
    OracleGrammar,
    first_invalid_token,
    plain_decode_with,
    scored_rows,
)
from specproof.contract.errors import InvalidSettingError, UnsupportedParameterError
from specproof.contract.sampling import processed_distribution

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._registry import Invariant

__all__ = [
    "GENERATIONS",
    "GrammarWalkDrafter",
    "check_grammar_sampled",
    "draw_grammar_sampled",
]

GENERATIONS = 16
"""Seeded generations per example: a third of ``decode.sampled``'s (grammar outputs are short, and the
prefix check judges every token exactly; the PIT test is there for the masked distribution)."""


def draw_grammar_sampled(data: st.DataObject, subject: DecodeSubject, *, alpha: float) -> SampledDecodeExample:
    request = draw_grammar_request(data, subject, most_new_tokens=16)
    prompt, n, base, grammar, eos = request.prompt, request.max_new_tokens, request.base, request.grammar, request.eos
    if data.draw(st.booleans(), label="reasoning delimiter"):
        free = plain_decode_with(subject.make_reference(), prompt, 4, decode=attrs.evolve(base, eos_token_ids=[eos]))
        text = [t for t in free.tokens if t != eos]
        if text:  # early in the free text, so that sampled runs reach it (and drafts carry it) often
            start = data.draw(st.integers(0, max(0, len(text) - 2)), label="delimiter starts at output position")
            length = data.draw(st.integers(1, min(2, len(text) - start)), label="delimiter length")
            grammar = attrs.evolve(grammar, reasoning_end=text[start : start + length])
    return SampledDecodeExample(
        generations=GENERATIONS,
        prompt=tuple(prompt),
        max_new_tokens=n,
        params=attrs.evolve(base, grammar=grammar, eos_token_ids=[eos]),
        sampling=data.draw(st.sampled_from(SAMPLINGS), label="sampling"),
        first_seed=data.draw(st.integers(0, 2**20), label="first seed"),
        alpha=alpha,
    )


class GrammarWalkDrafter:
    """Drafts after any output: the rest of the reasoning delimiter while the output is free, then tokens the
    grammar allows there (picked by a hash of the context and the position; an EOS id only once the grammar is
    complete), and in some rounds ends the draft with a token the grammar forbids (a sure rejection, whose
    replacement must come from the masked row). Deterministic in the context, so each seed's run has its own."""

    def __init__(self, prompt_length: int, grammar: Grammar, eos: frozenset[int], vocab_size: int) -> None:
        self.prompt_length, self.grammar, self.eos, self.vocab_size = prompt_length, grammar, eos, vocab_size
        self.committed: list[int] = []  # the output the matcher below holds (one generation's: it only grows)
        self.matcher = OracleGrammar(grammar, eos, vocab_size)

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        output = [int(t) for t in context[self.prompt_length :]]
        if output[: len(self.committed)] != self.committed:  # another output: start over
            self.committed, self.matcher = [], OracleGrammar(self.grammar, self.eos, self.vocab_size)
        try:
            for token in output[len(self.committed) :]:
                self.matcher.feed(token)
        except InvalidSettingError:  # the engine emitted a token the grammar forbids: the check names it
            self.committed, self.matcher = [], OracleGrammar(self.grammar, self.eos, self.vocab_size)
            return []
        self.committed = output
        walk = self.matcher.fork()
        forbidden_at = _hash(output) % (2 * k + 1)  # a forbidden token in about half the rounds
        draft: list[int] = []
        while len(draft) < k:
            token, allowed = self._next(walk, [*output, *draft], forbid=len(draft) == forbidden_at)
            draft.append(token)
            if not allowed or token in self.eos:
                break
            walk.feed(token)
        return draft

    def _next(self, walk: OracleGrammar, text: list[int], *, forbid: bool) -> tuple[int, bool]:
        """The next draft token and whether the grammar allows it there."""
        delimiter = self.grammar.reasoning_end
        if walk.state()["phase"] == "free":  # the longest tail of the text that begins the delimiter, then its rest
            done = max(m for m in range(len(delimiter)) if m == 0 or tuple(text[-m:]) == delimiter[:m])
            return delimiter[done], True
        allowed = walk.allowed()
        assert allowed is not None
        ids = [int(i) for i in np.flatnonzero(allowed != forbid) if int(i) not in self.eos]
        if not ids:
            return (sorted(self.eos)[0], True) if not forbid else self._next(walk, text, forbid=False)
        return ids[_hash(text) % len(ids)], not forbid


def _hash(tokens: Sequence[int]) -> int:
    return zlib.crc32(bytes(str(list(tokens)), "ascii"))


def _generate(subject: DecodeSubject, ex: SampledDecodeExample, seed: int) -> tuple[Generation, list[object]]:
    """One seeded generation on a fresh engine, and the processor states it reports per round (none: [])."""
    engine = subject.make_engine()
    if subject.takes_drafter:
        assert ex.params.grammar is not None
        eos = ex.params.eos_set(None)
        engine.drafter = GrammarWalkDrafter(len(ex.prompt), ex.params.grammar, eos, subject.vocab_size)
    gen = engine.generate(list(ex.prompt), ex.max_new_tokens, decode=ex.params, sampling=ex.sampling.with_seed(seed))
    if not isinstance(gen, Generation):
        raise TypeError(f"generate returned {type(gen).__name__}, not a Generation")
    states = getattr(engine, "processor_states", None)
    return gen, list(states) if isinstance(states, (list, tuple)) else []


def _state_breach(
    grammar: Grammar, eos: frozenset[int], vocab: int, tokens: Sequence[int], states: list[object]
) -> tuple[int, object, object] | None:
    """The first round whose reported matcher state is not a fresh matcher's fed the committed tokens (one
    oracle matcher fed along the output, as the rounds' committed lengths only grow)."""
    oracle, fed = OracleGrammar(grammar, eos, vocab), 0
    for rnd, state in enumerate(states):
        got = state.get("grammar") if isinstance(state, dict) else None
        generated = state.get("generated") if isinstance(state, dict) else None
        if got is None or not isinstance(generated, int) or not fed <= generated <= len(tokens):
            continue  # black-box: the engine reports no matcher state (or a count the output does not have)
        for token in tokens[fed:generated]:
            oracle.feed(int(token))
        fed = generated
        want = oracle.state()
        if got != want:
            return rnd, want, got
    return None


def _judge_prefixes(
    inv: Invariant, ex: SampledDecodeExample, vocab: int, run: tuple[Generation, list[object]], seed: int
) -> list[Violation]:
    """Each emitted prefix valid, and (where reported) the matcher after each round a fresh one's."""
    gen, states = run
    grammar, eos, example = ex.params.grammar, ex.params.eos_set(None), ex.to_json()
    assert grammar is not None
    at = first_invalid_token(grammar, eos, vocab, gen.tokens)
    if at is not None:
        text = (
            f"sampled (seed {seed}), output token {at} ({gen.tokens[at]}) is not allowed there by the "
            f"{grammar.kind} grammar"
        )
        return [inv.violation(text, actual=list(gen.tokens[: at + 1]), example=example)]
    breach = _state_breach(grammar, eos, vocab, gen.tokens, states)
    if breach is not None:
        rnd, want, got = breach
        text = (
            f"sampled (seed {seed}), after round {rnd} the engine's grammar matcher is not a fresh matcher fed the "
            "committed tokens (a rejected draft token kept, or a committed one missing)"
        )
        return [inv.violation(text, round=rnd, expected=want, actual=got, example=example)]
    return []


def check_grammar_sampled(
    inv: Invariant, subject: DecodeSubject, ex: SampledDecodeExample
) -> tuple[list[Violation], int, str]:
    """Every emitted prefix valid, the matcher per round a fresh one's, and the PIT values of every emitted
    token against the grammar-masked processed ``p`` uniform (DKW-Massart at ``alpha``)."""
    reference = subject.make_reference()  # one fresh copy, reset before each use (scored_rows resets it)
    test = PitTest(name=inv.id, alpha=ex.alpha)
    example = ex.to_json()
    constrained = 0  # generations that reached the grammar (past the delimiter, where there is one)
    for seed in ex.seeds:
        try:
            run = _generate(subject, ex, seed)
        except UnsupportedParameterError as exc:  # refusing is allowed (parameter parity): a skip with its reason
            return [], 0, f"the engine refused the request: {exc}"
        except Exception as exc:  # the check reports it as the engine's failure, naming the cause
            text = f"the sampled generation with a grammar (seed {seed}) failed: {type(exc).__name__}: {exc}"
            return [inv.violation(text, example=example)], 1, ""
        gen = run[0]
        if not gen.tokens:
            continue
        found = _judge_prefixes(inv, ex, subject.vocab_size, run, seed)
        if found:
            return found, 1, ""
        constrained += _reached_grammar(ex.params, gen.tokens)
        rows = scored_rows(reference, ex.prompt, gen.tokens, decode=ex.params, eos_token_id=None)
        test.add(pit_values(processed_distribution(rows, ex.sampling), list(gen.tokens), seed=seed))
        if test.rejected:
            text = (
                "sampled with a grammar, the emitted tokens do not follow plain sampling from the grammar-masked "
                f"processed p: {test.describe()}; {test.direction()}"
            )
            return [inv.violation(text, expected="PIT values uniform", actual=test.distance, example=example)], 1, ""
    if not constrained:
        return [], 0, "no sampled generation reached the grammar (its reasoning delimiter never came)"
    return [], test.tested, f"{constrained} of {GENERATIONS} generations constrained; {test.describe()}"


def _reached_grammar(params: DecodeParams, tokens: Sequence[int]) -> int:
    """1 when the output reached the constrained part (no delimiter, or the delimiter ended before its end)."""
    assert params.grammar is not None
    delimiter = params.grammar.reasoning_end
    if not delimiter:
        return 1
    n = len(delimiter)
    return int(any(tuple(tokens[i - n : i]) == delimiter for i in range(n, len(tokens))))
