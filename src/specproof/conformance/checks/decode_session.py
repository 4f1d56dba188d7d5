"""``decode.session``: the requests of a session on ONE engine, each with its own ``DecodeParams``, each equal
to plain decoding with its own parameters (docs/contract.md, "Decode state").

A request's processors start fresh: its presence and frequency penalties count its own output only, its
repetition penalty its own prompt and output (a user turn's prompt holds the earlier output, so there the
earlier tokens count as prompt, as plain decoding over that prompt counts them), its ``min_tokens`` and stops
its own output. A penalty buffer, a ``min_tokens`` count or a stop matcher carried over from the previous
request of the session (the per-call state kept on the engine between calls) shows as a later request that
differs from plain decoding. A fresh engine per example; the session's requests are drawn by relation to the
one before (a new prompt, a user turn on the last context, the last prompt again, a new prompt after
``reset()`` where the engine has one). The oracle is ``specproof.contract.decode_state`` on a fresh copy of
the model, never the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
from hypothesis import strategies as st

from specproof.conformance.checks.decode_state import PROCESSOR_FEATURES, DecodeSubject, ScheduleDrafter
from specproof.contract import DecodeParams, Generation, Violation
from specproof.contract.decode_state import plain_decode_with
from specproof.contract.errors import UnsupportedParameterError
from specproof.strategies import contexts, draft_schedules, processor_configs, stop_sets

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._registry import Invariant

__all__ = ["RELATIONS", "DecodeSessionExample", "SessionTurn", "check_decode_session", "draw_decode_session"]

RELATIONS: tuple[str, ...] = ("new_prompt", "user_turn", "regenerate", "after_reset")
"""A request's relation to the one before (the first is always a new prompt)."""

_LATER = ("user_turn", "regenerate", "after_reset", "new_prompt")
_MAX_REQUESTS = 4
_STOP_KINDS = (("stops", "stop_sequences"), ("min_tokens", "min_tokens"))  # stop_sets' kind, the feature
_MAX_TURN = 4  # tokens of a user turn


@attrs.frozen(kw_only=True)
class SessionTurn:
    """One request of the session, with plain decoding's answer to it (drawn with it: the next request's
    user turn goes on from it)."""

    relation: str
    prompt: tuple[int, ...]
    max_new_tokens: int
    params: DecodeParams
    eos_token_id: int | None
    schedule: tuple[tuple[int, int], ...]
    expected: Generation = attrs.field(eq=False, repr=False)
    source: tuple[int, ...] = attrs.field(eq=False, repr=False)  # what the suite's drafts follow

    def to_json(self) -> dict[str, object]:
        return {
            "relation": self.relation,
            "prompt": list(self.prompt),
            "max_new_tokens": self.max_new_tokens,
            "eos_token_id": self.eos_token_id,
            "decode": self.params.to_json(),
            "draft_schedule": [list(r) for r in self.schedule],
        }


@attrs.frozen(kw_only=True)
class DecodeSessionExample:
    turns: tuple[SessionTurn, ...]

    def to_json(self, failing: int | None = None) -> dict[str, object]:
        data: dict[str, object] = {"session": [t.to_json() for t in self.turns]}
        if failing is not None:
            data["failing_request"] = failing
            data["decode"] = self.turns[failing].params.to_json()
        return data


def _prompt(data: st.DataObject, subject: DecodeSubject, relation: str, last: SessionTurn | None) -> list[int]:
    vocab = subject.vocab_size
    if last is None or relation in ("new_prompt", "after_reset"):
        drawn = data.draw(contexts(vocab, min_size=1, max_size=min(subject.max_prompt, 12)), label="prompt")
        return [int(t) for t in drawn]
    if relation == "regenerate":
        return list(last.prompt)
    turn = data.draw(contexts(vocab, min_size=1, max_size=_MAX_TURN), label="user turn")
    return [*last.prompt, *last.expected.tokens, *(int(t) for t in turn)]


def draw_decode_session(data: st.DataObject, subject: DecodeSubject) -> DecodeSessionExample:
    """2-4 requests, each with every processor the engine declares on (strengths drawn afresh per request) and,
    half the time where it declares them, stop sequences and EOS ids or a ``min_tokens`` against an EOS id
    placed on its own plain continuation."""
    processors = subject.features & PROCESSOR_FEATURES
    count = data.draw(st.integers(2, _MAX_REQUESTS), label="requests")
    turns: list[SessionTurn] = []
    for i in range(count):
        # a user turn first: failures shrink toward one, where the earlier output is this request's prompt
        relation = "new_prompt" if i == 0 else data.draw(st.sampled_from(_LATER), label="relation")
        prompt = _prompt(data, subject, relation, turns[-1] if turns else None)
        n = data.draw(st.integers(6, max(6, min(subject.max_new_tokens, 10))), label="max_new_tokens")
        params: DecodeParams = data.draw(processor_configs(subject.vocab_size, features=processors, active=True))
        free = plain_decode_with(subject.make_reference(), prompt, n, decode=params)
        eos = None
        declared = [kind for kind, name in _STOP_KINDS if name in subject.features]
        with_stops: bool = bool(declared) and data.draw(st.booleans(), label="stops")
        if with_stops:
            kind = data.draw(st.sampled_from(declared), label="stop kind")
            params, eos = data.draw(stop_sets(params, free.tokens, kind=kind), label="stops")
        expected = plain_decode_with(subject.make_reference(), prompt, n, decode=params, eos_token_id=eos)
        source = free.tokens if tuple(free.tokens[: len(expected.tokens)]) == expected.tokens else expected.tokens
        schedule = data.draw(draft_schedules(k=subject.k, rounds=8), label="draft schedule")
        turns.append(
            SessionTurn(
                relation=relation, prompt=tuple(prompt), max_new_tokens=n, params=params, eos_token_id=eos,
                schedule=tuple(schedule), expected=expected, source=tuple(source),
            )
        )  # fmt: skip
    return DecodeSessionExample(turns=tuple(turns))


def _leak_reachable(before: SessionTurn, turn: SessionTurn) -> bool:
    """Whether state carried from ``before`` could show in ``turn``: ``before`` committed tokens and ``turn``
    has a processor on that counts them (penalties, a bias or bad words; its stops are judged as well)."""
    return bool(before.expected.tokens) and bool(turn.params.features() & PROCESSOR_FEATURES)


def check_decode_session(
    inv: Invariant, subject: DecodeSubject, example: DecodeSessionExample
) -> tuple[list[Violation], int, str]:
    """Each request's tokens and stop reason equal plain decoding's with its own parameters, on one engine.
    Exercised: the requests after the first with a processor on, after a request that emitted tokens."""
    engine = subject.make_engine()
    exercised = 0
    for i, turn in enumerate(example.turns):
        if turn.relation == "after_reset" and callable(getattr(engine, "reset", None)):
            engine.reset()
        if subject.takes_drafter:
            engine.drafter = ScheduleDrafter(len(turn.prompt), turn.source, turn.schedule, subject.vocab_size)
        where = f"request {i} of the session ({turn.relation}, after {i} earlier request(s) on the same engine)"
        try:
            gen = engine.generate(
                list(turn.prompt), turn.max_new_tokens, eos_token_id=turn.eos_token_id, decode=turn.params
            )
        except UnsupportedParameterError as exc:  # refusing is allowed (decode.parameter-parity's rule)
            return [], exercised, f"the engine refused {where}: {exc}"
        except Exception as exc:  # the engine's failure, named
            text = f"{where} failed: {type(exc).__name__}: {exc}"
            return [inv.violation(text, example=example.to_json(i))], exercised + 1, ""
        want, got = list(turn.expected.tokens), list(getattr(gen, "tokens", ()))
        if got != want or gen.stop_reason != turn.expected.stop_reason:
            at = next((j for j, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), min(len(want), len(got)))
            text = (
                f"{where} differs from plain decoding with its own decode parameters at output token {at} "
                f"(expected {len(want)} tokens ending {turn.expected.stop_reason}, got {len(got)} ending "
                f"{gen.stop_reason}): processor state carried over from an earlier request?"
            )
            return [inv.violation(text, expected=want[at:], actual=got[at:], example=example.to_json(i))], 1, ""
        if i > 0 and _leak_reachable(example.turns[i - 1], turn):
            exercised += 1
    note = "" if exercised else "no later request of the session had a processor on after a request that emitted tokens"
    return [], exercised, note
