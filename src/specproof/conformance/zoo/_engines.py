"""Broken engines: ``SpecDecoder``'s round, written flat with one hook per decision, one hook wrong each.

``ZooEngine`` is the correct control. It follows docs/contract.md's round exactly (the
same steps as ``specproof.engine.SpecDecoder``'s ``DecodeSession._round``) but
names each decision as a method:

- ``_accept(draft, argmax)`` — the accept rule;
- ``_emit(accepted, remaining, eos)`` — truncation at ``max_new_tokens`` and the first EOS;
- ``_kept(keep)`` — how many tokens of the verify forward the target keeps;
- ``_restore(snapshot)`` — putting a snapshot/checkpoint back on rejection;
- ``_commit(before, draft)`` — what happens when no rollback is needed.

Each zoo member overrides one of them. A random-init model rarely agrees with an
n-gram drafter, so the engines draft with an internal *oracle*: the greedy
continuation, computed on a private copy of the target, corrupted by a fixed
schedule so that fully accepted, rejected-at-0, partial and empty-draft rounds
(one right after a fully accepted round) all happen in every generation.

The engines expose what the suite needs (docs/contract.md, black-box engines): ``vocab_size``,
``target`` (white-box, ``state_arrays``), ``k`` and ``rollback``; their
``Generation`` carries ``steps`` and ``stats``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from specproof.conformance.zoo._targets import small_reference
from specproof.contract import StopReason
from specproof.contract.errors import EmptyPromptError, InvalidSettingError, TokenRangeError
from specproof.contract.validation import int_at_least
from specproof.engine import Generation, ReferenceHybrid, ReferenceSnapshot, Stats, Step, greedy_decode

__all__ = [
    "AcceptsPastMismatch",
    "DraftsPastK",
    "DropsBonusToken",
    "DropsLastStepAtEos",
    "EmitsAfterEos",
    "EosMaskedByLengthCap",
    "LengthCapHidesEosInBlock",
    "ForgetsRecurrentRestore",
    "GreedyOnlyEngine",
    "IgnoresSuiteDrafts",
    "LeaksPlaceholderId",
    "OracleDrafter",
    "OracleOnlyEngine",
    "OwnCopyEngine",
    "OwnDraftsEngine",
    "ProcessedOffByOne",
    "RaisesEveryCall",
    "RefeedsAcceptedFirst",
    "ReplaysDespiteCheckpoints",
    "StaleStateAfterZeroDraft",
    "TrustsOverlongDraft",
    "VaryingK",
    "VerifiesOwnDraft",
    "ZooEngine",
]

# (draft length, correct leading tokens) per round, cycled; None means "k" (the round's k_eff).
# The order puts an empty draft right after a fully accepted round (the vLLM case).
_SCHEDULE: tuple[tuple[int | None, int | None], ...] = (
    (None, None),  # all accepted
    (0, 0),  # empty draft right after a fully accepted round
    (None, 0),  # rejected at 0
    (None, 1),  # partial
    (None, None),  # all accepted
    (None, 2),  # partial
    (1, 1),  # a draft shorter than k, accepted
    (0, 0),  # empty draft after a partial round
)


class OracleDrafter:
    """Drafts the greedy continuation, corrupted at a scheduled position each round.

    ``continuation[i]`` is plain greedy's ``i``-th new token after ``prompt``; round
    ``r`` proposes ``length`` tokens of it with the token at ``correct`` replaced
    by another id, so a correct engine accepts exactly ``correct`` of them (while its
    context stays on the greedy path).
    """

    def __init__(self, prompt: Sequence[int], continuation: Sequence[int], *, vocab_size: int) -> None:
        self.prompt_length = len(prompt)
        self.continuation = [int(t) for t in continuation]
        self.vocab_size = vocab_size
        self.round = 0

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        length, correct = _SCHEDULE[self.round % len(_SCHEDULE)]
        self.round += 1
        length = k if length is None else min(length, k)
        correct = length if correct is None else min(correct, length)
        pos = len(context) - self.prompt_length
        draft = self.continuation[pos : pos + length]
        if correct < len(draft):
            draft[correct] = (draft[correct] + 1) % self.vocab_size
        return draft


class ZooEngine:
    """A correct speculative engine over a small reference model (the control the zoo members break).

    ``ZooEngine(*, k=4, rollback="checkpoint", target=None)``; ``target`` defaults to
    the zoo's small ``ReferenceHybrid``.
    """

    bug = "none (the correct control)"

    def __init__(self, *, k: int = 4, rollback: str = "checkpoint", target: ReferenceHybrid | None = None) -> None:
        int_at_least(k, name="k", minimum=1, where=type(self).__name__)
        if rollback not in ("checkpoint", "replay"):
            raise InvalidSettingError(f"{type(self).__name__} rollback={rollback!r} is not 'checkpoint' or 'replay'")
        self.target = small_reference() if target is None else target
        self.vocab_size = self.target.vocab_size
        self.max_context = self.target.max_context
        self.k = k
        self.rollback = rollback
        self._oracle = copy.deepcopy(self.target)
        # The engine contract: a settable `drafter` lets the suite drive the engine with its own drafts;
        # None means the internal oracle drafter below.
        self.drafter: object = None
        self.name = f"specproof.zoo.{type(self).__name__}(k={k}, rollback={rollback})"

    def __repr__(self) -> str:
        return f"<{self.name}; bug: {self.bug}>"

    # ------------------------------------------------------------------ the hooks (correct here)

    def _round_bound(self, remaining: int, room: int) -> int:
        """k_eff: a round never drafts past the token budget nor past max_context."""
        return min(self.k, remaining - 1, room - 1)

    def _accept(self, draft: list[int], argmax: list[int]) -> list[int]:
        j = 0
        while j < len(draft) and draft[j] == argmax[j]:
            j += 1
        return [*draft[:j], argmax[j]]

    def _emit(self, accepted: list[int], remaining: int, eos: int | None) -> list[int]:
        emitted = accepted[:remaining]
        if eos is not None and eos in emitted:
            emitted = emitted[: emitted.index(eos) + 1]
        return emitted

    def _kept(self, keep: int) -> int:
        return keep

    def _take(self, proposed: Sequence[int], k_eff: int) -> list[int]:
        """The draft verified: what the drafter sent, cut to ``k_eff`` and before an id outside the vocabulary
        (the hostile-drafter rule, docs/contract.md: cut or refuse, never trust)."""
        draft: list[int] = []
        for t in list(proposed)[:k_eff]:
            if not 0 <= int(t) < self.vocab_size:
                break
            draft.append(int(t))
        return draft

    def _restore(self, snapshot: ReferenceSnapshot) -> None:
        self.target.restore(snapshot)

    def _commit(self, before: ReferenceSnapshot, draft: list[int]) -> None:
        """Every token fed is kept: the state after verify is already the right one."""

    def _refeed(self, tokens: list[int]) -> list[int]:
        """The tokens replay feeds after restoring the snapshot: ``[ctx[-1], *draft[:j]]``, in order."""
        return tokens

    def _uses_checkpoints(self) -> bool:
        """Rolls back to a checkpoint of the verify forward (with ``rollback='checkpoint'``)."""
        return True

    def _log(self, steps: list[Step], step: Step, *, at_eos: bool) -> None:
        """Every round is recorded, the one that reaches EOS included."""
        steps.append(step)

    # ------------------------------------------------------------------ generation

    def generate(self, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None) -> Generation:
        target = self.target
        ctx, eos = self._check_request(prompt, max_new_tokens, eos_token_id)
        drafter = self._drafter_for(ctx, max_new_tokens)
        target.reset()
        prefill = 0
        if len(ctx) > 1:
            target.forward(ctx[:-1])
            prefill = 1
        out: list[int] = []
        steps: list[Step] = []
        tally = _Tally(self.k)
        stop: StopReason = "max_new_tokens"
        while len(out) < max_new_tokens:
            room = target.max_context - target.processed
            if room < 1:
                stop = "context_full"
                break
            emitted = self._round(ctx, drafter, max_new_tokens - len(out), room, eos, steps, tally)
            ctx.extend(emitted)
            out.extend(emitted)
            if eos is not None and eos in emitted:
                stop = "eos"
                break
        return Generation(tokens=out, stop_reason=stop, steps=tuple(steps), stats=tally.stats(steps, out, prefill))

    def _check_request(
        self, prompt: Sequence[int], max_new_tokens: int, eos_token_id: int | None
    ) -> tuple[list[int], int | None]:
        """The prompt as a list and the EOS id, or the contract's error for a bad one."""
        ctx = [int(t) for t in prompt]
        if not ctx:
            raise EmptyPromptError(f"{self.name}: the prompt is empty; it needs at least the pending token")
        bad = next((i for i, t in enumerate(ctx) if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise TokenRangeError(f"{self.name}: prompt[{bad}]={ctx[bad]} is outside [0, {self.vocab_size})")
        int_at_least(max_new_tokens, name="max_new_tokens", minimum=0, where=self.name)
        if eos_token_id is not None and (
            isinstance(eos_token_id, bool)
            or not isinstance(eos_token_id, (int, np.integer))
            or not 0 <= eos_token_id < self.vocab_size
        ):
            raise TokenRangeError(f"{self.name}: eos_token_id={eos_token_id!r} is not an id in [0, {self.vocab_size})")
        return ctx, None if eos_token_id is None else int(eos_token_id)

    def _drafter_for(self, ctx: list[int], max_new_tokens: int) -> Any:
        """The suite's drafter (reset) when one is installed, else an oracle of the greedy continuation."""
        drafter = self.drafter
        if drafter is None:
            continuation = greedy_decode(self._oracle, ctx, max_new_tokens + self.k).tokens
            return OracleDrafter(ctx, continuation, vocab_size=self.vocab_size)
        if callable(getattr(drafter, "reset", None)):
            drafter.reset()  # type: ignore[attr-defined]
        return drafter

    def _round(
        self,
        ctx: list[int],
        drafter: Any,
        remaining: int,
        room: int,
        eos: int | None,
        steps: list[Step],
        tally: _Tally,
    ) -> list[int]:
        """One draft-verify-accept round through the hooks; logs its step and returns the tokens it emitted."""
        target = self.target
        k_eff = self._round_bound(remaining, room)
        base = target.processed
        before = target.snapshot()
        draft = self._take(drafter.propose(ctx, k_eff), k_eff) if k_eff > 0 else []
        fed = [ctx[-1], *draft]
        checkpoints: list[object] | None = None
        if self.rollback == "checkpoint":
            logits, checkpoints = target.forward_with_checkpoints(fed)
        else:
            logits = target.forward(fed)
        tally.verify += 1
        argmax = [int(i) for i in np.argmax(logits, axis=1)]
        accepted = self._accept(draft, argmax)
        emitted = self._emit(accepted, remaining, eos)
        keep = self._kept(len(emitted))
        if keep < len(fed):
            tally.replay += self._roll_back(fed, keep, checkpoints, before)
        else:
            self._commit(before, draft)
        at_eos = eos is not None and eos in emitted
        step = Step(base=base, draft=draft, argmax=argmax, accepted=accepted, processed=target.processed)
        self._log(steps, step, at_eos=at_eos)
        tally.count(draft, accepted)
        return emitted

    def _roll_back(self, fed: list[int], keep: int, checkpoints: list[object] | None, before: ReferenceSnapshot) -> int:
        """Back to ``keep`` tokens of ``fed``; returns the replay forwards it ran (0 or 1)."""
        if checkpoints is not None and self._uses_checkpoints():
            self._restore(checkpoints[keep - 1] if keep > 0 else before)  # type: ignore[arg-type]
            return 0
        self._restore(before)
        if keep > 0:
            self.target.forward(self._refeed(fed[:keep]))
            return 1
        return 0


class _Tally:
    """The counters of one ``ZooEngine.generate`` call, turned into its ``Stats`` at the end."""

    def __init__(self, k: int) -> None:
        self.verify = self.replay = self.drafted = self.accepted = 0
        self.attempts = [0] * k
        self.accepts = [0] * k

    def count(self, draft: list[int], accepted: list[int]) -> None:
        self.drafted += len(draft)
        self.accepted += len(accepted) - 1
        for p in range(len(draft)):
            if p == len(self.attempts):  # a draft longer than k (only an engine that trusts one gets here)
                self.attempts.append(0)
                self.accepts.append(0)
            self.attempts[p] += 1
            self.accepts[p] += p < len(accepted) - 1

    def stats(self, steps: list[Step], out: list[int], prefill: int) -> Stats:
        return Stats(
            rounds=len(steps),
            emitted=len(out),
            prefill_forwards=prefill,
            verify_forwards=self.verify,
            replay_forwards=self.replay,
            drafted=self.drafted,
            accepted=self.accepted,
            position_attempts=tuple(self.attempts),
            position_accepts=tuple(self.accepts),
        )


class DraftsPastK(ZooEngine):
    """Asks the drafter for ``k + 1`` tokens: the draft length counts the bonus token.

    Shipped as: ``num_speculative_tokens`` read as "tokens per round" (draft plus the
    target's own token) in one place and as the draft length in another, so the verify
    forward scores one draft token more than the engine was configured for.
    """

    bug = "drafts k + 1 tokens per round"

    def _round_bound(self, remaining: int, room: int) -> int:
        return min(self.k + 1, remaining - 1, room - 1)


class ReplaysDespiteCheckpoints(ZooEngine):
    """Says ``rollback='checkpoint'`` and computes checkpoints, but rolls back by snapshot and replay.

    Shipped as: a checkpointing verify kernel whose checkpoints are dropped on the way
    back to the scheduler, which falls back to restoring the round's snapshot and
    re-feeding the accepted tokens: the right tokens, at the cost of an extra forward.
    """

    bug = "replays on rejection although it checkpoints"

    def _uses_checkpoints(self) -> bool:
        return False


class DropsLastStepAtEos(ZooEngine):
    """The round that reaches EOS is not recorded in ``steps``: its tokens appear from nowhere.

    Shipped as: a step log appended after the loop's EOS check, so the ``break`` on EOS
    skips the last round's record (traces then cannot account for the final tokens).
    """

    bug = "the round that emits EOS is missing from steps"

    def _log(self, steps: list[Step], step: Step, *, at_eos: bool) -> None:
        if not at_eos:
            steps.append(step)


class ForgetsRecurrentRestore(ZooEngine):
    """On rejection, rolls back ``processed`` (the KV length) but leaves conv/rec state as verify left them.

    Shipped as: KV-cache "cropping" applied to a hybrid model (transformers' LFM2 and
    Qwen3-Next assisted generation): the attention cache is trimmed, the short-conv
    window and the delta-rule state keep the rejected tokens folded in.
    """

    bug = "rollback restores processed but not conv_state/rec_state"

    def _restore(self, snapshot: ReferenceSnapshot) -> None:
        current = self.target.snapshot()
        self.target.restore(attrs.evolve(snapshot, conv_state=current.conv_state, rec_state=current.rec_state))


class ProcessedOffByOne(ZooEngine):
    """On rejection, rolls the target back to ``base + len(accepted) - 1``: one token too many.

    Shipped as: llama.cpp-style cache rewinds that drop one entry too many (the new
    pending token's predecessor is never fed, so the KV length lags the context).
    """

    bug = "rollback keeps one token fewer than it must"

    def _kept(self, keep: int) -> int:
        return keep - 1


class AcceptsPastMismatch(ZooEngine):
    """Accepts one draft token past the first mismatch (``draft[:j + 1] + [argmax[j + 1]]``).

    Shipped as: an accept loop that compares after advancing its index (``j += 1``
    before the test), so the first rejected draft token is kept.
    """

    bug = "keeps the first mismatching draft token"

    def _accept(self, draft: list[int], argmax: list[int]) -> list[int]:
        j = 0
        while j < len(draft) and draft[j] == argmax[j]:
            j += 1
        if j < len(draft):
            j += 1
        return [*draft[:j], argmax[j]]


class DropsBonusToken(ZooEngine):
    """Never emits the target's own token ``argmax[j]`` after accepted draft tokens.

    Shipped as: engines that emit only the accepted draft tokens and waste the bonus
    token the verify forward computed (still lossless, one token slower per round,
    and not the accept rule). When nothing is accepted it emits ``argmax[0]`` so the
    round makes progress.
    """

    bug = "drops argmax[j] after accepted draft tokens"

    def _accept(self, draft: list[int], argmax: list[int]) -> list[int]:
        accepted = super()._accept(draft, argmax)
        return accepted[:-1] or accepted


class EmitsAfterEos(ZooEngine):
    """Does not cut a round's accepted tokens at EOS: tokens after an accepted EOS are emitted too.

    Shipped as: engines that check for EOS only on the last token of a round, so an
    EOS inside an accepted draft is followed by the rest of the draft.
    """

    bug = "no truncation at an EOS inside the accepted tokens"

    def _emit(self, accepted: list[int], remaining: int, eos: int | None) -> list[int]:
        return accepted[:remaining]


class StaleStateAfterZeroDraft(ZooEngine):
    """After a round with an empty draft, the recurrent state of that step is not committed.

    Shipped as: vLLM's hybrid-model spec decode, where a request with zero draft
    tokens in a step skipped the state-cache write, so the next step started from
    the previous step's conv/recurrent state (the KV append did happen).
    """

    bug = "a zero-draft round leaves conv/rec state as they were before it"

    def _commit(self, before: ReferenceSnapshot, draft: list[int]) -> None:
        if not draft:
            after = self.target.snapshot()
            self.target.restore(attrs.evolve(after, conv_state=before.conv_state, rec_state=before.rec_state))


class RefeedsAcceptedFirst(ZooEngine):
    """Replay rollback that re-feeds the accepted draft tokens *before* the pending token.

    Shipped as: a replay path that rebuilds the tokens to re-feed from the accepted list
    (``accepted[:-1]``) and then appends the round's first token, instead of feeding
    ``[ctx[-1], *draft[:j]]`` in order: the KV length is right, the state is not.
    """

    bug = "replay re-feeds draft[:j] + [pending] instead of [pending] + draft[:j]"

    def __init__(self, *, k: int = 4, rollback: str = "replay", target: ReferenceHybrid | None = None) -> None:
        super().__init__(k=k, rollback=rollback, target=target)

    def _refeed(self, tokens: list[int]) -> list[int]:
        return [*tokens[1:], tokens[0]]


class EosMaskedByLengthCap(ZooEngine):
    """Cuts a round at ``max_new_tokens`` first and looks for EOS only in the last emitted token.

    Shipped as: engines whose stop check runs after the length cap and tests only the
    final token, so an EOS inside the last accepted block is emitted and followed by more.
    """

    bug = "EOS inside the last accepted block is hidden by the length cap"

    def _emit(self, accepted: list[int], remaining: int, eos: int | None) -> list[int]:
        emitted = accepted[:remaining]
        if len(emitted) == remaining:
            return emitted  # the bug: the budget is reached, so the EOS scan is skipped
        return super()._emit(accepted, remaining, eos)


class LengthCapHidesEosInBlock(ZooEngine):
    """Drafts full blocks past ``max_new_tokens``; a block the cap cuts is checked for EOS at its first token only.

    Shipped as: SGLang's speculative decoding ("the length cap masks the stop token"): the
    finish check, written for one new token per step, tests the block's first token for
    EOS, and a verified block that crosses ``max_new_tokens`` is then finished by length,
    so an EOS accepted *later in the block but inside the budget* is emitted and followed
    by more tokens. It needs a block that crosses the cap with EOS past its first token
    and before the cut: the search rarely draws one, so every engine case runs an explicit
    example of exactly that shape, and ``quick`` catches it there.
    """

    bug = "a block crossing max_new_tokens is cut by length after checking only its first token for EOS"

    def _round_bound(self, remaining: int, room: int) -> int:
        return min(self.k, room - 1)  # drafts past the budget: the block may cross max_new_tokens

    def _emit(self, accepted: list[int], remaining: int, eos: int | None) -> list[int]:
        if len(accepted) > remaining and accepted[0] != eos:
            return accepted[:remaining]  # the bug: finished by length, the rest of the block is not scanned
        return super()._emit(accepted, remaining, eos)

    def generate(self, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None) -> Generation:
        gen = super().generate(prompt, max_new_tokens, eos_token_id=eos_token_id)
        if gen.stop_reason == "eos" and gen.tokens and gen.tokens[-1] != eos_token_id:
            gen = attrs.evolve(gen, stop_reason="max_new_tokens")  # it believes it finished by length
        return gen


class TrustsOverlongDraft(ZooEngine):
    """Trusts the drafter's length: verifies a draft longer than k and emits the whole accepted block.

    Shipped as: engines that bound the budget only through ``k_eff`` (asking for at most
    ``remaining - 1`` tokens) and never check what came back, so a drafter that answers
    with more tokens than asked makes the engine emit past ``max_new_tokens``.
    """

    bug = "a draft longer than asked is verified whole, and the block is not cut at max_new_tokens"

    def _take(self, proposed: Sequence[int], k_eff: int) -> list[int]:
        return [int(t) for t in proposed]

    def _emit(self, accepted: list[int], remaining: int, eos: int | None) -> list[int]:
        if eos is not None and eos in accepted:
            return accepted[: accepted.index(eos) + 1]
        return accepted


class IgnoresSuiteDrafts(ZooEngine):
    """Has a settable ``drafter`` but never calls it: every round verifies the engine's own draft.

    Shipped as: engines whose drafter attribute is read once at construction (or only by
    another code path), so the suite's scripted drafts never reach the rounds and the
    rollback paths they plan go untested.
    """

    bug = "the drafter the suite sets is never asked; the engine drafts for itself"

    def generate(self, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None) -> Generation:
        suite, self.drafter = self.drafter, None
        try:
            return super().generate(prompt, max_new_tokens, eos_token_id=eos_token_id)
        finally:
            self.drafter = suite


class VerifiesOwnDraft(ZooEngine):
    """Asks the suite's drafter every round, then verifies a draft of its own instead.

    Shipped as: an engine that keeps a proposer of its own and calls the configured one
    only for its side effects (or its statistics), so the round reports a draft other
    than the one it was sent.
    """

    bug = "asks the suite for a draft, then verifies its own"

    def generate(self, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None) -> Generation:
        suite = self.drafter
        if suite is None:
            return super().generate(prompt, max_new_tokens, eos_token_id=eos_token_id)
        continuation = greedy_decode(self._oracle, [int(t) for t in prompt], max_new_tokens + self.k).tokens
        own = OracleDrafter(prompt, continuation, vocab_size=self.vocab_size)

        class _Own:
            def reset(self) -> None:
                if callable(getattr(suite, "reset", None)):
                    suite.reset()  # type: ignore[attr-defined]

            def propose(self, context: Sequence[int], k: int) -> list[int]:
                suite.propose(context, k)  # type: ignore[attr-defined]
                return own.propose(context, k)

        self.drafter = _Own()
        try:
            return super().generate(prompt, max_new_tokens, eos_token_id=eos_token_id)
        finally:
            self.drafter = suite


class OwnDraftsEngine(ZooEngine):
    """Correct: drafts for itself and declares no ``suite_drafts`` capability; judged on its own drafts."""

    bug = "none (correct: takes no drafts from the suite)"
    capabilities = frozenset({"state"})  # declared: its state can be read, but no suite_drafts


class VaryingK(ZooEngine):
    """Correct but unusual: a different k every round (1..k, cycling). Certification must accept it."""

    bug = "none (correct: k varies per round)"

    def generate(self, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None) -> Generation:
        inner = self.drafter
        cycle = [0]

        class _Varying:
            def reset(self) -> None:
                cycle[0] = 0
                if callable(getattr(inner, "reset", None)):
                    inner.reset()  # type: ignore[attr-defined]

            def propose(self, context: Sequence[int], k: int) -> list[int]:
                cycle[0] += 1
                kk = min(k, 1 + cycle[0] % max(k, 1))
                return list(inner.propose(context, kk)) if inner is not None else []  # type: ignore[attr-defined]

        if inner is None:
            return super().generate(prompt, max_new_tokens, eos_token_id=eos_token_id)
        self.drafter = _Varying()
        try:
            return super().generate(prompt, max_new_tokens, eos_token_id=eos_token_id)
        finally:
            self.drafter = inner


class OwnCopyEngine(ZooEngine):
    """Correct: decodes on a private copy of the model and exposes ``target`` as a same-model copy.

    Earlier versions of the contract said ``target`` is "a Target of the same model"; an
    engine following that must not be failed: the harness sees that ``target`` never moves
    and uses it as an oracle (lossless only), saying so in the certificate.
    """

    bug = "none (correct: decodes on its own copy of the model)"

    def __init__(self, *, k: int = 4, rollback: str = "checkpoint", target: ReferenceHybrid | None = None) -> None:
        super().__init__(k=k, rollback=rollback, target=target)
        self._live = self.target
        self.target = copy.deepcopy(self._live)  # what it exposes: a copy it never decodes on

    def generate(self, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None) -> Generation:
        exposed, self.target = self.target, self._live
        try:
            return super().generate(prompt, max_new_tokens, eos_token_id=eos_token_id)
        finally:
            self.target = exposed


class OracleOnlyEngine(OwnCopyEngine):
    """Correct: decodes on its own copy and exposes the model as ``oracle`` (the contract's way)."""

    bug = "none (correct: exposes `oracle`, no live target)"

    def __init__(self, *, k: int = 4, rollback: str = "checkpoint", target: ReferenceHybrid | None = None) -> None:
        super().__init__(k=k, rollback=rollback, target=target)
        self.oracle = self.target
        del self.target

    def generate(self, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None) -> Generation:
        self.target = self._live
        try:
            return ZooEngine.generate(self, prompt, max_new_tokens, eos_token_id=eos_token_id)
        finally:
            del self.target


class GreedyOnlyEngine(OracleOnlyEngine):
    """Correct, black-box: no steps, no model exposed, only ``greedy(prompt, n)`` as the oracle; it reports
    ``stats`` (its drafted tokens show it speculates)."""

    bug = "none (correct: black-box with greedy())"

    def __init__(self, *, k: int = 4, rollback: str = "checkpoint", target: ReferenceHybrid | None = None) -> None:
        super().__init__(k=k, rollback=rollback, target=target)
        self._greedy_model = self.oracle
        del self.oracle

    def greedy(self, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
        return list(greedy_decode(copy.deepcopy(self._greedy_model), list(prompt), max_new_tokens).tokens)

    def generate(self, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None) -> Generation:
        gen = super().generate(prompt, max_new_tokens, eos_token_id=eos_token_id)
        # no steps; its stats show that it drafted (a black-box engine with neither is never seen speculating)
        return Generation(tokens=gen.tokens, stop_reason=gen.stop_reason, stats=gen.stats)


class RaisesEveryCall(ZooEngine):
    """``engine.lossless``: ``generate`` raises on every call; nothing may pass on it."""

    bug = "generate always raises"

    def generate(self, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None) -> Generation:
        raise RuntimeError("engine crashed (zoo: RaisesEveryCall)")


class LeaksPlaceholderId(ZooEngine):
    """``engine.lossless``: after an EOS stop it returns one slot past its output, still holding the placeholder
    id ``-1`` its output buffer was filled with (vLLM's ``PLACEHOLDER_TOKEN_ID``): an id outside the vocabulary."""

    bug = "an output slot holding the placeholder id -1 after an EOS stop"

    def generate(self, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None) -> Generation:
        gen = super().generate(prompt, max_new_tokens, eos_token_id=eos_token_id)
        if gen.stop_reason != "eos":
            return gen
        return attrs.evolve(gen, tokens=(*gen.tokens, -1))
