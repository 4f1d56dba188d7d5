"""The one array comparison every check, the stateful machines and the targets use.

Policy (documented in docs/contract.md, tested in tests/contract/test_compare.py):

* **exact** (``atol == 0``): equal as IEEE values. ``+0.0`` equals ``-0.0`` (they behave the
  same in every later sum and product a model makes, and different summation orders
  legitimately produce either); ``NaN`` equals ``NaN`` in the same position (a state that is
  NaN in both is the same state; NaN in logits is ``target.shape``'s business, not a
  difference). Infinities must match in sign and position.
* **within tolerance** (``atol > 0``): ``|a - b| <= atol`` elementwise, with the same NaN and
  infinity rules; never relative (a recurrent state near zero must not get a free pass).

Shapes must be equal; dtypes need not be (values are compared in float64).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = ["arrays_differ", "live_state_differs", "states_differ"]


def _mismatch(a: np.ndarray, b: np.ndarray, atol: float) -> np.ndarray:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    nan_a, nan_b = np.isnan(a64), np.isnan(b64)
    with np.errstate(invalid="ignore"):
        if atol == 0:
            close = a64 == b64  # +0.0 == -0.0 is True; inf == inf only with the same sign
        else:
            close = (np.abs(a64 - b64) <= atol) | ((a64 == b64) & np.isinf(a64))
    return ~(close | (nan_a & nan_b))


def arrays_differ(expected: object, actual: object, *, atol: float, name: str = "array") -> str | None:
    """None when ``actual`` equals ``expected`` under the policy above, else one line saying where and by how much."""
    want, got = np.asarray(expected), np.asarray(actual)
    if want.shape != got.shape:
        return f"{name} has shape {got.shape}, expected {want.shape}"
    if want.size == 0:
        return None
    bad = _mismatch(want, got, atol)
    if not bad.any():
        return None
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    with np.errstate(invalid="ignore"):
        diff = np.abs(want.astype(np.float64) - got.astype(np.float64))
        finite = diff[np.isfinite(diff)]
    worst = f"{float(finite.max()):.3g}" if finite.size else "nan/inf"
    return (
        f"{name} differs at {first}: expected {float(want[first]):.6g}, got {float(got[first]):.6g}; "
        f"max abs diff {worst} over {int(bad.sum())} of {want.size} elements (atol {atol:g})"
    )


def states_differ(expected: Mapping[str, object], actual: Mapping[str, object], *, atol: float) -> str | None:
    """Compare two ``state_arrays()`` dicts: the same names, then every array (all differences, joined)."""
    if set(expected) != set(actual):
        return f"state names {sorted(actual)} != expected {sorted(expected)}"
    problems = [p for name in expected if (p := arrays_differ(expected[name], actual[name], atol=atol, name=name))]
    return "; ".join(problems) if problems else None


def live_state_differs(expected: Mapping[str, object], live: object, *, atol: float) -> str | None:
    """Compare a live target's state with ``expected`` (a reference's ``state_arrays()``).

    A live target that cannot hand over its values — an engine over the wire that sends digests,
    or one whose reported rows changed — compares itself: its ``state_differs(expected, atol=)``
    decides. Any other target's ``state_arrays()`` goes through ``states_differ``.
    """
    own = getattr(live, "state_differs", None)
    if callable(own):
        return own(expected, atol=atol)  # type: ignore[no-any-return]
    return states_differ(expected, live.state_arrays(), atol=atol)  # type: ignore[attr-defined]
