"""The feature oracle: what an engine must hand a feature drafter, and why what it handed is wrong.

``FeatureRows`` is the oracle: a fresh copy of the model fed the accepted context by plain
``forward_with_features`` calls (never by the engine's code path: no rollback, no cache),
its rows per declared layer. ``FeatureJudge`` compares what an engine hands a feature
drafter at a proposal with those rows (docs/contract.md, "Feature drafters"): exactly the
target's features of ``ctx[:-1]``, one row per accepted position, bitwise or within
``atol``. Both the engine-case search (``engine.features``) and the session machine
(``engine.session``, across requests) judge with it.

When a row is wrong the judge first asks whether the engine's *target* is wrong (given its
live target: the target must have processed ``ctx[:-1]`` with the state plain decoding
gives); if so it says so instead of blaming the handoff. Otherwise it names the cause it
can prove: an all-zero row (a position whose feature was never computed: a prefix-cache
hit that served KV but not hidden states), a row of a neighbouring position (shifted),
another declared layer's, the same position's in an earlier context (stale rows from
another request), a draft token's that its round rejected, or none of those.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from specproof.contract import live_state_differs

__all__ = ["FeatureJudge", "FeatureRows", "feature_layers_of"]

_EARLIER = 8  # earlier contexts the oracle remembers (their tokens only) to recognise stale rows


def feature_layers_of(obj: object) -> tuple[int, ...] | None:
    """The ``feature_layers`` a drafter declares, or ``None`` for a plain drafter."""
    raw = getattr(obj, "feature_layers", None)
    if raw is None:
        return None
    try:
        layers = tuple(int(x) for x in raw)
    except (TypeError, ValueError):
        return None
    return layers or None


class FeatureRows:
    """A fresh target fed ``tokens`` by plain ``forward_with_features`` calls; its rows per layer.

    ``upto(tokens)`` extends the fed context when ``tokens`` continues it, else starts over
    on a fresh target (remembering the earlier context's tokens in ``earlier``).
    """

    def __init__(self, make_target: Callable[[], Any], layers: tuple[int, ...]) -> None:
        self.make_target = make_target
        self.layers = layers
        self.target: Any = None
        self.tokens: list[int] = []
        self.rows: dict[int, list[np.ndarray]] = {}
        self.earlier: deque[tuple[int, ...]] = deque(maxlen=_EARLIER)

    def upto(self, tokens: Sequence[int]) -> dict[int, np.ndarray]:
        want = [int(t) for t in tokens]
        if self.target is None or want[: len(self.tokens)] != self.tokens:
            if self.tokens:
                self.earlier.append(tuple(self.tokens))
            self.target = self.make_target()
            self.target.reset()
            self.tokens = []
            self.rows = {layer: [] for layer in self.layers}
        new = want[len(self.tokens) :]
        if new:
            _, feats, _ = self.target.forward_with_features(new, self.layers)
            for layer in self.layers:
                self.rows[layer].append(np.asarray(feats[layer], dtype=np.float32))
            self.tokens = want
        out = {}
        for layer in self.layers:
            parts = self.rows[layer]
            if len(parts) > 1:
                self.rows[layer] = parts = [np.concatenate(parts)]
            out[layer] = parts[0] if parts else np.zeros((0, 0), np.float32)
        return out

    def of(self, tokens: Sequence[int], layer: int) -> np.ndarray:
        """The rows of ``layer`` for ``tokens`` on a separate fresh target (the judge's diagnoses)."""
        target = self.make_target()
        target.reset()
        _, feats, _ = target.forward_with_features([int(t) for t in tokens], (layer,))
        return np.asarray(feats[layer], dtype=np.float32)


def _close(a: np.ndarray, b: np.ndarray, atol: float) -> bool:
    if a.shape != b.shape:
        return False
    return bool(np.array_equal(a, b)) if atol == 0 else bool(np.all(np.abs(a - b) <= atol))


class FeatureJudge:
    """Judges what an engine hands a feature drafter at each proposal against ``FeatureRows``.

    ``check(context, features, round_index=)`` at every proposal; ``saw(context, draft)``
    after it (the draft, to recognise a rejected draft token's row later). ``live`` (optional)
    is the engine's live target: on a wrong row its state is compared first. ``found`` holds
    the first breach as violation fields (``explanation``, ``example``; the caller names
    the invariant), ``checks`` the proposals judged.
    """

    def __init__(
        self, make_reference: Callable[[], Any], layers: tuple[int, ...], *, atol: float, live: object = None
    ) -> None:
        self.reference = FeatureRows(make_reference, layers)
        self.layers = layers
        self.atol = atol
        self.live = live
        self.checks = 0
        self.found: list[dict[str, Any]] = []  # breaches as violation fields (the registry names the invariant)
        self._last: tuple[tuple[int, ...], tuple[int, ...], int] | None = None  # (context, draft, round)

    def saw(self, context: Sequence[int], draft: Sequence[int], *, round_index: int) -> None:
        """The draft the drafter answered at this proposal (a later row may be a rejected token's)."""
        try:
            self._last = (tuple(int(t) for t in context), tuple(int(t) for t in draft), round_index)
        except (TypeError, ValueError):
            self._last = None

    def check(self, context: Sequence[int], features: Mapping[int, Any] | None, *, round_index: int) -> None:
        if self.found:
            return
        n = len(context) - 1
        example: dict[str, object] = {"context_length": len(context), "round": round_index}
        if features is None:
            return  # the engine called the drafter without features: nothing handed, nothing to judge
        self.checks += 1
        want = self.reference.upto(list(context[:n]))
        for layer in self.layers:
            got = features.get(layer) if isinstance(features, Mapping) else None
            if got is None:
                self._fail(f"round {round_index}: no features for layer {layer} (the drafter declared it)", example)
                return
            arr = np.asarray(got, dtype=np.float32)
            if arr.ndim != 2 or arr.shape[0] != n:
                target = self._target_wrong(n)
                self._fail(
                    f"round {round_index}: features[{layer}] has shape {arr.shape}, expected one row per accepted "
                    f"position: [{n}, d_model] for a context of {len(context)} tokens"
                    + (f"; {target}" if target else ""),
                    {**example, "layer": layer, "cause": "target" if target else "shape"},
                )
                return
            ref = want[layer]
            if n == 0 or _close(arr, ref, self.atol):  # no rows: [0, d_model] and [0, 0] hold the same nothing
                continue
            bad = next(i for i in range(n) if not _close(arr[i], ref[i], self.atol))
            cause, why = self._shifted(arr, ref) or self._diagnose(arr[bad], bad, want, layer, list(context))
            self._fail(
                f"round {round_index}: features[{layer}] row {bad} (position {bad} of the {n} accepted, token "
                f"{int(context[bad])}) is not the target's feature at that position{why}",
                {**example, "layer": layer, "position": bad, "cause": cause},
            )
            return

    def _shifted(self, arr: np.ndarray, ref: np.ndarray) -> tuple[str, str] | None:
        """Every row one position off (the first or last padded), when the target itself is right; else None."""
        if len(arr) < 3 or self._target_wrong(len(arr)):
            return None
        if _close(arr[1:], ref[:-1], self.atol):
            return "shifted", ": every row holds the previous position's feature (features shifted by +1)"
        if _close(arr[:-1], ref[1:], self.atol):
            return "shifted", ": every row holds the next position's feature (features shifted by -1)"
        return None

    def _target_wrong(self, n: int) -> str:
        """Why the engine's live target is not at ``ctx[:-1]`` in plain decoding's state; '' if it is (or unseen)."""
        live = self.live
        if live is None or not callable(getattr(live, "state_arrays", None)):
            return ""
        try:
            processed = int(live.processed)  # type: ignore[attr-defined]
        except Exception:
            return ""
        if processed != n:
            return (
                f"the engine's target itself is wrong here: it has processed {processed} tokens, not the {n} "
                "accepted (the features follow the target; fix its position first)"
            )
        reference = self.reference.target
        if reference is None:
            return ""
        try:
            why = live_state_differs(reference.state_arrays(), live, atol=self.atol)
        except Exception:  # a live view that cannot be read now is no evidence either way
            return ""
        if why is None:
            return ""
        return (
            f"the engine's target state itself is wrong here ({why}): the features come from that state, so the "
            "target, not the feature handoff, is what to fix"
        )

    def _diagnose(
        self, row: np.ndarray, i: int, want: Mapping[int, np.ndarray], layer: int, context: list[int]
    ) -> tuple[str, str]:
        """(cause, ``: why``) for row ``i`` of ``layer`` that is not the target's."""
        n = len(context) - 1
        target = self._target_wrong(n)
        if target:
            return "target", f": {target}"
        if not np.any(row):
            return "zeros", (
                ": it is all zeros: no feature was computed for this position (what a prefix cache that restores "
                "KV and recurrent state but keeps no hidden states hands out)"
            )
        for other in (i - 1, i + 1):
            if 0 <= other < n and _close(row, want[layer][other], self.atol):
                return "shifted", f": it is position {other}'s (features shifted by {i - other:+d} against the tokens)"
        for other_layer, rows in want.items():
            if other_layer != layer and _close(row, rows[i], self.atol):
                return "layer", f": it is layer {other_layer}'s (the wrong layer)"
        offered = getattr(self.reference.target, "feature_layers", ()) or ()
        for other_layer in (int(x) for x in offered if int(x) not in want):
            if _close(row, self.reference.of(context[: i + 1], other_layer)[i], self.atol):
                return "layer", f": it is layer {other_layer}'s (the wrong layer; the drafter declared {layer})"
        for earlier in reversed(self.reference.earlier):
            if len(earlier) > i and tuple(context[: i + 1]) != earlier[: i + 1]:
                if _close(row, self.reference.of(earlier[: i + 1], layer)[i], self.atol):
                    split = next(j for j in range(i + 1) if context[j] != earlier[j])
                    return "stale", (
                        f": it is position {i}'s feature in an earlier context ({len(earlier)} tokens, which differs "
                        f"from this one from position {split} on): stale rows from another request"
                    )
        last = self._last
        if last is not None and last[1] and tuple(context[: len(last[0])]) == last[0]:
            before, draft, round_index = last
            seq = [*before, *draft]
            rows = self.reference.of(seq, layer)
            for p in range(len(before), len(seq)):
                if list(context[: p + 1]) != seq[: p + 1] and _close(row, rows[p], self.atol):
                    where = "" if p == i else f", handed as position {i}'s"
                    return "rejected", (
                        f": it is the feature of draft token {seq[p]} at position {p}{where} (drafted in round "
                        f"{round_index} and rejected: a rejected draft position's row)"
                    )
        diff = np.abs(row - want[layer][i])
        return "value", (
            f": it matches no accepted position's, no other layer's, no earlier context's this judge saw and no "
            f"rejected draft token's feature (largest difference {float(diff.max()):.3g} at column "
            f"{int(diff.argmax())})"
        )

    def _fail(self, explanation: str, example: dict[str, object]) -> None:
        self.found.append({"explanation": explanation, "example": example})
