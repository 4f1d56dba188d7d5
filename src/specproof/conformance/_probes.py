"""What wraps the drafter an engine is given: the state probe and the hostile drafter.

``StateProbe`` watches every proposal the engine asks for (the live target's state, the
features handed to a feature drafter, the drafts handed out); ``HostileDrafter`` answers
with drafts an engine must cut or refuse (docs/contract.md, "Engines").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from specproof.conformance._judges import JudgeMemo
from specproof.conformance._records import Proposal
from specproof.conformance.checks.features import FeatureJudge, feature_layers_of
from specproof.contract import live_state_differs
from specproof.engine import CapacityError, Drafter, Target

__all__ = ["HostileDrafter", "NoDrafter", "StateProbe"]


class StateProbe:
    """Wraps the drafter the engine is given; at every proposal compares the live target's state.

    When the engine asks for a draft, the previous round's rollback is done, so its live
    target must be the target plain decoding of ``ctx[:-1]`` gives. A trusted reference
    (a fresh copy of the model) is fed the new context tokens with plain forwards, and the
    live target's ``state_arrays()`` are compared with it (exact at ``atol`` 0). What it
    finds is recorded as violation fields (``found``) for the registry's state invariant.
    """

    def __init__(
        self,
        inner: Drafter,
        live: object,
        make_reference: Callable[[], Target] | None,
        *,
        atol: float,
        judges: JudgeMemo,
        feature_layers: tuple[int, ...] | None = None,
    ) -> None:
        self.inner = inner
        # a feature drafter's layers (docs/contract.md, "Feature drafters"): the probe declares them, so
        # the engine hands it features, and judges them (engine.features) before passing them on
        self.feature_layers = feature_layers
        self.features = (
            FeatureJudge(make_reference, feature_layers, atol=atol, live=live)
            if feature_layers is not None and make_reference is not None
            else None
        )
        self.live = live
        self.make_reference = make_reference
        self.reference: Target | None = None
        self.atol = atol
        self.judges = judges
        self.found: list[dict[str, Any]] = []
        self.checks = 0
        self._fed = 0
        self._round = 0
        self.proposals: list[Proposal] = []  # every draft handed to the engine (engine.drafts-used)
        self.name = getattr(inner, "name", type(inner).__name__)

    def reset(self) -> None:
        reset = getattr(self.inner, "reset", None)
        if callable(reset):
            reset()

    @property
    def white_box(self) -> bool:
        return self.make_reference is not None and callable(getattr(self.live, "state_arrays", None))

    def check(self, context: Sequence[int], *, when: str) -> None:
        if self.make_reference is None or self.found:
            return
        want = len(context) - 1
        try:
            if self.reference is None:
                self.reference = self.judges.at(self.make_reference, context[:want])  # fed by forwards only
                self._fed = want
            elif want > self._fed:
                self.reference.forward(list(context[self._fed : want]))
                self._fed = want
        except CapacityError:
            # the engine ran its context past max_context: the stop and KV-length checks say so;
            # there is no plain-decoding state to compare with
            self.make_reference = None
            return
        if not self.white_box:
            return
        if int(self.live.processed) != want:  # type: ignore[attr-defined]
            return  # the KV-length check reports this; comparing states would only repeat it
        self.checks += 1
        # a wire view compares itself: digests, or a CRC-32 saying rows changed after they were reported
        why = live_state_differs(self.reference.state_arrays(), self.live, atol=self.atol)  # type: ignore[union-attr]
        if why is not None:
            self.found.append(
                {
                    "round": self._round if when == "round" else None,
                    "explanation": f"{when}: the live target is not the target plain decoding of ctx[:-1] gives: {why}",
                    "example": {"context_length": len(context)},
                }
            )

    def propose(self, context: Sequence[int], k: int, **kwargs: Any) -> Sequence[int]:
        self.check(context, when="round")
        features = kwargs.get("features")
        if self.features is not None:
            self.features.check(context, features, round_index=self._round)
        self._round += 1
        if features is not None and feature_layers_of(self.inner) is not None:
            draft = self.inner.propose(context, k, features=features)  # type: ignore[call-arg]
        else:
            draft = self.inner.propose(context, k)
        # a sized sequence only: a generator is handed on untouched (the engine must reject it)
        tokens = tuple(draft) if hasattr(draft, "__len__") and not isinstance(draft, (str, bytes)) else ()
        hostile = bool(getattr(self.inner, "last_hostile", False))
        self.proposals.append(Proposal(context_length=len(context), k=int(k), draft=tokens, hostile=hostile))
        if self.features is not None:
            self.features.saw(context, tokens, round_index=self._round - 1)
        return draft

    @property
    def refused_hostile(self) -> bool:
        """The last draft handed out was hostile (over-long or out of range): a refusal is allowed."""
        return bool(self.proposals) and self.proposals[-1].hostile


class HostileDrafter:
    """The hostile-drafter rule (docs/contract.md, "Engines"): drafts an engine must cut or refuse.

    Wraps the suite's scripted drafter. From its ``start``-th call on it answers
    ``overlong``: the greedy continuation, ``extra`` tokens longer than the k asked for (an
    engine that trusts the draft accepts every token of it and runs past ``max_new_tokens``);
    ``out_of_range``: the scripted draft with its last token replaced by an id outside the
    vocabulary. ``last_hostile`` says whether the last answer broke the rule, so a refusal
    right after it is told apart from a crash.
    """

    MODES = ("overlong", "out_of_range")

    def __init__(
        self,
        inner: Drafter,
        prompt: Sequence[int],
        continuation: Sequence[int],
        *,
        mode: str,
        extra: int,
        start: int,
        vocab_size: int,
    ) -> None:
        if mode not in self.MODES:
            raise ValueError(f"HostileDrafter mode={mode!r} is not one of {self.MODES}")
        self.inner = inner
        self.prompt_length = len(prompt)
        self.continuation = [int(t) for t in continuation]
        self.mode, self.extra, self.start, self.vocab_size = mode, extra, start, vocab_size
        self.calls = 0
        self.last_hostile = False
        self.name = f"HostileDrafter({mode}, +{extra}, from call {start})"

    def reset(self) -> None:
        self.calls = 0
        self.last_hostile = False
        reset = getattr(self.inner, "reset", None)
        if callable(reset):
            reset()

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        draft = [int(t) for t in self.inner.propose(context, k)]
        self.calls += 1
        self.last_hostile = False
        if self.calls <= self.start:
            return draft
        if self.mode == "overlong":
            pos = len(context) - self.prompt_length
            longer = self.continuation[pos : pos + int(k) + self.extra]
            if len(longer) > int(k):
                self.last_hostile = True
                return longer
            return draft
        if draft:
            draft[-1] = self.vocab_size + self.extra - 1
            self.last_hostile = True
        return draft


class NoDrafter:
    """The probe's inner drafter when the engine drafts for itself (never asked)."""

    def propose(self, context: Sequence[int], k: int) -> list[int]:  # pragma: no cover - never installed
        return []
