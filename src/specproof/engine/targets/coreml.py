"""``CoreMLTarget``: a ``Target`` over a stateful Core ML ML program (macOS 15+, coremltools >= 9).

The bundle's interface is the one ``specproof bundle export`` writes (and the one
``specproof bundle inspect`` qualifies): inputs ``input_ids`` int32 ``[1, q]`` (a
flexible length) and ``position`` int32 ``[1]``; output ``logits`` ``[1, q, vocab]``;
Core ML states for the KV cache (``key_cache``, ``value_cache``, append-only, the
sequence on axis 2) and the recurrent state (``conv_state``, ``rec_state``).

``processed`` is kept by the target and fed as ``position``. ``snapshot`` copies the
recurrent states with ``MLState.read_state`` (the KV cache is append-only and is not
copied); ``restore`` puts them back with ``MLState.write_state``. A forward longer than
the bundle's token range is split into chunks of its maximum length.

On any other OS, or with an older coremltools, construction raises
``CoreMLUnavailableError`` (a ``MissingDependencyError``): Core ML's ``predict``,
``make_state``, ``read_state`` and ``write_state`` only run on macOS 15+.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import numpy as np
import numpy.typing as npt

from specproof.contract.errors import (
    CapacityError,
    InvalidSettingError,
    MissingDependencyError,
    TargetContractError,
    TokenRangeError,
)

__all__ = ["CoreMLSnapshot", "CoreMLTarget", "CoreMLUnavailableError", "load_spec"]

KV_STATES: Final = ("key_cache", "value_cache")
RECURRENT_STATES: Final = ("conv_state", "rec_state")
COMPUTE_UNITS: Final = ("ALL", "CPU_ONLY", "CPU_AND_GPU", "CPU_AND_NE")
_NEEDS: Final = "needs macOS 15+ (Core ML predict/make_state) and coremltools >= 9.0"


class CoreMLUnavailableError(MissingDependencyError):
    """Core ML cannot run here: not macOS 15+, or coremltools older than 9.0 / without its native module."""


def _macos_version() -> tuple[int, ...]:
    text = platform.mac_ver()[0]
    try:
        return tuple(int(p) for p in text.split(".") if p)
    except ValueError:
        return ()


def import_coremltools(purpose: str) -> Any:
    """``import coremltools`` without its import-time noise, or ``MissingDependencyError`` naming the extra.

    On Linux coremltools logs a warning per native library it cannot load (eight lines of
    ``Failed to load _MLModelProxy`` ...) before every command that reads or writes a bundle;
    those are about ``predict``, which specproof never calls there, so they are silenced.
    """
    import contextlib
    import io
    import logging
    import warnings

    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            previous = logging.root.manager.disable
            logging.disable(logging.WARNING)
            try:
                import coremltools as ct
            finally:
                logging.disable(previous)
    except ImportError as exc:
        raise MissingDependencyError(f"{purpose} needs coremltools: pip install 'specproof[coreml]'") from exc
    return ct


def _require_coreml() -> Any:
    if sys.platform != "darwin":
        raise CoreMLUnavailableError(f"CoreMLTarget {_NEEDS}; this is {platform.system() or sys.platform}")
    version = _macos_version()
    if version and version < (15,):
        raise CoreMLUnavailableError(f"CoreMLTarget {_NEEDS}; this is macOS {'.'.join(map(str, version))}")
    try:
        ct = import_coremltools("CoreMLTarget")
    except MissingDependencyError as exc:
        raise CoreMLUnavailableError(f"CoreMLTarget {_NEEDS}: pip install 'specproof[coreml]'") from exc
    major = int(str(ct.__version__).split(".")[0])
    if major < 9:
        raise CoreMLUnavailableError(f"CoreMLTarget {_NEEDS}; coremltools {ct.__version__} is installed")
    return ct


@attrs.frozen
class CoreMLSnapshot:
    """The recurrent states (fp16 copies) and ``processed`` of a ``CoreMLTarget``; the KV cache is not copied."""

    processed: int
    states: dict[str, npt.NDArray[np.float16]] = attrs.field(eq=False, repr=lambda s: f"<{', '.join(s)}>")
    target_id: int = attrs.field(eq=False, repr=False)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CoreMLSnapshot):
            return NotImplemented
        return (
            self.processed == other.processed
            and self.states.keys() == other.states.keys()
            and all(np.array_equal(self.states[k], other.states[k]) for k in self.states)
        )

    __hash__ = None  # type: ignore[assignment]


def _interface(spec: Any, path: Path) -> tuple[int, int, int, list[str]]:
    """(vocab_size, max_context, max_query, state names) read from the bundle's spec."""
    desc = spec.description
    states = [s.name for s in desc.state]
    if "key_cache" not in states:
        raise InvalidSettingError(f"CoreMLTarget {str(path)!r}: no 'key_cache' state (states: {states or 'none'})")
    kv_shape = list(next(s for s in desc.state if s.name == "key_cache").type.stateType.arrayType.shape)
    if len(kv_shape) != 4:
        raise InvalidSettingError(
            f"CoreMLTarget {str(path)!r}: key_cache shape {kv_shape} is not [layers, kv, ctx, hd]"
        )
    inputs = {f.name: f for f in desc.input}
    for name in ("input_ids", "position"):
        if name not in inputs:
            raise InvalidSettingError(f"CoreMLTarget {str(path)!r}: no {name!r} input (inputs: {sorted(inputs)})")
    arr = inputs["input_ids"].type.multiArrayType
    if arr.WhichOneof("ShapeFlexibility") == "shapeRange":
        hi = int(arr.shapeRange.sizeRanges[-1].upperBound)
        max_query = hi if hi > 0 else int(kv_shape[2])
    elif arr.WhichOneof("ShapeFlexibility") == "enumeratedShapes":
        max_query = max(int(s.shape[-1]) for s in arr.enumeratedShapes.shapes)
    else:
        max_query = int(arr.shape[-1])
    vocab = desc.metadata.userDefined.get("specproof.vocab_size")
    if vocab is None:
        func = next(iter(spec.mlProgram.functions.values()))
        block = func.block_specializations[func.opset]
        out = next(o for op in block.operations for o in op.outputs if o.name == "logits")
        vocab = out.type.tensorType.dimensions[-1].constant.size
    return int(vocab), int(kv_shape[2]), max_query, states


class CoreMLTarget:
    """A ``Target`` (and ``WhiteBoxTarget``) over a stateful ``.mlpackage``, run by Core ML on macOS 15+.

    ``CoreMLTarget(path, *, compute_units="CPU_AND_NE")``; ``compute_units`` is a
    ``coremltools.ComputeUnit`` name (``ALL``, ``CPU_ONLY``, ``CPU_AND_GPU``, ``CPU_AND_NE``).
    """

    _ids = iter(range(1, 1 << 62))

    def __init__(self, path: str | Path, *, compute_units: str = "CPU_AND_NE") -> None:
        if compute_units not in COMPUTE_UNITS:
            raise InvalidSettingError(
                f"CoreMLTarget compute_units={compute_units!r}; one of {', '.join(COMPUTE_UNITS)}"
            )
        ct = _require_coreml()
        p = Path(path)
        if not p.exists():
            raise InvalidSettingError(f"CoreMLTarget: {str(p)!r} does not exist")
        self.path = p
        self._model = ct.models.MLModel(str(p), compute_units=getattr(ct.ComputeUnit, compute_units))
        self.vocab_size, self.max_context, self.max_query, self._state_names = _interface(self._model.get_spec(), p)
        self._recurrent = [n for n in self._state_names if n not in KV_STATES]
        self._id = next(CoreMLTarget._ids)
        self._state = self._model.make_state()
        self._processed = 0

    @property
    def processed(self) -> int:
        return self._processed

    def _check(self, tokens: Sequence[int]) -> list[int]:
        if isinstance(tokens, str):
            raise TokenRangeError("CoreMLTarget.forward: tokens must be a sequence of ints, got str")
        toks = list(tokens)
        for i, t in enumerate(toks):
            if type(t) is not int and not isinstance(t, np.integer):
                raise TokenRangeError(f"CoreMLTarget.forward: tokens[{i}]={t!r} is not an integer token id")
            if not 0 <= t < self.vocab_size:
                raise TokenRangeError(f"CoreMLTarget.forward: tokens[{i}]={int(t)} is outside [0, {self.vocab_size})")
        if self._processed + len(toks) > self.max_context:
            raise CapacityError(
                f"CoreMLTarget.forward: processed={self._processed} + len(tokens)={len(toks)} exceeds "
                f"max_context={self.max_context}; nothing was changed"
            )
        return [int(t) for t in toks]

    def forward(self, tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        """Feed ``tokens`` at ``position = processed`` (in chunks of at most ``max_query``); logits ``[q, vocab]``."""
        toks = self._check(tokens)
        rows = [np.zeros((0, self.vocab_size), np.float32)]
        for start in range(0, len(toks), self.max_query):
            chunk = toks[start : start + self.max_query]
            out = self._model.predict(
                {
                    "input_ids": np.array([chunk], dtype=np.int32),
                    "position": np.array([self._processed], dtype=np.int32),
                },
                state=self._state,
            )
            logits = np.asarray(out["logits"], dtype=np.float32)
            if logits.shape != (1, len(chunk), self.vocab_size):
                raise TargetContractError(
                    f"CoreMLTarget.forward: logits shape {logits.shape}, expected (1, {len(chunk)}, {self.vocab_size})"
                )
            rows.append(logits[0])
            self._processed += len(chunk)
        return np.ascontiguousarray(np.concatenate(rows))

    def snapshot(self) -> CoreMLSnapshot:
        """Copy the recurrent states (``MLState.read_state``) and ``processed``."""
        states = {n: np.array(self._state.read_state(n), dtype=np.float16, copy=True) for n in self._recurrent}
        return CoreMLSnapshot(processed=self._processed, states=states, target_id=self._id)

    def restore(self, snapshot: object) -> None:
        """Write a snapshot's recurrent states back (``MLState.write_state``) and set ``processed``."""
        if not isinstance(snapshot, CoreMLSnapshot) or snapshot.target_id != self._id:
            raise TargetContractError(
                f"CoreMLTarget.restore: expected a CoreMLSnapshot taken from this target, got {type(snapshot).__name__}"
            )
        for name, value in snapshot.states.items():
            self._state.write_state(name, value)
        self._processed = snapshot.processed

    def reset(self) -> None:
        """A fresh ``make_state()`` (zero states) and ``processed = 0``."""
        self._state = self._model.make_state()
        self._processed = 0

    def state_arrays(self) -> dict[str, npt.NDArray[np.float32]]:
        """The device states as float32 copies, KV caches cut to the valid prefix (axis 2)."""
        out: dict[str, npt.NDArray[np.float32]] = {}
        for name in self._state_names:
            value = np.array(self._state.read_state(name), dtype=np.float32)
            out[name] = value[:, :, : self._processed].copy() if name in KV_STATES else value
        return out

    def describe(self) -> str:
        return (
            f"CoreMLTarget {self.path} vocab={self.vocab_size} max_context={self.max_context} "
            f"max_query={self.max_query} states={','.join(self._state_names)}"
        )

    def __repr__(self) -> str:
        return f"<{self.describe()} processed={self._processed}>"


def load_spec(args: str) -> CoreMLTarget:
    """The ``coreml:PATH[,compute_units=UNITS]`` target spec."""
    path, _, options = args.partition(",")
    if not path:
        raise InvalidSettingError("coreml:PATH needs the path of a .mlpackage")
    kwargs: dict[str, str] = {}
    for item in filter(None, options.split(",")):
        key, eq, value = item.partition("=")
        if key != "compute_units" or not eq:
            raise InvalidSettingError(f"coreml target option {item!r}: only compute_units=UNITS is known")
        kwargs["compute_units"] = value.upper()
    return CoreMLTarget(path, **kwargs)
