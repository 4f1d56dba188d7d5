"""Which compute units a function's input shapes allow: the Neural Engine runs fixed and enumerated shapes, a
range shape only at its default.

Apple's rule (developer forums thread 724930, answered by an Apple engineer): "For models with range
flexibility, we currently only support running on the Neural Engine for the input's default shape. Other
shapes will be run on either GPU or CPU"; with enumerated shapes "each shape should be able to run on the
Neural Engine" (coremltools' "Flexible Input Shapes" guide: enumerated shapes for best performance). A
function whose inputs are all fixed is eligible for the Neural Engine; whether its ops and states then run
there is decided by Core ML on the device (docs/coreml.md, "Where a layout runs").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import attrs

__all__ = ["ComputeUnits", "compute_units"]

ANE_RANGE_RULE: Final = (
    "a range-shaped input runs on the Neural Engine only at its default shape, other shapes on the CPU or GPU "
    "(Apple, developer forums thread 724930)"
)


@attrs.frozen(kw_only=True)
class ComputeUnits:
    """``units``: where every length the function takes may run (``cpu``, ``gpu``, ``neural_engine``);
    ``neural_engine``: ``all-shapes`` | ``default-shape-only``; ``detail``: why."""

    units: tuple[str, ...]
    neural_engine: str
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"units": list(self.units), "neural_engine": self.neural_engine, "detail": self.detail}


def compute_units(inputs: Sequence[Any]) -> ComputeUnits:
    """The compute units the shapes of ``inputs`` (``TensorInfo``) allow."""
    ranged = [t for t in inputs if t.shape_kind == "range"]
    if ranged:
        names = ", ".join(f"{t.name!r} {t.shape_text()}" for t in ranged)
        return ComputeUnits(
            units=("cpu", "gpu"),
            neural_engine="default-shape-only",
            detail=f"{names}: {ANE_RANGE_RULE}",
        )
    enumerated = [t.name for t in inputs if t.shape_kind == "enumerated"]
    how = f"enumerated shapes ({', '.join(enumerated)}) each" if enumerated else "every input has a fixed shape: it"
    return ComputeUnits(
        units=("cpu", "gpu", "neural_engine"),
        neural_engine="all-shapes",
        detail=f"{how} may run on the Neural Engine (Apple, developer forums thread 724930); the device decides "
        "whether its ops and states do",
    )
