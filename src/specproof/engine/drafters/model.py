"""Draft-model drafting: greedy decoding (or sampling) of a small ``Target`` kept in step with the context.

A draft model is itself a hybrid with a KV cache and recurrent state. After a proposal it
has run ahead over its own draft; before the next one it must roll back to the part of
that draft the engine accepted and take in the tokens it has not seen (the bonus token, a
user turn). Getting that wrong never breaks losslessness (the target verifies every
token), it silently costs acceptance, so only ``drafter.deterministic`` catches it: a
correct ``ModelDrafter`` proposes, at every call, exactly what a fresh one asked once on
the same context proposes (and, sampling, with the same random generator state, the same
tokens and ``q`` rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from specproof.contract import Target
from specproof.contract.errors import InvalidSettingError
from specproof.contract.sampling import SampledDraft, SamplingParams
from specproof.engine.drafters._pick import Pick, argmax_pick, sampled_draft, sampling_pick

__all__ = ["DraftRollback", "ModelDrafter"]

DraftRollback = Literal["auto", "checkpoint", "replay"]


def _common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (at most ``limit``)."""
    if limit <= 0:
        return 0
    if list(a[:limit]) == list(b[:limit]):
        return limit
    i = 0
    while i < limit and a[i] == b[i]:
        i += 1
    return i


class ModelDrafter:
    """Propose up to ``k`` tokens by greedy decoding of ``model`` (any ``Target``) after the context.

    The drafter remembers the tokens its model has processed (the context it last saw plus
    its own draft) and, for the positions it may have to go back to, the model's state and
    the logits row there. A call with ``context``:

    1. finds the longest common prefix ``c`` of what the model processed and ``context``;
    2. rolls the model back to the latest remembered position ``r <= c`` (nothing to do when
       the model is exactly at ``c``);
    3. feeds ``context[r:]`` in **one** forward (the catch-up: the accepted part of its
       draft under replay, the bonus token, a user turn), or none when ``r == len(context)``;
    4. drafts greedily: the argmax of the last row, then ``k - 1`` one-token forwards.

    ``propose_sampled(context, k, sampling=..., rng=...)`` (a ``SamplingDrafter``) does the same
    with step 4 sampling: each token is drawn (``draw``, one uniform of ``rng``) from the draft
    model's processed distribution at the request's parameters (``target_distribution`` of its
    logits row: temperature, top-k, top-p, min-p), and that row is returned as the token's ``q``.
    The catch-up never looks at how the draft it fed was chosen (it compares tokens), so the
    rollback is the same: a fresh drafter given the same context and a generator in the same state
    proposes the same tokens with the same ``q`` rows (the draft model's rows are the same bit for
    bit whichever way it was fed, as the greedy property already needs).

    Rollback: ``"checkpoint"`` remembers the model's state at every position it fed since
    the last catch-up (``forward_with_checkpoints``), so it restores exactly ``c`` and the
    catch-up feeds only the tokens the model never saw; ``"replay"`` remembers only the
    snapshot after the last catch-up, restores it and re-feeds the accepted draft tokens
    inside the catch-up forward (same forward count, a few more tokens). ``"auto"`` picks
    checkpoint when the model has ``forward_with_checkpoints``.

    A context that does not share the remembered prefix (a new conversation, a regenerated
    or edited earlier turn) restarts the model: ``reset()`` and one forward over the whole
    context (counted in ``restarts``). ``reset()`` forgets everything, as a fresh drafter.

    Capacity: the model must hold the context plus ``k - 1`` drafted tokens. ``k`` is clamped
    to what fits; a context longer than the model's ``max_context`` gets an empty draft (the
    engine then makes a plain greedy step), never an error, so a small draft model can be
    paired with a target of larger capacity.

    Counters (cumulative, cleared by ``reset()``): ``forwards`` (every draft-model forward),
    ``catchup_forwards``, ``draft_forwards`` (one-token forwards while drafting),
    ``restarts`` (catch-ups from an empty model: the first prefill of every conversation),
    ``tokens_fed``, ``proposals``.
    """

    def __init__(self, model: Target, *, rollback: DraftRollback = "auto", name: str | None = None) -> None:
        if rollback not in ("auto", "checkpoint", "replay"):
            raise InvalidSettingError(f"ModelDrafter rollback={rollback!r} is not 'auto', 'checkpoint' or 'replay'")
        has_checkpoints = callable(getattr(model, "forward_with_checkpoints", None))
        if rollback == "checkpoint" and not has_checkpoints:
            raise InvalidSettingError(
                f"ModelDrafter rollback='checkpoint': the draft model {type(model).__name__} has no "
                f"forward_with_checkpoints; use rollback='replay'"
            )
        self.model = model
        self.rollback: Literal["checkpoint", "replay"] = (
            "checkpoint" if rollback == "checkpoint" or (rollback == "auto" and has_checkpoints) else "replay"
        )
        self.vocab_size = int(model.vocab_size)
        self.max_context = int(model.max_context)
        self.name = name or f"specproof.ModelDrafter({type(model).__name__}, rollback={self.rollback})"
        self.reset()

    def __repr__(self) -> str:
        return f"ModelDrafter({type(self.model).__name__}, rollback={self.rollback!r})"

    # ------------------------------------------------------------------ state

    def reset(self) -> None:
        """Forget everything: the model is reset and the drafter behaves as a fresh one."""
        self.model.reset()
        self._fed: list[int] = []  # tokens the model has processed, in order
        self._row: np.ndarray | None = None  # logits after the last fed token
        # position -> (model state after that many tokens, logits row after them)
        self._saved: dict[int, tuple[object, np.ndarray]] = {}
        self.forwards = 0
        self.catchup_forwards = 0
        self.draft_forwards = 0
        self.restarts = 0
        self.tokens_fed = 0
        self.proposals = 0

    def _forward(self, tokens: list[int], *, remember: bool) -> np.ndarray:
        """Feed ``tokens``; remember the state (and row) at each new position when asked and able."""
        base = len(self._fed)
        if remember and self.rollback == "checkpoint":
            logits, checkpoints = self.model.forward_with_checkpoints(tokens)  # type: ignore[attr-defined]
            logits = np.asarray(logits)
            for i, cp in enumerate(checkpoints):
                self._saved[base + i + 1] = (cp, logits[i])
        else:
            logits = np.asarray(self.model.forward(tokens))
        self.forwards += 1
        self.tokens_fed += len(tokens)
        self._fed.extend(tokens)
        self._row = logits[-1]
        return logits

    def _rollback_to(self, position: int) -> None:
        """Restore the remembered state at ``position`` (``<= len(self._fed)``)."""
        if position == len(self._fed):
            return
        state, row = self._saved[position]
        self.model.restore(state)
        del self._fed[position:]
        self._row = row
        # states after ``position`` describe tokens that are gone; those at or before it stay valid
        for p in [p for p in self._saved if p > position]:
            del self._saved[p]

    def _catch_up(self, context: Sequence[int]) -> None:
        """Bring the model to exactly ``context`` processed, with the row after its last token."""
        n = len(context)
        c = _common_prefix(self._fed, context, min(len(self._fed), n))
        if c == len(self._fed) and (c < n or self._row is not None):
            start = c  # the model is on the context's path: feed what it has not seen
        else:
            candidates = [p for p in self._saved if p <= c]
            if candidates:
                start = max(candidates)
                self._rollback_to(start)
            else:
                self.model.reset()
                self._fed = []
                self._row = None
                self._saved = {}
                start = 0
        if start < n:
            if start == 0:
                self.restarts += 1
            self.catchup_forwards += 1
            self._saved = {}  # every remembered state is before the new anchor: never needed again
            self._forward([int(t) for t in context[start:]], remember=False)
            # the anchor every later call can come back to: the state after the whole context
            self._saved[n] = (self.model.snapshot(), self._row)  # type: ignore[assignment]

    # ------------------------------------------------------------------ drafting

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens by greedy decoding of the draft model after ``context``."""
        return [token for token, _ in self._draft(context, k, argmax_pick)]

    def propose_sampled(
        self, context: Sequence[int], k: int, *, sampling: SamplingParams, rng: np.random.Generator
    ) -> SampledDraft:
        """Up to ``k`` tokens each drawn with ``rng`` from the draft model's processed distribution at
        ``sampling``; ``q[i]`` is the row ``tokens[i]`` was drawn from."""
        return sampled_draft(self._draft(context, k, sampling_pick(sampling, rng)), self.vocab_size)

    def _draft(self, context: Sequence[int], k: int, pick: Pick) -> list[tuple[int, np.ndarray | None]]:
        """Catch up on ``context``, then ``pick`` a token from each logits row: the first from the row after
        the context, each next one after a one-token forward of the last."""
        n = len(context)
        if k <= 0 or n == 0 or n > self.max_context:
            return []
        k = min(int(k), self.max_context - n + 1)  # the model must hold context + draft[:-1]
        self.proposals += 1
        self._catch_up(context)
        assert self._row is not None
        draft = [pick(self._row)]
        while len(draft) < k:
            self.draft_forwards += 1
            self._forward([draft[-1][0]], remember=True)
            draft.append(pick(self._row))
        return draft
