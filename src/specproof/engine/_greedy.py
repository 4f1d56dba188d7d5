"""The greedy oracle: one one-token forward per emitted token (docs/contract.md, "The decode convention")."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specproof.contract import Generation, Stats, Step, StopReason, Target
from specproof.contract.validation import int_at_least
from specproof.engine.conventions import check_eos_token, check_logits, check_prompt, component_name

__all__ = ["greedy_decode", "greedy_with_margins", "top2_margin"]


def top2_margin(row: np.ndarray) -> float:
    """The gap between the largest and second-largest logit of a row (inf for one-id vocabularies)."""
    if row.shape[0] < 2:
        return float("inf")
    top2 = np.partition(np.asarray(row, dtype=np.float64), -2)[-2:]
    return float(top2[1] - top2[0])


def greedy_with_margins(
    target: Target, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None
) -> tuple[Generation, list[float]]:
    """Like ``greedy_decode``, and also each emitted token's top-2 logit margin.

    The margins are what tie-aware losslessness compares with the tie tolerance.
    """
    name = component_name(target)
    ctx = check_prompt(prompt, vocab_size=target.vocab_size, max_context=target.max_context)
    max_new_tokens = int_at_least(max_new_tokens, name="max_new_tokens", minimum=0)
    check_eos_token(eos_token_id, vocab_size=target.vocab_size)
    target.reset()
    prefill = 0
    if len(ctx) > 1:
        check_logits(
            target.forward(ctx[:-1]), rows=len(ctx) - 1, vocab_size=target.vocab_size, target=name, round_index=None
        )
        prefill = 1
    out: list[int] = []
    steps: list[Step] = []
    margins: list[float] = []
    stop: StopReason = "max_new_tokens"
    while len(out) < max_new_tokens:
        if target.processed >= target.max_context:
            stop = "context_full"
            break
        base = target.processed
        row = check_logits(
            target.forward([ctx[-1]]), rows=1, vocab_size=target.vocab_size, target=name, round_index=len(out)
        )[0]
        tok = int(np.argmax(row))  # first maximum: lowest index wins a tie
        margins.append(top2_margin(row))
        steps.append(Step(base=base, draft=(), argmax=(tok,), accepted=(tok,), processed=target.processed))
        out.append(tok)
        ctx.append(tok)
        if eos_token_id is not None and tok == eos_token_id:
            stop = "eos"
            break
    n = len(out)
    stats = Stats(rounds=n, emitted=n, prefill_forwards=prefill, verify_forwards=n)
    return Generation(tokens=out, stop_reason=stop, steps=tuple(steps), stats=stats), margins


def greedy_decode(
    target: Target, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None
) -> Generation:
    """Plain greedy decoding, the oracle every speculative engine must match token for token.

    Resets ``target``, prefills ``prompt[:-1]``, then feeds the pending token and
    appends the argmax (lowest id on a tie) until ``max_new_tokens``, the first EOS,
    or ``max_context``. Each emitted token is a one-token round in ``steps``.
    """
    return greedy_with_margins(target, prompt, max_new_tokens, eos_token_id=eos_token_id)[0]
