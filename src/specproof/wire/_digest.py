"""State digests (capability ``state_digest``; docs/protocol.md, ``state``): signed projections per slice.

A slice is the block of an array's last ``slice`` axes (``slice`` 1: a row along the last axis,
e.g. one KV row of ``head_dim`` floats at one layer/head/position). Its digest is ``n`` signed
sums ``p_j = sum_i r_ij x_i`` with signs ``r_ij`` in {-1, +1} drawn from the seed the client
sends in each ``generate``. For an engine state within ``atol`` of the reference element-wise,
``|p_engine - p_reference| <= atol * m`` (``m``: the slice's length) — a *necessary* condition,
so a correct engine whose floats differ from numpy's is never rejected; random signs make an
engine unable to tune to them and catch permuted or transposed rows that sums and norms miss.

The signs: for the element at multi-index ``(i_0, ..., i_{R-1})`` of the *whole* array (never
shifted by ``start``) and projection ``j``::

    s = seed;  for each axis k: s = mix(s + G * (i_k + 1));  s = mix(s + G * (j + 1))
    r = +1 if the top bit of s is 0 else -1

all modulo 2**64, ``G = 0x9E3779B97F4A7C15`` and ``mix`` splitmix64's finalizer. The chain does
not depend on the array's sizes, so the KV rows of a position keep their signs as the cache grows.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
import zlib
from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from specproof.wire._errors import EngineProtocolError

__all__ = [
    "DIGEST_KEY_ENV",
    "DIGEST_SLACK",
    "GOLDEN",
    "MAX_SLICE",
    "digest_bound",
    "digest_key",
    "encode_digest",
    "projections",
    "request_seed",
    "sign_states",
]

GOLDEN: Final = 0x9E3779B97F4A7C15
_M1: Final = np.uint64(0xBF58476D1CE4E5B9)
_M2: Final = np.uint64(0x94D049BB133111EB)
#: the most elements of one slice: the bound atol * m grows with m, so larger slices say little
MAX_SLICE: Final = 4096
#: relative float slack of a comparison (see ``digest_bound``)
DIGEST_SLACK: Final = 2.0**-22


def _mix(z: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))  # type: ignore[no-any-return]


def _step(s: npt.NDArray[np.uint64], index: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    return _mix(s + np.uint64(GOLDEN) * (index + np.uint64(1)))


def sign_states(seed: int, shape: Sequence[int], starts: Sequence[int]) -> npt.NDArray[np.uint64]:
    """The chained hash ``s`` of every element of the block ``[starts[k], starts[k] + shape[k])`` per axis."""
    with np.errstate(over="ignore"):
        s = np.full((1,) * len(shape), seed, dtype=np.uint64)
        for k, (n, first) in enumerate(zip(shape, starts, strict=True)):
            index = np.arange(first, first + n, dtype=np.uint64).reshape((1,) * k + (n,) + (1,) * (len(shape) - k - 1))
            s = _step(s, index)
    return s


def projections(
    array: npt.NDArray[np.floating], *, seed: int, n: int, slice_axes: int, axis: int | None = None, start: int = 0
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """The digests of ``array``'s slices from ``start`` along ``axis`` (float64), and each slice's L1 norm.

    Both have shape ``array.shape[:-slice_axes]`` (cut from ``start`` along ``axis``), the
    projections with a last axis of ``n``. ``array`` is the whole array; the signs are the whole
    array's.
    """
    x = np.asarray(array, dtype=np.float64)
    starts = [0] * x.ndim
    if axis is not None and start:
        x = np.take(x, np.arange(start, x.shape[axis]), axis=axis)
        starts[axis] = start
    lead = x.shape[: x.ndim - slice_axes]
    trailing = tuple(range(x.ndim - slice_axes, x.ndim))
    s = sign_states(seed, x.shape, starts)
    out = np.empty((*lead, n), dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        for j in range(n):
            top = _step(s, np.full((1,) * x.ndim, j, dtype=np.uint64)) >> np.uint64(63)
            signs = 1.0 - 2.0 * top.astype(np.float64)
            out[..., j] = np.sum(signs * x, axis=trailing)
        norm = np.sum(np.abs(x), axis=trailing)
    return out, norm


def digest_bound(norm: npt.NDArray[np.float64], *, atol: float, m: int) -> npt.NDArray[np.float64]:
    """How far an engine's projection may be from the reference's when every element is within ``atol``.

    ``atol * m`` (each of the m terms moves by at most atol), plus float slack: the engine rounds
    its float64 sum to float32 on the wire (relative error 2**-24 of ``|p| <= norm + atol * m``)
    and both sides sum m terms in float64 (relative error about m * 2**-53, under 2**-40 for
    m <= MAX_SLICE); ``2**-22 * (norm + atol * m)`` covers both with room.
    """
    return atol * m + DIGEST_SLACK * (norm + atol * m)  # type: ignore[no-any-return]


def encode_digest(
    array: npt.NDArray[np.floating],
    *,
    seed: int,
    n: int,
    slice_axes: int = 1,
    axis: int | None = None,
    start: int = 0,
    prefix_crc32: int | None = None,
) -> dict[str, object]:
    """A ``state`` message's array entry as a digest (what an engine sends; tests and Python engines use it)."""
    import base64

    a = np.ascontiguousarray(np.asarray(array, dtype="<f4"))
    proj, _ = projections(a, seed=seed, n=n, slice_axes=slice_axes, axis=axis, start=start)
    spec: dict[str, object] = {
        "dtype": "float32",
        "shape": list(a.shape),
        "digest": base64.b64encode(proj.astype("<f4").tobytes()).decode(),
        "crc32": zlib.crc32(a.tobytes()),
    }
    if slice_axes != 1:
        spec["slice"] = slice_axes
    if axis is not None and start:
        head = np.ascontiguousarray(np.take(a, np.arange(start), axis=axis))
        spec |= {
            "axis": axis,
            "start": start,
            "prefix_crc32": zlib.crc32(head.tobytes()) if prefix_crc32 is None else prefix_crc32,
        }
    return spec


def slice_length(shape: Sequence[int], slice_axes: int) -> int:
    return math.prod(shape[len(shape) - slice_axes :])


# --------------------------------------------------------------------------- the client's seeds

#: the key of the digest seeds, to draw a digest failure's signs again in another run (32 hex digits);
#: never passed on to an engine process
DIGEST_KEY_ENV = "SPECPROOF_WIRE_DIGEST_KEY"


def digest_key() -> bytes:
    """``$SPECPROOF_WIRE_DIGEST_KEY`` (32 hex digits, as a digest failure prints it), else 16 fresh random bytes."""
    raw = os.environ.get(DIGEST_KEY_ENV, "")
    if not raw:
        return secrets.token_bytes(16)
    try:
        key = bytes.fromhex(raw)
    except ValueError:
        key = b""
    if len(key) != 16:
        raise EngineProtocolError(
            f"${DIGEST_KEY_ENV}={raw!r}: expected 32 hex digits (the key a digest failure names), or unset"
        )
    return key


def request_seed(key: bytes, prompt: list[int], max_new_tokens: int, eos_token_id: int | None) -> int:
    """The signs' seed for a request: the client's secret ``key`` and the request, hashed (below 2**53).

    The engine cannot predict it, and the same request gets the same signs in this client, so a
    search that replays a failing example sees the same verdict (never a flaky one).
    """
    text = json.dumps([prompt, int(max_new_tokens), eos_token_id], separators=(",", ":")).encode()
    digest = hashlib.blake2b(text, key=key, digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 53) - 1)
