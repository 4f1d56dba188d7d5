"""Per-generation invariant checks: pure functions over the records an engine returns.

Each ``check_*`` function looks at a ``Generation`` (or its parts) after the fact and
returns the breaches it finds as ``Violation`` records (an empty list: checked and
held). None of them needs a target, so they apply equally to a live ``SpecDecoder``
run, to a black-box engine's output and to a trace file.

The rules are those of docs/contract.md ("one speculative round" and the invariant
table). No check names its invariant: each takes the registry's ``Invariant`` it
implements as ``inv`` and builds its breaches with ``inv.violation(...)``; the registry
(``specproof.conformance._registry``) binds every check to its id and judges where it
applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from specproof.contract import STOP_REASONS, Generation, Stats, Step, Violation
from specproof.contract.errors import InvalidSettingError
from specproof.contract.validation import int_at_least

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._registry import Invariant

__all__ = [
    "check_accept_bounds",
    "check_accept_rule",
    "check_cost",
    "check_kv_length",
    "check_stop",
    "check_trace_consistency",
    "emitted_per_round",
    "round_of_index",
    "token_id_problem",
]


def _need_optional_int(value: object, *, name: str, minimum: int) -> int | None:
    return None if value is None else int_at_least(value, name=name, minimum=minimum)


def token_id_problem(tokens: Sequence[object], vocab_size: int | None) -> tuple[int, object, str] | None:
    """The first emitted id that is not an integer in ``[0, vocab_size)``: ``(index, token, why)``
    (None: every id is one). Checked before any model is fed the output, so a bad id is a violation
    naming the token, never an ``IndexError`` in a judge."""
    for i, token in enumerate(tokens):
        if isinstance(token, bool) or not isinstance(token, (int, np.integer)):
            return i, token, f"token {i} of the output is {token!r} ({type(token).__name__}), not an integer token id"
        if vocab_size is not None and not 0 <= int(token) < vocab_size:
            return i, int(token), f"token {i} of the output is {int(token)}, not a token id in [0, {vocab_size})"
    return None


def _short(tokens: Sequence[int], limit: int = 12) -> str:
    items = list(tokens)
    text = ", ".join(str(t) for t in items[:limit])
    return f"[{text}{', ...' if len(items) > limit else ''}]"


def emitted_per_round(steps: Sequence[Step], tokens: Sequence[int]) -> list[int]:
    """How many tokens each round contributed to ``tokens``.

    Every round but the last emits its whole ``accepted``; the last one emits the
    rest (it may be cut at EOS or ``max_new_tokens``). A negative last count means
    the earlier rounds already account for more tokens than were emitted.
    """
    counts = [len(s.accepted) for s in steps]
    if counts:
        counts[-1] = len(tokens) - sum(counts[:-1])
    return counts


# --------------------------------------------------------------------------- accept bounds and rule


def check_accept_bounds(inv: Invariant, steps: Sequence[Step], *, k: int) -> list[Violation]:
    """``engine.accept-bounds``: ``1 <= len(accepted) <= len(draft) + 1 <= k + 1`` in every round."""
    k = int_at_least(k, name="k", minimum=0)
    out: list[Violation] = []
    for i, step in enumerate(steps):
        n_acc, n_draft = len(step.accepted), len(step.draft)
        if n_draft > k:
            out.append(
                inv.violation(
                    round=i,
                    expected=f"len(draft) <= k = {k}",
                    actual=n_draft,
                    explanation=f"round {i} verified a draft of {n_draft} tokens, more than k={k}",
                    example={"draft": step.draft},
                )
            )
        if n_acc < 1:
            out.append(
                inv.violation(
                    round=i,
                    expected="len(accepted) >= 1",
                    actual=n_acc,
                    explanation=f"round {i} accepted no token: every round must keep at least the target's own token",
                    example={"draft": step.draft, "argmax": step.argmax},
                )
            )
        elif n_acc > n_draft + 1:
            out.append(
                inv.violation(
                    round=i,
                    expected=f"len(accepted) <= len(draft) + 1 = {n_draft + 1}",
                    actual=n_acc,
                    explanation=(
                        f"round {i} accepted {n_acc} tokens from a draft of {n_draft}: "
                        "a round can add at most one token beyond its draft"
                    ),
                    example={"draft": step.draft, "accepted": step.accepted},
                )
            )
    return out


def check_accept_rule(inv: Invariant, steps: Sequence[Step]) -> list[Violation]:
    """``engine.accept-rule``: ``accepted == draft[:j] + [argmax[j]]``, j the longest prefix with draft == argmax.

    Also ``len(argmax) == len(draft) + 1``: the verify forward scores the pending
    token and every draft token.
    """
    out: list[Violation] = []
    for i, step in enumerate(steps):
        draft, argmax, accepted = list(step.draft), list(step.argmax), list(step.accepted)
        if len(argmax) != len(draft) + 1:
            out.append(
                inv.violation(
                    round=i,
                    expected=len(draft) + 1,
                    actual=len(argmax),
                    explanation=(
                        f"round {i} has {len(argmax)} argmax entries for a draft of {len(draft)} tokens; "
                        f"the verify forward over [pending, *draft] gives {len(draft) + 1}"
                    ),
                    example={"draft": step.draft, "argmax": step.argmax},
                )
            )
            continue
        j = 0
        while j < len(draft) and draft[j] == argmax[j]:
            j += 1
        expected = [*draft[:j], argmax[j]]
        if accepted != expected:
            if accepted[:j] == expected[:j] and len(accepted) > len(expected):
                why = (
                    f"it kept draft tokens after the first mismatch (draft[{j}]={draft[j]} != argmax[{j}]={argmax[j]})"
                )
            elif accepted == draft[:j]:
                why = f"it dropped the target's own token argmax[{j}]={argmax[j]} (the bonus token) after {j} matches"
            elif len(accepted) < len(expected) and accepted == draft[: len(accepted)]:
                why = f"it rejected a draft token the target agreed with (the first {j} draft tokens match)"
            else:
                why = f"the first {j} draft tokens match the target's argmax: keep them, then argmax[{j}]"
            out.append(
                inv.violation(
                    round=i,
                    expected=expected,
                    actual=accepted,
                    explanation=f"round {i} accepted the wrong tokens: {why}",
                    example={"draft": step.draft, "argmax": step.argmax},
                )
            )
    return out


# --------------------------------------------------------------------------- KV length


def check_kv_length(
    inv: Invariant,
    steps: Sequence[Step],
    *,
    prompt_length: int,
    final_processed: int | None = None,
    tokens: Sequence[int] | None = None,
) -> list[Violation]:
    """``engine.kv-length``: the target's KV length is exactly what the emitted tokens say.

    Round 0 starts at ``base == prompt_length - 1`` (``prompt_length`` is the context
    length when the call started: the prompt for a fresh generation); each later
    round starts where the previous ended; every round but the last ends at
    ``base + len(accepted)``; the last ends at ``base +`` the tokens it emitted (it may
    be cut at EOS / ``max_new_tokens``), i.e. at ``len(ctx) - 1``, when ``tokens`` is
    given, else somewhere in ``[base + 1, base + len(accepted)]``. ``final_processed`` (the target's KV length
    after the call) must equal the last round's ``processed``, and
    ``prompt_length + len(tokens) - 1`` when ``tokens`` is given.
    """
    prompt_length = int_at_least(prompt_length, name="prompt_length", minimum=1)
    final_processed = _need_optional_int(final_processed, name="final_processed", minimum=0)
    out: list[Violation] = []
    expected_base = prompt_length - 1
    for i, step in enumerate(steps):
        if step.base != expected_base:
            where = "the prompt length - 1" if i == 0 else f"round {i - 1}'s processed"
            out.append(
                inv.violation(
                    round=i,
                    expected=expected_base,
                    actual=step.base,
                    explanation=f"round {i} started with the target at {step.base} processed tokens, not {where}",
                )
            )
        if i < len(steps) - 1:
            out += _middle_round_end(inv, i, step)
        else:
            out += _last_round_end(inv, i, step, prompt_length=prompt_length, tokens=tokens)
        expected_base = step.processed
    if final_processed is not None:
        out += _final_length(inv, steps, final_processed, prompt_length=prompt_length, tokens=tokens)
    return out


def _middle_round_end(inv: Invariant, i: int, step: Step) -> list[Violation]:
    """A round before the last ends at ``base + len(accepted)``."""
    want = step.base + len(step.accepted)
    if step.processed == want:
        return []
    return [
        inv.violation(
            round=i,
            expected=want,
            actual=step.processed,
            explanation=(
                f"after round {i} the target holds {step.processed} tokens, but base {step.base} + "
                f"{len(step.accepted)} accepted = {want}: the rollback left the KV length wrong"
            ),
        )
    ]


def _last_round_end(
    inv: Invariant, i: int, step: Step, *, prompt_length: int, tokens: Sequence[int] | None
) -> list[Violation]:
    """The last round ends at ``len(ctx) - 1`` (``tokens`` known), else at ``base + 1 .. base + len(accepted)``."""
    if tokens is not None:
        # With a consistent chain this is base + the tokens the last round emitted; stated
        # against the context it stays meaningful when an earlier round already went wrong.
        want = prompt_length + len(tokens) - 1
        if step.processed == want:
            return []
        return [
            inv.violation(
                round=i,
                expected=want,
                actual=step.processed,
                explanation=(
                    f"after the last round the target holds {step.processed} tokens, but the context has "
                    f"{prompt_length} + {len(tokens)} tokens, so it must hold len(ctx) - 1 = {want}"
                ),
            )
        ]
    low, high = step.base + 1, step.base + len(step.accepted)
    if low <= step.processed <= high:
        return []
    return [
        inv.violation(
            round=i,
            expected=f"{low}..{high}",
            actual=step.processed,
            explanation=(
                f"after the last round the target holds {step.processed} tokens, outside base + 1 .. "
                f"base + len(accepted) = {low}..{high}"
            ),
        )
    ]


def _final_length(
    inv: Invariant, steps: Sequence[Step], final_processed: int, *, prompt_length: int, tokens: Sequence[int] | None
) -> list[Violation]:
    """The target's KV length after the call: ``len(ctx) - 1`` when ``tokens`` is known, else the last round's."""
    if tokens is not None:
        want_final = prompt_length + len(tokens) - 1
        if final_processed == want_final:
            return []
        return [
            inv.violation(
                expected=want_final,
                actual=final_processed,
                explanation=(
                    f"the target holds {final_processed} tokens at the end, but the context has "
                    f"{prompt_length} + {len(tokens)} tokens, so it must hold len(ctx) - 1 = {want_final}"
                ),
            )
        ]
    want_final = steps[-1].processed if steps else prompt_length - 1
    if final_processed == want_final:
        return []
    return [
        inv.violation(
            expected=want_final,
            actual=final_processed,
            explanation=(
                f"the target holds {final_processed} tokens at the end, but the last round left it at {want_final}"
            ),
        )
    ]


# --------------------------------------------------------------------------- stop


def check_stop(
    inv: Invariant,
    tokens: Sequence[int],
    stop_reason: str,
    *,
    max_new_tokens: int,
    eos_token_id: int | None,
    prompt_length: int,
    max_context: int | None = None,
    final_processed: int | None = None,
) -> list[Violation]:
    """``engine.stop``: the generation stopped where and why it says.

    - never more than ``max_new_tokens`` tokens; fewer only with ``eos`` or ``context_full``;
    - ``max_new_tokens``: exactly that many tokens (and the last is not EOS: that stop is ``eos``);
    - ``eos``: the last token is EOS; nothing follows the first EOS whatever the reason;
    - ``context_full``: the target is full: ``prompt_length + len(tokens) - 1 == max_context``
      (when ``max_context`` is known) — it could not take the pending token;
    - never past ``max_context``: ``prompt_length + len(tokens) - 1 <= max_context`` (and
      ``final_processed <= max_context``).

    A generation driven with ``max_rounds`` stops early with ``max_new_tokens``; check
    such calls with ``max_new_tokens=len(tokens)``.
    """
    max_new_tokens = int_at_least(max_new_tokens, name="max_new_tokens", minimum=0)
    prompt_length = int_at_least(prompt_length, name="prompt_length", minimum=1)
    max_context = _need_optional_int(max_context, name="max_context", minimum=1)
    final_processed = _need_optional_int(final_processed, name="final_processed", minimum=0)
    eos_token_id = _need_optional_int(eos_token_id, name="eos_token_id", minimum=0)
    toks = list(tokens)
    n = len(toks)
    out: list[Violation] = []

    def add(explanation: str, expected: object, actual: object) -> None:
        out.append(inv.violation(explanation=explanation, expected=expected, actual=actual))

    if stop_reason not in STOP_REASONS or stop_reason == "error":
        add(
            f"the generation ended with stop reason {stop_reason!r}; a finished generation stops with "
            "'max_new_tokens', 'eos' or 'context_full'",
            ["max_new_tokens", "eos", "context_full"],
            stop_reason,
        )
    if n > max_new_tokens:
        add(f"{n} tokens were emitted but max_new_tokens is {max_new_tokens}", max_new_tokens, n)
    first_eos = toks.index(eos_token_id) if eos_token_id is not None and eos_token_id in toks else None
    if first_eos is not None and first_eos < n - 1:
        add(
            f"{n - 1 - first_eos} token(s) follow the first EOS ({eos_token_id}) at index {first_eos}; "
            "generation must stop at EOS",
            first_eos + 1,
            n,
        )
    if stop_reason == "max_new_tokens":
        breaches = _max_new_tokens_breaches(n, max_new_tokens, first_eos)
    elif stop_reason == "eos":
        breaches = _eos_breaches(toks, eos_token_id)
    elif stop_reason == "context_full":
        breaches = _context_full_breaches(n, max_new_tokens, first_eos, prompt_length, max_context)
    else:
        breaches = []
    if max_context is not None:
        breaches += _capacity_breaches(n, prompt_length, max_context, final_processed)
    for explanation, expected, actual in breaches:
        add(explanation, expected, actual)
    return out


# (explanation, expected, actual) of one breach of ``engine.stop``
_Breach = tuple[str, object, object]


def _max_new_tokens_breaches(n: int, max_new_tokens: int, first_eos: int | None) -> list[_Breach]:
    out: list[_Breach] = []
    if n < max_new_tokens:
        out.append(
            (
                f"the stop reason is 'max_new_tokens' but only {n} of {max_new_tokens} tokens were emitted",
                max_new_tokens,
                n,
            )
        )
    if first_eos is not None and first_eos == n - 1:
        out.append(
            ("the last token is EOS, so the stop reason must be 'eos', not 'max_new_tokens'", "eos", "max_new_tokens")
        )
    return out


def _eos_breaches(toks: list[int], eos_token_id: int | None) -> list[_Breach]:
    if eos_token_id is None:
        return [("the stop reason is 'eos' but no EOS token id was set", None, "eos")]
    if not toks or toks[-1] != eos_token_id:
        return [
            (
                f"the stop reason is 'eos' but the last token is {toks[-1] if toks else 'missing (no tokens)'}, "
                f"not EOS ({eos_token_id})",
                eos_token_id,
                toks[-1] if toks else None,
            )
        ]
    return []


def _context_full_breaches(
    n: int, max_new_tokens: int, first_eos: int | None, prompt_length: int, max_context: int | None
) -> list[_Breach]:
    out: list[_Breach] = []
    if n >= max_new_tokens:
        out.append(
            (
                f"the stop reason is 'context_full' but all {max_new_tokens} tokens were emitted: "
                "that stop is 'max_new_tokens'",
                "max_new_tokens",
                "context_full",
            )
        )
    if first_eos is not None and first_eos == n - 1:
        out.append(
            ("the last token is EOS, so the stop reason must be 'eos', not 'context_full'", "eos", "context_full")
        )
    if max_context is not None and prompt_length + n - 1 < max_context:
        out.append(
            (
                f"the stop reason is 'context_full' but the target holds {prompt_length + n - 1} of "
                f"{max_context} tokens: it could still take the pending token",
                max_context,
                prompt_length + n - 1,
            )
        )
    return out


def _capacity_breaches(n: int, prompt_length: int, max_context: int, final_processed: int | None) -> list[_Breach]:
    out: list[_Breach] = []
    used = prompt_length + n - 1
    if used > max_context:
        out.append(
            (
                f"the prompt ({prompt_length}) and {n} emitted tokens need {used} processed tokens, "
                f"past max_context={max_context}",
                f"<= {max_context}",
                used,
            )
        )
    if final_processed is not None and final_processed > max_context:
        out.append(
            (
                f"the target holds {final_processed} tokens at the end, past max_context={max_context}",
                f"<= {max_context}",
                final_processed,
            )
        )
    return out


# --------------------------------------------------------------------------- cost


def check_cost(
    inv: Invariant,
    generation: Generation,
    *,
    rollback: str | None,
    prompt_length: int | None = None,
) -> list[Violation]:
    """``engine.cost``: the target forwards the stats report fit the rollback strategy.

    Always: ``stats.emitted == len(tokens)``, every round emits at least one token,
    one verify forward per round; with steps also ``rounds == len(steps)`` and the
    drafted/accepted counts. ``checkpoint``: no replay forward at all and at most one
    prefill forward, so target forwards == rounds (+ prefill). ``replay``: at most one replay per round that needed a
    rollback (a rejected draft token, or a last round cut at EOS/``max_new_tokens``).
    ``prompt_length`` (optional) lets a fresh one-token prompt be checked to have no
    prefill.
    """
    if rollback not in (None, "checkpoint", "replay"):
        raise InvalidSettingError(f"rollback must be 'checkpoint', 'replay' or None, got {rollback!r}")
    stats = generation.stats
    if stats is None:
        return []
    breaches = _counter_breaches(stats, len(generation.tokens), rollback=rollback, prompt_length=prompt_length)
    if generation.steps is not None:
        breaches += _step_breaches(stats, generation.steps, generation.tokens, rollback=rollback)
    elif rollback == "replay" and stats.replay_forwards > stats.rounds:
        breaches.append(
            (
                f"rollback='replay' spent {stats.replay_forwards} replay forwards in {stats.rounds} rounds "
                "(at most one replay each)",
                f"<= {stats.rounds}",
                stats.replay_forwards,
                None,
            )
        )
    return [
        inv.violation(round=round_index, explanation=explanation, expected=expected, actual=actual)
        for explanation, expected, actual, round_index in breaches
    ]


# (explanation, expected, actual, round) of one breach of ``engine.cost``
_CostBreach = tuple[str, object, object, int | None]


def _counter_breaches(
    stats: Stats, n_tokens: int, *, rollback: str | None, prompt_length: int | None
) -> list[_CostBreach]:
    """What the counters alone must satisfy: emitted, rounds, one verify per round, prefill, no checkpoint replay."""
    out: list[_CostBreach] = []
    if stats.emitted != n_tokens:
        out.append(
            (f"stats.emitted is {stats.emitted} but {n_tokens} tokens were returned", n_tokens, stats.emitted, None)
        )
    if stats.rounds > stats.emitted:
        out.append(
            (
                f"{stats.rounds} rounds emitted only {stats.emitted} tokens: every round must emit at least one",
                f"<= {stats.emitted} rounds",
                stats.rounds,
                None,
            )
        )
    if stats.verify_forwards != stats.rounds:
        out.append(
            (
                f"{stats.verify_forwards} verify forwards for {stats.rounds} rounds: each round is exactly one verify",
                stats.rounds,
                stats.verify_forwards,
                None,
            )
        )
    # A prefill may be chunked (engines do: prefix-cache blocks, snapshots every N positions), so
    # its forwards are not bounded by 1 — only by the prompt tokens it has to feed.
    if prompt_length is not None and stats.prefill_forwards > max(prompt_length - 1, 0):
        out.append(
            (
                f"{stats.prefill_forwards} prefill forwards for a {prompt_length}-token prompt: a prefill forward "
                "feeds at least one of its first len(prompt) - 1 tokens",
                f"<= {max(prompt_length - 1, 0)}",
                stats.prefill_forwards,
                None,
            )
        )
    if prompt_length is not None and prompt_length == 1 and stats.prefill_forwards != 0:
        out.append(
            (
                "a one-token prompt has nothing to prefill, yet a prefill forward was counted",
                0,
                stats.prefill_forwards,
                None,
            )
        )
    if rollback == "checkpoint" and stats.replay_forwards != 0:
        out.append(
            (
                f"rollback='checkpoint' spent {stats.replay_forwards} replay forwards: restoring a checkpoint "
                "costs no forward",
                0,
                stats.replay_forwards,
                None,
            )
        )
    return out


def _step_breaches(
    stats: Stats, steps: Sequence[Step], tokens: Sequence[int], *, rollback: str | None
) -> list[_CostBreach]:
    """What the counters must say of the recorded rounds: rounds, tokens per round, drafted, accepted, replays."""
    out: list[_CostBreach] = []
    if stats.rounds != len(steps):
        out.append(
            (f"stats.rounds is {stats.rounds} but {len(steps)} rounds were recorded", len(steps), stats.rounds, None)
        )
    emitted = emitted_per_round(steps, tokens)
    for i, count in enumerate(emitted):
        if count < 1:
            out.append((f"round {i} emitted {count} tokens: every round must emit at least one", ">= 1", count, i))
    drafted = sum(len(s.draft) for s in steps)
    if stats.drafted != drafted:
        out.append(
            (f"stats.drafted is {stats.drafted} but the rounds drafted {drafted} tokens", drafted, stats.drafted, None)
        )
    kept = sum(max(len(s.accepted) - 1, 0) for s in steps)
    if stats.accepted != kept:
        out.append(
            (
                f"stats.accepted is {stats.accepted} but the rounds accepted {kept} draft tokens",
                kept,
                stats.accepted,
                None,
            )
        )
    if rollback == "replay":
        # A round must roll back when it keeps fewer tokens than it fed: a rejected
        # draft token, or a last round cut at EOS / max_new_tokens.
        needing = sum(1 for s, c in zip(steps, emitted) if c < len(s.draft) + 1)
        if stats.replay_forwards > needing:
            out.append(
                (
                    f"rollback='replay' spent {stats.replay_forwards} replay forwards but only {needing} round(s) "
                    "needed a rollback (at most one replay each)",
                    f"<= {needing}",
                    stats.replay_forwards,
                    None,
                )
            )
    return out


# --------------------------------------------------------------------------- trace consistency


def check_trace_consistency(
    inv: Invariant,
    tokens: Sequence[int],
    steps: Sequence[Step],
    stop_reason: str,
    *,
    max_new_tokens: int,
    eos_token_id: int | None,
) -> list[Violation]:
    """``trace.consistency``: ``tokens`` is the concatenated ``accepted`` of the rounds, cut as the stop says.

    The concatenation is cut at the first EOS and at ``max_new_tokens``; only the
    last round may be cut (a round after the cut should not have run), and a cut at
    EOS / ``max_new_tokens`` must match the stop reason.
    """
    max_new_tokens = int_at_least(max_new_tokens, name="max_new_tokens", minimum=0)
    eos_token_id = _need_optional_int(eos_token_id, name="eos_token_id", minimum=0)
    out, rebuilt, cut = _rebuild_output(inv, steps, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id)
    toks = list(tokens)
    if toks != rebuilt:
        first = next((p for p, (a, b) in enumerate(zip(toks, rebuilt)) if a != b), min(len(toks), len(rebuilt)))
        round_of = round_of_index(steps, first)
        out.append(
            inv.violation(
                round=round_of,
                expected=rebuilt,
                actual=toks,
                explanation=(
                    f"the emitted tokens are not the rounds' accepted tokens (cut at EOS/max_new_tokens): "
                    f"they differ from index {first} on ({len(toks)} emitted, {len(rebuilt)} from the rounds)"
                ),
            )
        )
    if len(rebuilt) >= max_new_tokens and cut != "eos":
        cut = "max_new_tokens"
    out += _cut_against_stop(inv, cut, stop_reason, n_rebuilt=len(rebuilt), max_new_tokens=max_new_tokens)
    return out


def _rebuild_output(
    inv: Invariant, steps: Sequence[Step], *, max_new_tokens: int, eos_token_id: int | None
) -> tuple[list[Violation], list[int], str | None]:
    """The rounds' accepted tokens concatenated and cut at EOS / ``max_new_tokens``; why it was cut (``"eos"``,
    ``"max_new_tokens"`` or None); and a breach for a round that ran after the cut."""
    out: list[Violation] = []
    rebuilt: list[int] = []
    cut: str | None = None  # why the concatenation stopped: "eos" or "max_new_tokens"
    for i, step in enumerate(steps):
        if cut is None and len(rebuilt) >= max_new_tokens:
            cut = "max_new_tokens"
        if cut is not None:
            out.append(
                inv.violation(
                    round=i,
                    expected=f"{i} rounds",
                    actual=f"{len(steps)} rounds",
                    explanation=(
                        f"round {i} ran after the output was already complete ({cut} reached"
                        + (f" in round {i - 1})" if i else " before any round)")
                    ),
                )
            )
            break
        room = max_new_tokens - len(rebuilt)
        piece = list(step.accepted[:room])
        if len(piece) < len(step.accepted):
            cut = "max_new_tokens"
        if eos_token_id is not None and eos_token_id in piece:
            piece = piece[: piece.index(eos_token_id) + 1]
            cut = "eos"
        rebuilt.extend(piece)
    return out, rebuilt, cut


def _cut_against_stop(
    inv: Invariant, cut: str | None, stop_reason: str, *, n_rebuilt: int, max_new_tokens: int
) -> list[Violation]:
    """The stop reason must name the cut the rounds imply (``context_full`` when there is none)."""
    if cut is not None and stop_reason != cut:
        return [
            inv.violation(
                expected=cut,
                actual=stop_reason,
                explanation=f"the rounds end the output by {cut}, but the stop reason says {stop_reason!r}",
            )
        ]
    if cut is None and stop_reason in ("eos", "max_new_tokens"):
        return [
            inv.violation(
                expected="context_full",
                actual=stop_reason,
                explanation=(
                    f"the rounds emit {n_rebuilt} of {max_new_tokens} tokens with no EOS, "
                    f"so the stop reason {stop_reason!r} does not explain where they end"
                ),
            )
        ]
    return []


def round_of_index(steps: Sequence[Step], index: int) -> int | None:
    """The round whose accepted tokens hold output position ``index`` (None past the end)."""
    seen = 0
    for i, step in enumerate(steps):
        seen += len(step.accepted)
        if index < seen:
            return i
    return len(steps) - 1 if steps else None
