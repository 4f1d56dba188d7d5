"""``decode.prompt-logprobs``: each prompt token's logprob after the ones before it, as the engine returns them
(``DecodeParams(prompt_logprobs=n)``, ``Generation.prompt_logprobs``), against the teacher-forced scoring of
the prompt on a fresh copy of the model (docs/contract.md, "Decode state", "Prompt logprobs").

One per prompt token after the first, aligned with the prompt (the same id at the same place), within
``LOGPROB_TOLERANCE`` of ``prompt_rows`` (the raw rows: no processor applies to the prompt), with ``n`` top
alternatives. The request also carries every processor the engine declares, so an engine that processes the
prompt's rows fails, and its output is judged as ``decode.logprobs`` judges it (a prompt-logprobs request
must not change the output). An engine that does not declare ``prompt_logprobs`` skips the check, saying so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
from hypothesis import strategies as st

from specproof.conformance.checks.decode_logprobs import top_problem
from specproof.conformance.checks.decode_state import (
    PROCESSOR_FEATURES,
    DecodeExample,
    DecodeRun,
    DecodeSubject,
    check_decode_output,
)
from specproof.contract import LOGPROB_TOLERANCE, Violation
from specproof.contract.decode_state import prompt_rows
from specproof.strategies import contexts, draft_schedules, processor_configs

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._registry import Invariant

__all__ = ["check_prompt_logprobs", "draw_prompt_logprobs"]


def draw_prompt_logprobs(data: st.DataObject, subject: DecodeSubject) -> DecodeExample:
    """A prompt of 2-16 tokens, 4-8 new ones, every declared processor on, 0-3 alternatives where the engine
    declares ``top_logprobs``, and a draft schedule."""
    prompt = data.draw(contexts(subject.vocab_size, min_size=2, max_size=max(2, min(subject.max_prompt, 16))))
    n = data.draw(st.integers(4, max(4, min(subject.max_new_tokens, 8))), label="max_new_tokens")
    processors = subject.features & PROCESSOR_FEATURES
    params = data.draw(processor_configs(subject.vocab_size, features=processors, active=True), label="processors")
    alternatives = st.integers(0, 3) if "top_logprobs" in subject.features else st.just(0)
    params = attrs.evolve(params, prompt_logprobs=data.draw(alternatives, label="prompt alternatives"))
    schedule = data.draw(draft_schedules(k=subject.k), label="draft schedule")
    return DecodeExample(
        kind="prompt_logprobs", prompt=tuple(prompt), max_new_tokens=n, params=params, eos_token_id=None,
        schedule=tuple(schedule),
    )  # fmt: skip


def check_prompt_logprobs(inv: Invariant, run: DecodeRun, subject: DecodeSubject) -> tuple[list[Violation], int, str]:
    """The output equals plain decoding's; then one logprob per prompt token after the first, each within the
    tolerance of the prompt's teacher-forced scoring, with its alternatives. Exercised: prompt tokens scored."""
    if run.refused is not None:
        return [], 0, run.refused
    violations, _, _ = check_decode_output(inv, run)
    if violations:
        return violations, 1, ""
    gen, ex = run.generation, run.example
    assert gen is not None
    example, got = ex.to_json(), gen.prompt_logprobs
    if got is None:
        return (
            [inv.violation("the request asked for prompt logprobs and the engine returned none", example=example)],
            1,
            "",
        )
    want = ex.prompt[1:]
    if len(got) != len(want):
        text = f"the engine returned {len(got)} prompt logprobs for the {len(want)} prompt tokens after the first"
        return [inv.violation(text, expected=len(want), actual=len(got), example=example)], 1, ""
    rows = prompt_rows(subject.make_reference(), ex.prompt)
    n = ex.params.prompt_logprobs or 0
    for i, (entry, token, row) in enumerate(zip(got, want, rows, strict=True)):
        if entry.token != token:
            text = f"prompt logprob {i} is for token {entry.token}, prompt token {i + 1} is {token} (misaligned)"
            return [inv.violation(text, expected=token, actual=entry.token, example=example)], i + 1, ""
        if not abs(entry.logprob - float(row[token])) <= LOGPROB_TOLERANCE:
            text = (
                f"prompt token {i + 1}'s logprob is {entry.logprob!r}, the teacher-forced scoring of the prompt gives "
                f"{float(row[token])!r} (tolerance {LOGPROB_TOLERANCE:g}; no processor applies to the prompt)"
            )
            return [inv.violation(text, expected=float(row[token]), actual=entry.logprob, example=example)], i + 1, ""
        problem = top_problem(entry, row, n)
        if problem is not None:
            text = f"prompt token {i + 1}'s top-{n} alternatives: {problem}"
            return [inv.violation(text, actual=entry.to_json(), example=example)], i + 1, ""
    return [], len(got), ""
