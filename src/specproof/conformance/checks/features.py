"""Feature invariants (docs/contract.md, "Feature drafters"): ``engine.features`` and ``drafter.features``.

- ``FeatureJudge`` (``specproof.strategies``, re-exported here: the session machine judges with
  it too) checks, at every proposal an engine asks of a feature drafter, that the features it
  hands over are the target's features of exactly the accepted positions (``context[:-1]``):
  computed independently on a fresh copy of the model, fed by plain ``forward_with_features``
  calls, never by the engine's rollback path. A wrong row is explained by its cause: the
  engine's target state itself (compared first, where the engine shows its live target), an
  all-zero row, a shifted one, another layer's, an earlier request's, a rejected draft's.
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
from specproof.plugins import load_target
from specproof.strategies import FeatureJudge, FeatureRows, feature_layers_of

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._registry import Invariant

__all__ = ["FeatureJudge", "check_drafter_features", "feature_layers_of"]


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
    source = FeatureRows(lambda: load_target(spec), layers)
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
            explanation=f"after {i} round{'' if i == 1 else 's'} of accepts and rejects, the proposal differs "
            f"from a fresh drafter's given the same context and features (its own KV or carried features were not "
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
