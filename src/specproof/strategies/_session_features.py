"""Feature drafters in a session: installing them on requests and judging what the engine hands them.

A session request with ``feature_layers`` installs its drafter (the scripted one, or the
engine's own put back) behind a ``FeatureWatch`` that declares those layers: the engine must
then hand it the target's features of exactly ``ctx[:-1]`` at every proposal (docs/contract.md,
"Feature drafters"), whatever its caches did since the last request: a prefix hit, an edit, a
regeneration, a user turn. ``SessionFeatures`` holds one ``FeatureJudge`` per layer set (its
oracle a fresh copy of the model fed plain forwards, shared across requests: it extends its
context when the next continues it), counts what was judged, and words a breach with the
request's facts (was the position one the engine reported serving from its caches?).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from numbers import Integral
from typing import Any

from specproof.strategies._feature_judge import FeatureJudge, feature_layers_of

__all__ = ["FeatureWatch", "SessionFeatures"]

_UNWATCHED = 8  # unwatched requests remembered (as many as the judge's oracle remembers earlier contexts)


class FeatureWatch:
    """The drafter a feature request installs: declares the request's layers, judges what it is handed.

    Wraps the request's drafter; a feature drafter inside is handed the features on, a plain
    one drafts without them.
    """

    def __init__(self, inner: Any, layers: tuple[int, ...], judge: FeatureJudge) -> None:
        self.inner = inner
        self.feature_layers = layers
        self.judge = judge
        self.proposals = 0
        self.name = f"FeatureWatch({getattr(inner, 'name', type(inner).__name__)}, layers={list(layers)})"

    def reset(self) -> None:
        reset = getattr(self.inner, "reset", None)
        if callable(reset):
            reset()

    def propose(self, context: Sequence[int], k: int, **kwargs: Any) -> Sequence[int]:
        features = kwargs.get("features")
        round_index = self.proposals
        self.proposals += 1
        self.judge.check(context, features, round_index=round_index)
        if features is not None and feature_layers_of(self.inner) is not None:
            draft = self.inner.propose(context, k, features=features)
        else:
            draft = self.inner.propose(context, k)
        if hasattr(draft, "__len__") and not isinstance(draft, (str, bytes)):
            self.judge.saw(context, draft, round_index=round_index)
        return draft  # type: ignore[no-any-return]


class SessionFeatures:
    """The feature judging of one session runner.

    ``layers``: the layers a feature request declares (default: those the engine's own drafter
    declares); ``reference``: fresh copies of the model to compute the features with; ``live``:
    the engine's live target, if the runner may look at it (a wrong target is named first).
    """

    def __init__(
        self,
        *,
        layers: Sequence[int] | None,
        own_drafter: object,
        reference: Callable[[], Any] | None,
        atol: float,
        live: object,
    ) -> None:
        given = tuple(int(x) for x in layers) if layers is not None else None
        self.layers = given or feature_layers_of(own_drafter)
        self.reference = reference
        self.atol = atol
        self.live = live
        self._judges: dict[tuple[int, ...], FeatureJudge] = {}
        self.watch: FeatureWatch | None = None  # the current request's, until its breach is read
        self.requests = 0  # requests with a feature drafter whose handed features were judged
        self.proposals = 0  # proposals judged
        self.prefix_hits = 0  # requests among them on a prefix the engine reported serving from its caches
        # the contexts of the latest requests no judge watched (no feature drafter): their rows may come back stale
        self._unwatched: deque[tuple[int, ...]] = deque(maxlen=_UNWATCHED)

    def counts(self) -> tuple[int, int, int]:
        """(requests judged, proposals judged, requests judged on a prefix hit) so far."""
        return self.requests, self.proposals, self.prefix_hits

    @property
    def can_judge(self) -> bool:
        """A model to compute features with is known (a recorded feature request can be replayed)."""
        return self.reference is not None

    @property
    def ready(self) -> bool:
        """Requests may be drawn with a feature drafter: the layers and a model are known."""
        return self.layers is not None and self.reference is not None

    def watched(self, layers: tuple[int, ...] | None, drafter: Any) -> Any:
        """``drafter``, or (``layers`` given) it behind a ``FeatureWatch`` with a cleared judge."""
        self.watch = None
        if layers is None:
            return drafter
        assert self.reference is not None  # the runner refused the request otherwise
        judge = self._judges.get(layers)
        if judge is None:
            judge = self._judges[layers] = FeatureJudge(self.reference, layers, atol=self.atol, live=self.live)
            judge.reference.earlier.extend(self._unwatched)
        judge.found.clear()
        judge.checks = 0
        self.watch = FeatureWatch(drafter, layers, judge)
        return self.watch

    def breach(self, prompt: list[int], gen: Any) -> str | None:
        """What the judge found in the request just run (its counts kept), as a sentence; None when nothing."""
        watch, self.watch = self.watch, None
        if watch is None:
            # a request no judge watched still fills the engine's caches: remembered, a stale row from it is named
            self._unwatched.append(tuple([*prompt, *(int(t) for t in getattr(gen, "tokens", ()))][:-1]))
            for judge in self._judges.values():
                judge.reference.earlier.append(self._unwatched[-1])
            return None
        judge = watch.judge
        reused = getattr(getattr(gen, "stats", None), "prefix_reused", None)
        reused = int(reused) if isinstance(reused, Integral) and not isinstance(reused, bool) else None
        if not judge.found:  # the oracle sees the whole context (so a later request's stale row is recognised)
            judge.reference.upto([*prompt, *(int(t) for t in getattr(gen, "tokens", ()))][:-1])
        if judge.checks:
            self.requests += 1
            self.proposals += judge.checks
            self.prefix_hits += 1 if reused else 0
        if not judge.found:
            return None
        found = judge.found[0]
        position = found["example"].get("position")
        where = ""
        if isinstance(position, int):
            if reused is not None and position < reused:
                where = (
                    f"; position {position} is one the engine served from its caches (it reported reusing the "
                    f"first {reused} of the prompt's {len(prompt) - 1} processed tokens)"
                )
            else:
                where = "; " + _position_in_request(position, len(prompt))
        return (
            f"the features the engine handed its feature drafter (layers {list(watch.feature_layers)}) are wrong: "
            f"{found['explanation']}{where}"
        )


def _position_in_request(position: int, prompt: int) -> str:
    """Where ``position`` lies in a request whose prompt has ``prompt`` tokens (positions ``0..prompt-1``)."""
    if position < prompt - 1:
        return f"position {position} is in the prompt ({prompt} tokens, positions 0-{prompt - 1})"
    if position == prompt - 1:
        return (
            f"position {position} is the prompt's last token (the prompt has {prompt} tokens, positions "
            f"0-{prompt - 1}): the pending token, which this request's first verify forward processed"
        )
    nth = position - prompt + 1
    return (
        f"position {position} holds the {_ordinal(nth)} token this request generated (the prompt has {prompt} "
        f"tokens, positions 0-{prompt - 1})"
    )


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
