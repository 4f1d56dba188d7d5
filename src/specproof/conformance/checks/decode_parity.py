"""The parameter parity check, for black-box engines: a decode parameter that changes plain decoding's output
must change the engine's output the same way, or the engine must refuse the request (docs/contract.md,
"Decode state", "Parameter parity").

Silently ignoring a parameter is the failure (vLLM #18902: ``frequency_penalty`` without effect under EAGLE;
#38467: ``logit_bias`` ignored under speculation). Each example sets one parameter alone, strong enough to
change plain decoding's output on the prompt (else it exercises nothing); it runs on every engine with a
model to decode plainly with, whether or not it declares ``decode_features``. An engine that raises on the
request refused it: not a failure, and not exercised either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hypothesis import strategies as st

from specproof.conformance.checks.decode_state import DecodeExample, DecodeSubject, ScheduleDrafter
from specproof.contract import DecodeParams, Generation, Violation
from specproof.contract.decode_state import plain_decode_with
from specproof.strategies import contexts, draft_schedules

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._registry import Invariant

__all__ = ["PARITY_PARAMETERS", "check_parameter_parity", "draw_parity_example"]

PARITY_PARAMETERS: tuple[str, ...] = (
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "logit_bias",
    "min_tokens",
)
"""The parameters the parity check sets, one at a time."""


def draw_parity_example(data: st.DataObject, subject: DecodeSubject) -> DecodeExample:
    """One parameter alone, with a value taken from plain decoding's free continuation so that it bites: a
    -100 bias on one of its tokens, ``min_tokens`` past an EOS id placed on it, or a strong penalty."""
    prompt = tuple(data.draw(contexts(subject.vocab_size, min_size=1, max_size=min(subject.max_prompt, 16)), "prompt"))
    n = data.draw(st.integers(8, max(8, min(subject.max_new_tokens, 20))), label="max_new_tokens")
    parameter = data.draw(st.sampled_from(PARITY_PARAMETERS), label="parameter")
    free = plain_decode_with(subject.make_reference(), prompt, n, decode=DecodeParams()).tokens
    at = data.draw(st.integers(0, len(free) - 1), label="at output position")
    eos = None
    if parameter == "logit_bias":
        params = DecodeParams(logit_bias={free[at]: -100.0})
    elif parameter == "min_tokens":
        params, eos = DecodeParams(min_tokens=free.index(free[at]) + 1), free[at]
    elif parameter == "repetition_penalty":
        params = DecodeParams(repetition_penalty=data.draw(st.sampled_from([4.0, 2.0]), label="value"))
    else:
        params = DecodeParams(**{parameter: data.draw(st.sampled_from([3.0, 1.5]), label="value")})
    schedule = tuple(data.draw(draft_schedules(k=subject.k), label="draft schedule"))
    return DecodeExample(  # its kind: the one parameter it sets
        kind=parameter, prompt=prompt, max_new_tokens=n, params=params, eos_token_id=eos, schedule=schedule
    )


def _run(subject: DecodeSubject, ex: DecodeExample, source: tuple[int, ...], **decode: Any) -> Generation:
    engine = subject.make_engine()
    if subject.takes_drafter:
        engine.drafter = ScheduleDrafter(len(ex.prompt), source, ex.schedule, subject.vocab_size)
    gen = engine.generate(list(ex.prompt), ex.max_new_tokens, eos_token_id=ex.eos_token_id, **decode)
    if not isinstance(gen, Generation):
        raise TypeError(f"generate returned {type(gen).__name__}, not a Generation")
    return gen


def check_parameter_parity(
    inv: Invariant, subject: DecodeSubject, ex: DecodeExample
) -> tuple[list[Violation], int, str]:
    """The engine's output with the parameter equals plain decoding's with it, or the engine refused it."""
    parameter, reference = ex.kind, subject.make_reference  # (a parity example's kind: the one parameter it sets)
    want = plain_decode_with(reference(), ex.prompt, ex.max_new_tokens, decode=ex.params, eos_token_id=ex.eos_token_id)
    plain = plain_decode_with(
        reference(), ex.prompt, ex.max_new_tokens, decode=DecodeParams(), eos_token_id=ex.eos_token_id
    )
    if (want.tokens, want.stop_reason) == (plain.tokens, plain.stop_reason):
        return [], 0, f"{parameter}={ex.params.to_json()[parameter]!r} did not change plain decoding's output"
    try:
        got = _run(subject, ex, want.tokens, decode=ex.params)
    except Exception as exc:  # a refusal: the engine said it does not honour the parameter
        return [], 0, f"the engine refused {parameter}: {type(exc).__name__}: {exc}"
    if (got.tokens, got.stop_reason) == (want.tokens, want.stop_reason):
        return [], 1, ""
    try:
        without = _run(subject, ex, plain.tokens).tokens
    except Exception:  # only the message depends on it
        without = None
    example = ex.to_json()
    if got.tokens == without:
        text = (
            f"{parameter} changes plain decoding's output, but the engine accepted it and its output is the same "
            "as without it (silently ignored, the vLLM #18902 class)"
        )
    else:
        at = next((i for i, (a, b) in enumerate(zip(want.tokens, got.tokens, strict=False)) if a != b), None)
        at = min(len(want.tokens), len(got.tokens)) if at is None else at
        text = (
            f"with {parameter} the engine's output differs from plain decoding's with it at token {at} "
            f"(expected {len(want.tokens)} tokens ending {want.stop_reason}, got {len(got.tokens)} ending "
            f"{got.stop_reason})"
        )
    return [inv.violation(text, expected=list(want.tokens), actual=list(got.tokens), example=example)], 1, ""
