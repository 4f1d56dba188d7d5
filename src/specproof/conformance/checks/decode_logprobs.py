"""The logprobs check: an engine's per-token logprobs against the oracle's teacher-forced scoring of its own
output (docs/contract.md, "Decode state", "Logprobs").

The output itself is judged first (tokens and stop reason equal plain decoding's with the same parameters: a
token or logprob past the stop fails here too); then each emitted token's logprob, after the processors, must
be within ``LOGPROB_TOLERANCE`` of ``scored_rows`` on a fresh copy of the model, aligned with the tokens (one
per token, the same id), and the top-n alternatives where asked must be the most likely tokens with their
logprobs. A placeholder (every logprob 0.0, llama.cpp #27972) or the drafter's logprobs fail as a wrong value.
"""

from __future__ import annotations

from itertools import pairwise
from typing import TYPE_CHECKING

import numpy as np

from specproof.conformance.checks.decode_state import DecodeRun, DecodeSubject, check_decode_output
from specproof.contract import LOGPROB_TOLERANCE, TokenLogprob, Violation
from specproof.contract.decode_state import scored_rows

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._registry import Invariant

__all__ = ["check_logprobs", "check_stop_strings", "top_problem"]


def _placeholder(got: tuple[TokenLogprob, ...]) -> str:
    every_zero = bool(got) and all(lp.logprob == 0.0 for lp in got)
    return " (every logprob is 0.0: a placeholder, llama.cpp #27972)" if every_zero else ""


def top_problem(entry: TokenLogprob, row: np.ndarray, n: int) -> str | None:
    """What is wrong with ``entry.top`` against the oracle's row, or None (ties within the tolerance may order
    either way)."""
    finite = int(np.isfinite(row).sum())
    if len(entry.top) != min(n, finite):
        return f"{len(entry.top)} alternatives where {min(n, finite)} were asked"
    values = [lp for _, lp in entry.top]
    if any(b > a + LOGPROB_TOLERANCE for a, b in pairwise(values)):
        return f"alternatives not most likely first: {entry.top}"
    for token, lp in entry.top:
        if not 0 <= token < len(row) or not abs(lp - row[token]) <= LOGPROB_TOLERANCE:
            want = row[token] if 0 <= token < len(row) else "no such token"
            return f"alternative {token} has logprob {lp!r}, the teacher-forced scoring gives {want!r}"
    if entry.top and np.sort(row)[::-1][len(entry.top) - 1] > entry.top[-1][1] + LOGPROB_TOLERANCE:
        return f"a more likely token than the alternatives {entry.top} was left out"
    return None


def check_logprobs(inv: Invariant, run: DecodeRun, subject: DecodeSubject) -> tuple[list[Violation], int, str]:
    """Each emitted token's logprob equals the teacher-forced scoring of the output within the tolerance."""
    violations, exercised, note = check_decode_output(inv, run)
    if violations or run.refused is not None:  # a refused request (UnsupportedParameterError) is a skip
        return violations, exercised, note
    gen, ex = run.generation, run.example
    assert gen is not None
    example = ex.to_json()
    got = gen.logprobs
    if got is None:
        return [inv.violation("the request asked for logprobs and the engine returned none", example=example)], 1, ""
    if len(got) != len(gen.tokens):
        more = " (logprobs past the stop)" if len(got) > len(gen.tokens) else ""
        text = f"the engine returned {len(got)} logprobs for {len(gen.tokens)} tokens{more}"
        return [inv.violation(text, expected=len(gen.tokens), actual=len(got), example=example)], 1, ""
    if not got:
        return [], 0, "the engine emitted no token to score"
    rows = scored_rows(subject.make_reference(), ex.prompt, gen.tokens, decode=ex.params, eos_token_id=ex.eos_token_id)
    n = ex.params.logprobs or 0
    for i, (entry, token, row) in enumerate(zip(got, gen.tokens, rows, strict=True)):
        if entry.token != token:
            text = f"logprob {i} is for token {entry.token}, the output's token {i} is {token} (misaligned)"
            return [inv.violation(text, expected=token, actual=entry.token, example=example)], i + 1, ""
        want = float(row[token])
        if not abs(entry.logprob - want) <= LOGPROB_TOLERANCE:
            text = (
                f"token {i}'s logprob is {entry.logprob!r}, the teacher-forced scoring after the processors gives "
                f"{want!r} (tolerance {LOGPROB_TOLERANCE:g}){_placeholder(got)}"
            )
            return [inv.violation(text, expected=want, actual=entry.logprob, example=example)], i + 1, ""
        problem = top_problem(entry, row, n)
        if problem is not None:
            text = f"token {i}'s top-{n} alternatives: {problem}"
            return [inv.violation(text, actual=entry.to_json(), example=example)], i + 1, ""
    return [], len(got), ""


def check_stop_strings(inv: Invariant, run: DecodeRun, subject: DecodeSubject) -> tuple[list[Violation], int, str]:
    """With stop strings, the output and its stop reason equal plain decoding's, and where logprobs were asked
    they are cut with the tokens; exercised when plain decoding met a stop."""
    violations, exercised, note = check_decode_output(inv, run)
    if violations or run.example.params.logprobs is None:
        return violations, exercised, note
    return check_logprobs(inv, run, subject)[0], exercised, note
