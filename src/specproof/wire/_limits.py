"""Bounds on what an engine may send (docs/protocol.md, "Limits"): checked as bytes arrive.

An engine is code under test: it may write an endless line, nest JSON 200,000 deep or
declare a state of 10^15 floats. Every such input is refused with an error that names the
limit, the size seen and the message kind — before the memory is spent, never a
``RecursionError`` or a runner killed for memory.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Final

from specproof.contract.files import json_depth_exceeds
from specproof.wire._digest import MAX_SLICE, slice_length
from specproof.wire._errors import EngineProtocolError

__all__ = [
    "HANDSHAKE_LINE_BYTES",
    "MAX_DEPTH",
    "MAX_K",
    "MAX_Q_PAIRS",
    "MAX_RANK",
    "MAX_SIZE",
    "NO_STATE_LINE_BYTES",
    "STATE_LINE_BYTES",
    "LineTooLong",
    "check_array_shape",
    "check_digest_shape",
    "check_feature_shape",
    "check_handshake_sizes",
    "decoded_length",
    "default_line_limit",
    "feature_line_bytes",
    "message_kind",
    "parse_line",
    "state_line_bytes",
]

#: the handshake is a few hundred bytes: a first line longer than this is not a handshake
HANDSHAKE_LINE_BYTES: Final = 1 << 20
#: an engine without the ``state`` capability sends token lists only
NO_STATE_LINE_BYTES: Final = 4 << 20
#: the default for an engine with ``state`` whose state size the suite cannot work out (no ``model``)
STATE_LINE_BYTES: Final = 64 << 20
#: the most a default worked out from the oracle's state may reach (a larger state: set the limit)
_STATE_LINE_CEILING: Final = 256 << 20
#: legitimate messages nest 4 deep (state -> arrays -> array -> shape)
MAX_DEPTH: Final = 32
#: token ids and positions are 32-bit in every engine we know: larger sizes are nonsense
MAX_SIZE: Final = (1 << 31) - 1
#: the most draft tokens per round a handshake may declare
MAX_K: Final = 4096
#: the most dimensions of a state array
MAX_RANK: Final = 8
#: the most [token, probability] pairs in one draft message's ``q`` rows (all rows together): 2^22
#: pairs is about 100 MB of JSON, dense rows of k = 8 over a vocabulary of 512k tokens
MAX_Q_PAIRS: Final = 1 << 22

_KIND = re.compile(rb'"type"\s*:\s*"([A-Za-z_]{1,20})"')


class LineTooLong(Exception):
    """Raised by the line reader: ``seen`` bytes without a newline crossed ``limit``."""

    def __init__(self, seen: int, limit: int, head: bytes) -> None:
        super().__init__(seen, limit)
        self.seen, self.limit, self.head = seen, limit, head


def message_kind(head: bytes) -> str:
    """What a (partial) line says it is: ``a 'state' message`` or ``a line that names no message type``."""
    found = _KIND.search(head[:4096])
    return f"a {found.group(1).decode()!r} message" if found else "a line that names no message type"


def parse_line(line: str, *, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` after a nesting check; ``ValueError`` naming the problem (never ``RecursionError``)."""
    # base64 data and token lists hold no brackets, so legitimate lines skip the scan
    if json_depth_exceeds(line, max_depth):
        raise ValueError(f"JSON nested more than {max_depth} deep (the limit; legitimate messages nest 4 deep)")
    try:
        return json.loads(line)
    except RecursionError:  # pragma: no cover - the depth check comes first
        raise ValueError(f"JSON nested too deep to decode (limit {max_depth})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON ({exc.msg} at column {exc.colno})") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise ValueError(f"invalid JSON ({exc})") from None


def check_handshake_sizes(hello: dict[str, Any]) -> None:
    """Refuse sizes no engine can have (``EngineProtocolError`` naming the field, its value and the bound)."""
    for field, bound in (("vocab_size", MAX_SIZE), ("max_context", MAX_SIZE), ("k", MAX_K)):
        value = hello[field]
        if value > bound:
            raise EngineProtocolError(
                f"the handshake declares {field}={value}, more than the {bound} any engine can have "
                f"(docs/protocol.md, Limits)"
            )
    if hello["k"] >= hello["max_context"]:
        raise EngineProtocolError(
            f"the handshake declares k={hello['k']} with max_context={hello['max_context']}: a round of k draft "
            "tokens needs k + 1 free slots"
        )
    if "batched" in hello["capabilities"] and "batch" not in hello:
        raise EngineProtocolError(
            "the handshake names the capability 'batched' but no 'batch' object (max_batch and slots are required "
            "with it: docs/protocol.md, Batches)"
        )
    if "features" in hello["capabilities"]:
        missing = [f for f in ("d_model", "feature_layers") if f not in hello]
        if missing:
            raise EngineProtocolError(
                f"the handshake names the capability 'features' but no {' and no '.join(missing)} (both are "
                "required with it: docs/protocol.md, Features)"
            )
        if hello["d_model"] > MAX_SIZE:
            raise EngineProtocolError(
                f"the handshake declares d_model={hello['d_model']}, more than the {MAX_SIZE} any engine can have "
                f"(docs/protocol.md, Limits)"
            )


def decoded_length(data: str) -> int | None:
    """The byte length of padded base64 ``data`` without decoding it (None: not a base64 length)."""
    if len(data) % 4:
        return None
    pad = 2 if data.endswith("==") else 1 if data.endswith("=") else 0
    return len(data) // 4 * 3 - pad


def _padded_length(data: str, what: str) -> int:
    """The bytes ``data`` decodes to (``decoded_length``); not padded base64 is an error naming ``what``."""
    have = decoded_length(data)
    if have is None:
        raise EngineProtocolError(f"{what} of {len(data)} characters is not padded base64")
    return have


def _check_rank_and_sizes(name: str, shape: list[int]) -> None:
    """A state array's shape within the rank and dimension limits (whole arrays and digests alike)."""
    if len(shape) > MAX_RANK:
        raise EngineProtocolError(
            f"state array {name!r}: shape {shape[:12]} has {len(shape)} dimensions (limit {MAX_RANK})"
        )
    if any(n > MAX_SIZE for n in shape):
        raise EngineProtocolError(f"state array {name!r}: shape {shape} has a dimension over {MAX_SIZE}")


def check_array_shape(name: str, shape: list[int], data: str) -> tuple[int, ...]:
    """A state array's shape, checked against its data's length before anything is allocated."""
    _check_rank_and_sizes(name, shape)
    want = 4 * math.prod(shape)
    have = _padded_length(data, f"state array {name!r}: data")
    if have != want:
        raise EngineProtocolError(
            f"state array {name!r}: {have} bytes of data for shape {shape} ({want} expected); nothing was allocated"
        )
    return tuple(shape)


def check_digest_shape(
    name: str, shape: list[int], *, slice_axes: int, projections: int, axis: int | None, start: int, data: str
) -> tuple[int, ...]:
    """The shape of a digest's projections (``shape`` without its slice axes, cut from ``start`` along
    ``axis``, then ``projections``), checked against the data's length before anything is decoded."""
    _check_rank_and_sizes(name, shape)
    if not 1 <= slice_axes <= len(shape):
        raise EngineProtocolError(
            f"state array {name!r}: a digest's slice of {slice_axes} trailing axes in a shape {shape} "
            f"(expected 1..{len(shape)})"
        )
    m = slice_length(shape, slice_axes)
    if m > MAX_SLICE:
        raise EngineProtocolError(
            f"state array {name!r}: a digest's slices of {m} elements (shape {shape}, slice {slice_axes}); "
            f"the limit is {MAX_SLICE} (the bound atol * m would say little)"
        )
    lead = list(shape[: len(shape) - slice_axes])
    if axis is not None:
        if axis >= len(lead):
            raise EngineProtocolError(
                f"state array {name!r}: a digest's axis {axis} is not one of the leading axes of shape {shape} "
                f"(slice {slice_axes})"
            )
        if start > lead[axis]:
            raise EngineProtocolError(
                f"state array {name!r}: start {start} past the length {lead[axis]} of axis {axis}"
            )
        lead[axis] -= start
    out = (*lead, projections)
    want = 4 * math.prod(out)
    have = _padded_length(data, f"state array {name!r}: a digest")
    if have != want:
        raise EngineProtocolError(
            f"state array {name!r}: a digest of {have // 4 if have % 4 == 0 else have / 4} floats for shape {shape} "
            f"(slice {slice_axes}{f', from {start} along axis {axis}' if axis is not None else ''}): "
            f"{math.prod(out)} expected ({projections} projections per slice); nothing was allocated"
        )
    return out


def check_feature_shape(
    features: dict[str, Any], *, held: int, layers: int, d_model: int, max_context: int
) -> tuple[int, int]:
    """A propose's ``features`` (``from``, ``rows``, ``data``), checked against the rows the client holds,
    the request's layers, ``d_model`` and ``max_context`` before anything is decoded: ``(from, rows)``."""
    start, rows, data = features["from"], features["rows"], features["data"]
    if start > held:
        raise EngineProtocolError(
            f"propose features.from={start}, but the client holds {held} rows of this request's features "
            "(from may repeat rows already sent, never skip any: docs/protocol.md, Features)"
        )
    if start + rows > max_context:
        raise EngineProtocolError(
            f"propose features.from={start} + features.rows={rows} pass max_context={max_context} "
            "(one row per processed position)"
        )
    want = 4 * layers * rows * d_model
    have = _padded_length(data, "propose features.data")
    if have != want:
        raise EngineProtocolError(
            f"propose features.data holds {have} bytes, but features.rows={rows} for {layers} layers of "
            f"d_model={d_model} float32 make {want}; nothing was allocated"
        )
    return start, rows


def _line_of_base64(raw: int) -> int:
    """A line carrying ``raw`` bytes as base64, plus 64 KiB for the JSON around them, within the bounds."""
    return min(_STATE_LINE_CEILING, max(NO_STATE_LINE_BYTES, 4 * (raw + 2) // 3 + (64 << 10)))


def feature_line_bytes(layers: int, d_model: int, max_context: int) -> int:
    """The longest legitimate propose line: the features of ``max_context`` rows as base64, plus room for the JSON."""
    return _line_of_base64(4 * layers * d_model * max_context)


def state_line_bytes(fixed_bytes: int, per_token_bytes: int, max_context: int) -> int:
    """The longest legitimate state line: the arrays at ``max_context`` as base64, plus room for the JSON."""
    return _line_of_base64(fixed_bytes + per_token_bytes * max_context)


def default_line_limit(
    capabilities: frozenset[str],
    *,
    oracle: object,
    max_context: int,
    feature_layers: tuple[int, ...] | None,
    d_model: int | None,
) -> int:
    """The largest legitimate line at the handshake's sizes (docs/protocol.md, "Limits"): a state line
    worked out from the ``oracle``'s state arrays when it has them, a features line with ``features``."""
    limit = _state_line_limit(capabilities, oracle, max_context)
    if feature_layers is not None and d_model is not None:
        limit = max(limit, feature_line_bytes(len(feature_layers), d_model, max_context))
    return limit


def _state_line_limit(capabilities: frozenset[str], oracle: Any, max_context: int) -> int:
    """The longest legitimate state line (``NO_STATE_LINE_BYTES`` without the capability ``state``)."""
    if "state" not in capabilities:
        return NO_STATE_LINE_BYTES
    arrays = getattr(oracle, "state_arrays", None)
    if oracle is None or not callable(arrays) or not callable(getattr(oracle, "forward", None)):
        return STATE_LINE_BYTES
    try:
        oracle.reset()
        empty = sum(int(a.nbytes) for a in arrays().values())
        oracle.forward([0])
        one = sum(int(a.nbytes) for a in arrays().values())
        oracle.reset()
    except Exception:
        return STATE_LINE_BYTES
    return state_line_bytes(empty, max(0, one - empty), max_context)
