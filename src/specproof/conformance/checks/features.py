"""Feature invariants (docs/contract.md, "Feature drafters"): ``engine.features`` and ``drafter.features``.

- ``FeatureJudge`` checks, at every proposal an engine asks of a feature drafter, that the
  features it hands over are the target's features of exactly the accepted positions
  (``context[:-1]``): computed independently on a fresh copy of the model, fed by plain
  ``forward_with_features`` calls, never by the engine's rollback path.
- ``check_drafter_features`` walks a feature drafter along a decoding with accepts and
  rejects (and an edited context, as a session request reusing a prefix) and requires
  every proposal to equal a fresh drafter's given the same context and features, and the
  proposal it makes computing the features itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from specproof.contract import Violation
from specproof.engine import Target
from specproof.plugins import load_target

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._registry import Invariant

__all__ = ["FeatureJudge", "check_drafter_features", "feature_layers_of"]


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


class _Features:
    """A fresh target fed ``tokens`` by plain ``forward_with_features`` calls; its rows per layer."""

    def __init__(self, make_target: Callable[[], Target], layers: tuple[int, ...]) -> None:
        self.make_target = make_target
        self.layers = layers
        self.target: Any = None
        self.tokens: list[int] = []
        self.rows: dict[int, list[np.ndarray]] = {}

    def upto(self, tokens: Sequence[int]) -> dict[int, np.ndarray]:
        want = [int(t) for t in tokens]
        if self.target is None or want[: len(self.tokens)] != self.tokens:
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


def _close(a: np.ndarray, b: np.ndarray, atol: float) -> bool:
    if a.shape != b.shape:
        return False
    return bool(np.array_equal(a, b)) if atol == 0 else bool(np.all(np.abs(a - b) <= atol))


class FeatureJudge:
    """Judges what an engine hands a feature drafter at each proposal (``engine.features``)."""

    def __init__(self, make_reference: Callable[[], Target], layers: tuple[int, ...], *, atol: float) -> None:
        self.reference = _Features(make_reference, layers)
        self.layers = layers
        self.atol = atol
        self.checks = 0
        self.found: list[dict[str, Any]] = []  # breaches as violation fields (the registry names the invariant)

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
                self._fail(
                    f"round {round_index}: features[{layer}] has shape {arr.shape}, expected one row per accepted "
                    f"position: [{n}, d_model] for a context of {len(context)} tokens",
                    example,
                )
                return
            ref = want[layer]
            if n == 0 or _close(arr, ref, self.atol):  # no rows: [0, d_model] and [0, 0] hold the same nothing
                continue
            bad = next(i for i in range(n) if not _close(arr[i], ref[i], self.atol))
            self._fail(
                f"round {round_index}: features[{layer}] row {bad} (position {bad} of {n} accepted) is not the "
                f"target's feature at that position{self._diagnose(arr[bad], bad, want, layer, n)}",
                example,
            )
            return

    def _diagnose(self, row: np.ndarray, i: int, want: Mapping[int, np.ndarray], layer: int, n: int) -> str:
        for other in (i - 1, i + 1):
            if 0 <= other < n and _close(row, want[layer][other], self.atol):
                return f": it is position {other}'s (features shifted by {i - other:+d} against the tokens)"
        for other_layer, rows in want.items():
            if other_layer != layer and _close(row, rows[i], self.atol):
                return f": it is layer {other_layer}'s (the wrong layer)"
        return " (a rejected draft position's, a stale request's, or another layer's)"

    def _fail(self, explanation: str, example: dict[str, object]) -> None:
        self.found.append({"explanation": explanation, "example": example})


def check_drafter_features(
    inv: Invariant,
    make: Callable[[], Any],
    context: Sequence[int],
    ks: Sequence[int],
    accepts: Sequence[int],
    bonus: Sequence[int],
    *,
    edit_at: int | None,
) -> tuple[list[Violation], int, str]:
    """``drafter.features``: (violations, proposals compared, note when nothing was compared).

    The walk starts on ``context``; each round the drafter proposes with the features of
    ``ctx[:-1]`` (from a fresh copy of its declared ``feature_target_spec``), ``accepts[i]`` of its
    draft tokens are kept and ``bonus[i]`` follows; at round ``edit_at`` the context is cut back
    to half and continued differently (a request reusing a prefix). Every proposal must equal a
    fresh drafter's on the same context and features, and the one it makes without features.
    """
    drafter = make()
    layers = feature_layers_of(drafter)
    if layers is None:
        return [], 0, "not a feature drafter (it declares no feature_layers)"
    spec = getattr(drafter, "feature_target_spec", None)
    if not isinstance(spec, str) or not spec:
        return [], 0, "the feature drafter names no feature_target_spec to compute its features with"
    source = _Features(lambda: load_target(spec), layers)
    reset = getattr(drafter, "reset", None)
    if callable(reset):
        reset()
    ctx = [int(t) for t in context]
    compared = 0
    for i, k in enumerate(ks):
        if edit_at is not None and i == edit_at and len(ctx) > 2:
            ctx = [*ctx[: len(ctx) // 2], int(bonus[(i + 1) % len(bonus)])]
        if len(ctx) < 2:
            ctx.append(int(bonus[i % len(bonus)]))
        views = _read_only(source.upto(ctx[:-1]))
        example = {"context": list(ctx), "k": k, "round": i, "accepted_before": list(accepts[:i])}
        try:
            got = [int(t) for t in drafter.propose(list(ctx), k, features=views)]
            fresh = [int(t) for t in make().propose(list(ctx), k, features=views)]
            own = [int(t) for t in make().propose(list(ctx), k)]
        except Exception as exc:
            return [inv.violation(explanation=f"propose raised {exc!r}", example=example)], compared, ""
        compared += 1
        breach = _proposal_breach(inv, i, got=got, fresh=fresh, own=own, example=example)
        if breach is not None:
            return [breach], compared, ""
        j = min(int(accepts[i % len(accepts)]), len(got))
        ctx = [*ctx, *got[:j], int(bonus[i % len(bonus)])]
    return [], compared, "" if compared else "no proposal was made"


def _read_only(feats: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Read-only views of the features, so a drafter that writes into them fails loudly."""
    views = {}
    for layer, arr in feats.items():
        v = arr.view()
        v.flags.writeable = False
        views[layer] = v
    return views


def _proposal_breach(
    inv: Invariant, i: int, *, got: list[int], fresh: list[int], own: list[int], example: dict[str, Any]
) -> Violation | None:
    """Round ``i``'s proposal must equal a fresh drafter's on the same features, and that one the draft made
    without features; None when both hold."""
    if got != fresh:
        return inv.violation(
            explanation=f"after {i} rounds of accepts and rejects, the proposal differs from a fresh "
            f"drafter's given the same context and features (its own KV or carried features were not "
            f"rolled back to the accepted prefix)",
            expected=fresh,
            actual=got,
            example=example,
        )
    if fresh != own:
        return inv.violation(
            explanation="given the target's features the draft differs from the draft it makes computing "
            "the features itself (it reads the handed features wrongly: a layer, a position)",
            expected=own,
            actual=fresh,
            example=example,
        )
    return None
