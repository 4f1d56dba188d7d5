"""The grammar check: an engine's output under a grammar against plain decoding with the same grammar
(docs/contract.md, "Decode state").

``draw_grammar_example`` draws a request with a grammar the vocabulary can write (``grammars()``: a JSON
schema, a regular expression, a Lark context-free grammar), an EOS id that stands for no text, maybe the
processors the engine declares, and maybe a reasoning delimiter placed on plain decoding's free
continuation (so that it ends at every offset of a draft block as the schedules vary); the suite's drafts
follow plain decoding's constrained output and run on past its end with the free continuation (tokens the
grammar forbids, and tokens after the grammar is complete). ``check_grammar`` judges every emitted prefix
against a fresh matcher, the output against plain decoding's, and, where the engine reports it, the
matcher's state after every round against a fresh matcher fed the committed tokens.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs
import numpy as np
from hypothesis import strategies as st

from specproof.conformance.checks.decode_state import (
    PROCESSOR_FEATURES,
    DecodeExample,
    DecodeRun,
    DecodeSubject,
    ScheduleDrafter,
    check_decode_output,
)
from specproof.contract import DecodeParams, Generation, Grammar, Violation, token_bytes
from specproof.contract.decode_state import OracleGrammar, first_invalid_token, grammar_state, plain_decode_with
from specproof.contract.errors import UnsupportedParameterError
from specproof.strategies import contexts, processor_configs

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._registry import Invariant

__all__ = [
    "grammars",
    "GrammarRun",
    "check_grammar",
    "draw_grammar_example",
    "grammar_eos",
    "run_grammar_example",
    "usable",
]

_COMPACT = {"whitespace_flexible": False}  # llguidance's JSON options: no free whitespace, so a schema ends


@functools.cache
def grammars() -> tuple[Grammar, ...]:
    """The grammars a request is drawn with: bounded, so that a random model completes them within 20 tokens (and
    the matcher terminates inside the search). Built on first use: a run that draws no grammar never loads
    llguidance or jsonschema."""
    return (
        Grammar.json_schema(
            {
                "type": "object",
                "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}},
                "required": ["a"],
                "additionalProperties": False,
                "x-guidance": _COMPACT,
            }
        ),
        Grammar.json_schema({"type": "array", "items": {"type": "boolean"}, "maxItems": 2, "x-guidance": _COMPACT}),
        Grammar(kind="regex", source="[0-9]{1,3}(,[0-9]{1,3}){0,2}"),
        Grammar(kind="lark", source='start: term (("+" | "-") term)?\nterm: /[0-9]{1,2}/ | "(" /[0-9]{1,2}/ ")"\n'),
    )


_NEEDS = b'{}[]":,0123456789aeflnrstu+-()'  # every byte grammars() write


def usable(vocab_size: int) -> bool:
    """Whether the vocabulary can write every byte the grammars use and has an id for EOS."""
    text = token_bytes(vocab_size)
    return set(_NEEDS) <= {t[0] for t in text if t} and grammar_eos(vocab_size) is not None


def grammar_eos(vocab_size: int) -> int | None:
    """The EOS id of a grammar request: the last id that stands for no text, else byte 0 (NUL)."""
    text = token_bytes(vocab_size)
    spare = [i for i, t in enumerate(text) if t is None]
    return spare[-1] if spare else (0 if text and text[0] == b"\x00" else None)


def _schedules(k: int) -> st.SearchStrategy[list[tuple[int, int]]]:
    """Per round, (draft length, right leading tokens), a wrong token as likely at each place as none: a block
    rejected after the matcher was fed part of it is what the rollback is judged on."""
    round_ = st.integers(0, k).flatmap(lambda length: st.tuples(st.just(length), st.integers(0, length)))
    return st.lists(round_, min_size=1, max_size=24)


@attrs.frozen
class GrammarRequest:
    """What ``decode.grammar`` and ``decode.grammar-sampled`` draw first, in the same order and labels (so
    their saved examples keep replaying): the prompt, ``max_new_tokens``, the processors and the grammar."""

    prompt: list[int]
    max_new_tokens: int
    base: DecodeParams
    grammar: Grammar
    eos: int | None


def draw_grammar_request(data: st.DataObject, subject: DecodeSubject, *, most_new_tokens: int) -> GrammarRequest:
    vocab = subject.vocab_size
    prompt = data.draw(contexts(vocab, min_size=1, max_size=min(subject.max_prompt, 16)), label="prompt")
    n = data.draw(st.integers(8, max(8, min(subject.max_new_tokens, most_new_tokens))), label="max_new_tokens")
    processors = subject.features & PROCESSOR_FEATURES - {"bad_words"}  # a ban could leave a grammar no token
    if not data.draw(st.booleans(), label="with processors"):
        processors = frozenset()
    base = data.draw(processor_configs(vocab, features=processors), label="processors")
    grammar = data.draw(st.sampled_from(grammars()), label="grammar")
    return GrammarRequest(list(prompt), n, base, grammar, grammar_eos(vocab))


def draw_grammar_example(data: st.DataObject, subject: DecodeSubject) -> DecodeExample:
    request = draw_grammar_request(data, subject, most_new_tokens=20)
    prompt, n, base, grammar, eos = request.prompt, request.max_new_tokens, request.base, request.grammar, request.eos
    if data.draw(st.booleans(), label="reasoning delimiter"):
        free = plain_decode_with(subject.make_reference(), prompt, n, decode=attrs.evolve(base, eos_token_ids=[eos]))
        text = [t for t in free.tokens if t != eos]
        if text:
            end = data.draw(st.integers(0, len(text) - 1), label="delimiter ends at output position")
            length = data.draw(st.integers(1, min(3, end + 1)), label="delimiter length")
            grammar = attrs.evolve(grammar, reasoning_end=text[end + 1 - length : end + 1])
    params = attrs.evolve(base, grammar=grammar, eos_token_ids=[eos])
    schedule = data.draw(_schedules(subject.k), label="draft schedule")
    return DecodeExample(
        kind="grammar",
        prompt=tuple(prompt),
        max_new_tokens=n,
        params=params,
        eos_token_id=None,
        schedule=tuple(schedule),
    )


class GrammarDrafter(ScheduleDrafter):
    """``ScheduleDrafter`` whose wrong token is, where there is one, another token the grammar allows there (so a
    draft token the matcher was fed gets rejected, and the matcher must be rolled back)."""

    def __init__(
        self,
        prompt_length: int,
        source: Sequence[int],
        schedule: Sequence[tuple[int, int]],
        vocab: int,
        alternatives: Sequence[int | None],
    ) -> None:
        super().__init__(prompt_length, source, schedule, vocab)
        self.alternatives = list(alternatives)

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        length, right = self.schedule[self.calls % len(self.schedule)]
        self.calls += 1
        pos = len(context) - self.prompt_length
        draft = self.source[pos : pos + min(length, k)]
        if right < len(draft):
            alt = self.alternatives[pos + right] if pos + right < len(self.alternatives) else None
            draft[right] = alt if alt is not None else (draft[right] + 1) % self.vocab
        return draft


def _alternatives(params: DecodeParams, vocab: int, output: Sequence[int]) -> list[int | None]:
    """Per output position, the first token the grammar allows there besides the output's own (None: none)."""
    assert params.grammar is not None
    eos = params.eos_set(None)
    oracle = OracleGrammar(params.grammar, eos, vocab)
    out: list[int | None] = []
    for token in output:
        allowed = oracle.allowed()
        others = [] if allowed is None else [int(i) for i in np.flatnonzero(allowed) if i != token and i not in eos]
        out.append(others[0] if others else None)
        oracle.feed(int(token))
    return out


@attrs.frozen(kw_only=True)
class GrammarRun(DecodeRun):
    vocab_size: int  # the matcher's vocabulary (the grammar reads token ids through ``token_bytes``)


def run_grammar_example(subject: DecodeSubject, ex: DecodeExample) -> GrammarRun:
    """The request on a fresh engine (the suite's drafter where it takes one), beside plain decoding with and
    without the grammar."""
    reference = subject.make_reference
    expected = plain_decode_with(reference(), ex.prompt, ex.max_new_tokens, decode=ex.params)
    baseline = plain_decode_with(
        reference(), ex.prompt, ex.max_new_tokens, decode=attrs.evolve(ex.params, grammar=None)
    )
    engine = subject.make_engine()
    if subject.takes_drafter:  # drafts run on past the end: forbidden tokens, and tokens after a complete grammar
        source = [*expected.tokens, *baseline.tokens]
        alternatives = _alternatives(ex.params, subject.vocab_size, expected.tokens)
        engine.drafter = GrammarDrafter(len(ex.prompt), source, ex.schedule, subject.vocab_size, alternatives)
    try:
        gen = engine.generate(list(ex.prompt), ex.max_new_tokens, eos_token_id=ex.eos_token_id, decode=ex.params)
        error = None if isinstance(gen, Generation) else f"generate returned {type(gen).__name__}, not a Generation"
    except UnsupportedParameterError as exc:  # a grammar the engine cannot honour, refused by name: a skip
        return GrammarRun(
            vocab_size=subject.vocab_size, example=ex, expected=expected, baseline=baseline, generation=None,
            error=None, states=None, refused=f"the engine refused the request: {exc}",
        )  # fmt: skip
    except Exception as exc:  # the check reports it as the engine's failure, naming the cause
        gen, error = None, f"{type(exc).__name__}: {exc}"
    states = getattr(engine, "processor_states", None)
    return GrammarRun(
        vocab_size=subject.vocab_size,
        example=ex,
        expected=expected,
        baseline=baseline,
        generation=gen if error is None else None,
        error=error,
        states=list(states) if isinstance(states, (list, tuple)) else None,
    )


def check_grammar(inv: Invariant, run: GrammarRun) -> tuple[list[Violation], int, str]:
    """Every emitted prefix is valid; the output equals plain decoding's with the grammar; the matcher's state
    after each round (where reported) equals a fresh matcher's fed the committed tokens."""
    example = run.example.to_json()
    params: DecodeParams = run.example.params
    grammar = params.grammar
    assert grammar is not None
    eos, vocab = params.eos_set(run.example.eos_token_id), run.vocab_size
    if run.refused is not None:
        return [], 0, run.refused
    gen = run.generation
    if gen is None:
        return [inv.violation(f"the generation with a grammar failed: {run.error}", example=example)], 1, ""
    at = first_invalid_token(grammar, eos, vocab, gen.tokens)
    if at is not None:
        text = f"output token {at} ({gen.tokens[at]}) is not allowed there by the {grammar.kind} grammar"
        return [inv.violation(text, actual=list(gen.tokens[: at + 1]), example=example)], 1, ""
    violations, exercised, note = check_decode_output(inv, run)
    if violations:
        return violations, max(exercised, 1), note
    mattered = run.expected.tokens != run.baseline.tokens
    exercised, note = int(mattered), "" if mattered else "the drawn grammar did not change plain decoding's output"
    for rnd, state in enumerate(run.states or ()):
        got = state.get("grammar") if isinstance(state, dict) else None
        generated = state.get("generated") if isinstance(state, dict) else None
        if got is None or not isinstance(generated, int):
            continue  # black-box: the engine reports no matcher state
        want = grammar_state(grammar, eos, vocab, gen.tokens[:generated])
        if got != want:
            text = (
                f"after round {rnd} the engine's grammar matcher is not a fresh matcher fed the {generated} committed "
                "tokens (a rejected draft token kept, or a committed one missing)"
            )
            return [inv.violation(text, round=rnd, expected=want, actual=got, example=example)], rnd + 1, ""
    return [], exercised, note
