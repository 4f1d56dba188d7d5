"""The live view of the state an engine reports (capability ``state``; docs/protocol.md, ``state``).

``WireTargetView`` rebuilds each array from its ``state`` messages (whole arrays, KV deltas checked by
CRC-32, or digests: signed projections per slice) and judges it against the reference's state
(``state_differs``), each test a necessary condition of "within atol".
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from specproof.contract import states_differ
from specproof.wire._digest import DIGEST_KEY_ENV, digest_bound, projections, slice_length
from specproof.wire._errors import EngineProtocolError
from specproof.wire._limits import check_array_shape, check_digest_shape

__all__ = ["WireTargetView", "decode_float32"]

#: what each axis of the reference family's state arrays indexes (names a slice in a digest mismatch)
_AXIS_NAMES: dict[str, tuple[str, ...]] = {
    "key_cache": ("layer", "head", "position", "dim"),
    "value_cache": ("layer", "head", "position", "dim"),
    "conv_state": ("layer", "channel", "tap"),
    "rec_state": ("layer", "head", "key", "value"),
}

_FULL_HINT = (
    "rerun with whole arrays for the element-level detail: $SPECPROOF_WIRE_STATE=full "
    "(full_state=True on ExecEngine/TcpEngine)"
)


def decode_float32(text: str, shape: Sequence[int], what: str) -> tuple[bytes, npt.NDArray[np.float32]]:
    """Base64 of little-endian float32 values (its length already checked against ``shape``): the raw
    bytes and the array; text that is not base64 is an ``EngineProtocolError`` naming ``what``."""
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError as exc:
        raise EngineProtocolError(f"{what} is not base64 ({exc})") from None
    return raw, np.frombuffer(raw, dtype="<f4").astype(np.float32).reshape(tuple(shape))


def _slice_text(name: str, index: tuple[int, ...]) -> str:
    names = _AXIS_NAMES.get(name, ())
    return ", ".join(f"{names[k] if k < len(names) else f'axis {k}'} {i}" for k, i in enumerate(index))


class _Digest:
    """What the client holds of one digested array: the projections of every slice of the request so far."""

    def __init__(self, shape: tuple[int, ...], slice_axes: int, proj: npt.NDArray[np.float32], crc: int) -> None:
        self.shape, self.slice_axes, self.proj, self.crc = shape, slice_axes, proj, crc
        self.axis: int | None = None
        #: slices from this index along ``axis`` (all of them when ``axis`` is None) not yet compared
        self.unchecked_from = 0
        self.checked = False


class WireTargetView:
    """The state the engine last reported: ``processed`` and ``state_arrays()`` (read-only view).

    With ``state_delta`` (docs/protocol.md, ``state``) an array may carry only the indices from
    ``start`` along ``axis``; the rest is taken from the same request's previous state message,
    and the whole array's CRC-32 must equal the engine's. A mismatch means rows the client holds
    changed in the engine since it reported them: ``state_problem`` says so, and the state
    checks report it on ``engine.state-restored``.

    With ``state_digest`` an array may come as signed projections per slice instead of its values
    (``_digest``): ``state_arrays()`` cannot give it, and ``state_differs(expected, atol=)`` — which
    the state checks call — compares the digests with the reference's.
    """

    def __init__(self, vocab_size: int, max_context: int, name: str) -> None:
        self.vocab_size = vocab_size
        self.max_context = max_context
        self.name = f"{name} (live state over the wire)"
        self.processed = 0
        self._arrays: dict[str, npt.NDArray[np.float32]] = {}
        self._digests: dict[str, _Digest] = {}
        self.updates = 0
        #: the arrays a delta may build on (this request's previous state message; none at its start)
        self._base: dict[str, npt.NDArray[np.float32]] = {}
        #: the previous state message's (shape, whole CRC-32) per array: what a digest's prefix must equal
        self._prev: dict[str, tuple[tuple[int, ...], int]] = {}
        #: the client's digest key, in hex: a failure names it so another run can draw the same signs
        self.digest_key: str | None = None
        #: this request's digest parameters (seed, projections per slice), None without state_digest
        self.digest: tuple[int, int] | None = None
        #: why the arrays are not the engine's state (a CRC-32 mismatch), or None
        self.state_problem: str | None = None
        #: arrays sent as deltas, and the rows (indices along the axis) they left out
        self.delta_arrays = 0
        self.rows_left_out = 0
        #: arrays sent as digests, slices compared by digest, and arrays accepted by their CRC-32 alone
        self.digest_arrays = 0
        self.digest_slices_compared = 0
        self.digest_crc_matches = 0

    def state_arrays(self) -> dict[str, npt.NDArray[np.float32]]:
        if self._digests:
            raise ValueError(
                f"{self.name}: the engine sent digests of {sorted(self._digests)}, not their values "
                "(state_digest): compare with state_differs(expected, atol=...), or ask for whole arrays "
                "with full_state=True or $SPECPROOF_WIRE_STATE=full"
            )
        return {name: array.copy() for name, array in self._arrays.items()}

    def fingerprint(self) -> object:
        """What changes when the engine's reported state does, whatever way it travels (digests carry no
        values): ``processed``, each whole array's bytes, each digested array's CRC-32 and sums."""
        whole = tuple((name, a.tobytes()) for name, a in sorted(self._arrays.items()))
        digested = tuple((name, d.crc, d.proj.tobytes()) for name, d in sorted(self._digests.items()))
        return (self.processed, whole, digested)

    def clear(self) -> None:
        self.processed = 0
        self._arrays = {}
        self._digests = {}
        self._base = {}
        self._prev = {}
        self.state_problem = None

    def begin_request(self, *, digest: tuple[int, int] | None = None) -> None:
        """A new request: its first state message must be whole (deltas build on this request only)."""
        self._base = {}
        self._prev = {}
        self.digest = digest
        self.state_problem = None

    def state_differs(self, expected: Mapping[str, npt.ArrayLike], *, atol: float) -> str | None:
        """None when the reported state can be the reference's ``expected`` within ``atol``; else why not.

        Whole arrays are compared element-wise (``specproof.contract.states_differ``). A digested
        array must have the reference's exact shape; then its CRC-32 equal to the reference's accepts
        it outright (bit-identical), and otherwise every slice not compared yet in this request (KV:
        the rows sent since the last comparison) must have each projection within
        ``digest_bound`` of the reference's. Every test is a necessary condition of ``within atol``.
        """
        if self.state_problem:
            return self.state_problem
        names = set(self._arrays) | set(self._digests)
        if names != set(expected):
            return f"state names {sorted(names)} != expected {sorted(expected)}"
        whole = {n: expected[n] for n in self._arrays}
        problems = []
        if whole and (why := states_differ(whole, self._arrays, atol=atol)):
            problems.append(why)
        for name, held in self._digests.items():
            if why := self._digest_differs(name, held, np.asarray(expected[name]), atol):
                problems.append(why)
        return "; ".join(problems) if problems else None

    def _digest_differs(self, name: str, held: _Digest, want: npt.NDArray[Any], atol: float) -> str | None:
        if tuple(want.shape) != held.shape:
            return f"{name} has shape {held.shape}, expected {tuple(want.shape)}"
        if held.checked:
            return None
        if zlib.crc32(np.ascontiguousarray(want, dtype="<f4").tobytes()) == held.crc:
            # bit-identical to the reference, the engine says; the sums are compared all the same: a CRC
            # taken from another buffer than the sums (a copy before the rollback) must not excuse them
            self.digest_crc_matches += 1
        assert self.digest is not None
        seed, n = self.digest
        start = held.unchecked_from if held.axis is not None else 0
        ref, norm = projections(want, seed=seed, n=n, slice_axes=held.slice_axes, axis=held.axis, start=start)
        got = held.proj.astype(np.float64)
        if held.axis is not None and start:
            got = np.take(got, np.arange(start, got.shape[held.axis]), axis=held.axis)
        m = slice_length(held.shape, held.slice_axes)
        bound = digest_bound(norm, atol=atol, m=m)[..., None]
        with np.errstate(invalid="ignore"):
            # NaN or inf in the reference slice: the engine's projection must be non-finite too
            close = np.where(np.isfinite(ref), np.abs(got - ref) <= bound, ~np.isfinite(got))
        self.digest_slices_compared += int(norm.size)
        if close.all():
            held.checked = True
            return None
        bad = np.argwhere(~close)
        where = tuple(int(i) for i in bad[0])
        index = list(where[:-1])
        if held.axis is not None:
            index[held.axis] += start
        j = where[-1]
        gap, limit = abs(float(got[where]) - float(ref[where])), float(bound[where[:-1]][0])
        slices = len({tuple(b[:-1]) for b in bad.tolist()})
        return (
            f"{name} differs at {_slice_text(name, tuple(index))} (a slice of {m} elements): signed projection "
            f"{j} is {float(got[where]):.9g} in the engine, {float(ref[where]):.9g} in the reference, "
            f"|difference| {gap:.3g} > the bound {limit:.3g} "
            f"(atol {atol:g} x {m} + float slack); {slices} of {int(norm.size)} slices compared differ, so some "
            f"element differs by more than atol (certain, whatever the engine's float arithmetic; state_digest, "
            f"seed {seed}"
            + (f"; the same signs in another run: ${DIGEST_KEY_ENV}={self.digest_key}" if self.digest_key else "")
            + f"); {_FULL_HINT}"
        )

    def update(self, message: dict[str, Any], *, delta: bool = False) -> None:
        arrays: dict[str, npt.NDArray[np.float32]] = {}
        digests: dict[str, _Digest] = {}
        prev: dict[str, tuple[tuple[int, ...], int]] = {}
        problems: list[str] = []
        for name, spec in message["arrays"].items():
            full_shape = [int(n) for n in spec["shape"]]
            if "digest" in spec:
                if "data" in spec:
                    raise EngineProtocolError(f"state array {name!r}: both data and a digest")
                held = self._read_digest(name, spec, full_shape, message, problems)
                digests[name] = held
                prev[name] = (held.shape, held.crc)
                continue
            if "data" not in spec:
                raise EngineProtocolError(f"state array {name!r}: neither data nor a digest")
            if "prefix_crc32" in spec or "slice" in spec:
                raise EngineProtocolError(f"state array {name!r}: prefix_crc32 or slice without a digest")
            start = spec.get("start")
            if start is None:
                shape = check_array_shape(name, full_shape, spec["data"])
            else:
                if not delta:
                    raise EngineProtocolError(
                        f"state array {name!r}: 'start' (a delta), but the request did not ask for state_delta"
                    )
                axis, start = int(spec["axis"]), int(start)
                base = self._base.get(name)
                if axis >= len(full_shape):
                    raise EngineProtocolError(f"state array {name!r}: axis {axis} of a shape {full_shape[:12]}")
                if base is None:
                    raise EngineProtocolError(
                        f"state array {name!r}: a delta (start {start}) with no earlier state message of this "
                        "request to build on (the first state message of a request is whole)"
                    )
                kept = [n for i, n in enumerate(base.shape) if i != axis]
                if kept != [n for i, n in enumerate(full_shape) if i != axis] or not (
                    start <= min(base.shape[axis], full_shape[axis])
                ):
                    raise EngineProtocolError(
                        f"state array {name!r}: a delta of shape {full_shape[:12]} from {start} along axis {axis} "
                        f"does not extend the previous message's shape {list(base.shape)}"
                    )
                part = full_shape.copy()
                part[axis] -= start
                check_array_shape(name, part, spec["data"])
                shape = tuple(full_shape)
            raw, new = decode_float32(spec["data"], shape if start is None else part, f"state array {name!r}: data")
            if start is None:
                arrays[name] = new
                prev[name] = (shape, zlib.crc32(raw))
                continue
            old = np.take(self._base[name], np.arange(start), axis=axis)
            whole = np.ascontiguousarray(np.concatenate([old, new], axis=axis), dtype="<f4")
            self.delta_arrays += 1
            self.rows_left_out += start
            crc = zlib.crc32(whole.tobytes())
            if crc != int(spec["crc32"]):
                problems.append(
                    f"state array {name!r} at processed={message['processed']}: the engine's CRC-32 "
                    f"{int(spec['crc32']):#010x} is not that of the {start} rows it sent before plus the "
                    f"{full_shape[axis] - start} it sent now ({crc:#010x}): rows before {start} changed after "
                    "it reported them (append-only KV; docs/contract.md), or the CRC is wrong"
                )
            arrays[name] = whole.astype(np.float32)
            prev[name] = (shape, crc)
        self._arrays = arrays
        self._digests = digests
        self._base = arrays
        self._prev = prev
        self.processed = int(message["processed"])
        self.updates += 1
        if problems and self.state_problem is None:
            self.state_problem = "; ".join(problems)

    def _read_digest(
        self, name: str, spec: dict[str, Any], full_shape: list[int], message: dict[str, Any], problems: list[str]
    ) -> _Digest:
        """A digested array (docs/protocol.md, state): checked, decoded and joined to the request's earlier slices."""
        if self.digest is None:
            raise EngineProtocolError(f"state array {name!r}: a digest, but the request did not ask for state_digest")
        if "crc32" not in spec:
            raise EngineProtocolError(f"state array {name!r}: a digest needs crc32 (the whole array's CRC-32)")
        slice_axes = int(spec.get("slice", 1))
        start = spec.get("start")
        axis = None if start is None else int(spec["axis"])
        start = 0 if start is None else int(start)
        if axis is not None and "prefix_crc32" not in spec:
            raise EngineProtocolError(f"state array {name!r}: a digest from start {start} needs prefix_crc32")
        if axis is None and "prefix_crc32" in spec:
            raise EngineProtocolError(f"state array {name!r}: prefix_crc32 without start")
        part = check_digest_shape(
            name,
            full_shape,
            slice_axes=slice_axes,
            projections=self.digest[1],
            axis=axis,
            start=start,
            data=spec["digest"],
        )
        _, proj = decode_float32(spec["digest"], part, f"state array {name!r}: digest")
        shape, crc = tuple(full_shape), int(spec["crc32"])
        self.digest_arrays += 1
        if axis is None:
            return _Digest(shape, slice_axes, proj, crc)
        earlier = self._digests.get(name) if name in self._prev else None
        before = self._prev.get(name)
        if before is None:
            raise EngineProtocolError(
                f"state array {name!r}: a digest from start {start} with no earlier state message of this "
                "request to build on (the first state message of a request is whole)"
            )
        old_shape, old_crc = before
        if (
            len(old_shape) != len(shape)
            or any(a != b for i, (a, b) in enumerate(zip(old_shape, shape, strict=True)) if i != axis)
            or start != old_shape[axis]
        ):
            raise EngineProtocolError(
                f"state array {name!r}: a digest of shape {list(shape)} from {start} along axis {axis} does not "
                f"extend the previous message's shape {list(old_shape)} (start must be its length along the axis)"
            )
        if int(spec["prefix_crc32"]) != old_crc:
            problems.append(
                f"state array {name!r} at processed={message['processed']}: the CRC-32 of its first {start} "
                f"rows is now {int(spec['prefix_crc32']):#010x}, but the whole array was {old_crc:#010x} when the "
                f"engine reported it in the previous state message: rows before {start} changed after it "
                "reported them (append-only KV; docs/contract.md), or a CRC is wrong"
            )
        if earlier is not None and earlier.slice_axes != slice_axes:
            raise EngineProtocolError(f"state array {name!r}: slice {slice_axes}, but {earlier.slice_axes} before")
        if earlier is None:  # the previous message sent its values: digest them (compared again, soundly)
            seed, n = self.digest
            values, _ = projections(self._base[name], seed=seed, n=n, slice_axes=slice_axes)
            held_rows, unchecked = values.astype(np.float32), 0
        else:
            held_rows = earlier.proj
            unchecked = start if earlier.checked else earlier.unchecked_from
        held = _Digest(shape, slice_axes, np.concatenate([held_rows, proj], axis=axis), crc)
        held.axis = axis
        held.unchecked_from = min(unchecked, start)
        self.rows_left_out += start
        return held

    def __repr__(self) -> str:
        return f"<WireTargetView processed={self.processed} arrays={sorted(self._arrays)}>"
