"""Shared parts of the framework targets (``MLXTarget``, ``HFTarget``): input checks, the KV write
clock that detects stale snapshots, the snapshot record, the byte tokenizer of the tiny configs,
and the ``NAME[,field=value,...]`` spec parser.

Nothing here imports mlx or torch.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import numpy as np
import numpy.typing as npt

from specproof.contract.errors import (
    CapacityError,
    InvalidSettingError,
    StaleSnapshotError,
    TargetContractError,
    TokenRangeError,
)

__all__ = [
    "TINY_OVERRIDES",
    "ByteTokenizer",
    "FrameworkSnapshot",
    "KVClock",
    "check_forward_tokens",
    "check_snapshot",
    "default_tie_tolerance",
    "next_target_id",
    "parse_spec",
    "seeded_normal_init",
]

# tiny-config fields a spec may override: ``mlx:lfm2-tiny,seed=3,max_context=256``
TINY_OVERRIDES: Final[tuple[str, ...]] = ("seed", "max_context")

_IDS = itertools.count(1)


def next_target_id() -> int:
    """A process-unique id, so a snapshot of one target is refused by another."""
    return next(_IDS)


def check_forward_tokens(
    tokens: Sequence[int], *, name: str, vocab_size: int, processed: int, max_context: int
) -> list[int]:
    """Validate a forward's tokens (ids, then capacity) without touching any state; return them as ints."""
    if isinstance(tokens, np.ndarray):
        if tokens.ndim != 1:
            raise TokenRangeError(f"{name}.forward: tokens must be 1-D, got shape {tokens.shape}")
        if tokens.size and tokens.dtype.kind not in "iu":
            raise TokenRangeError(
                f"{name}.forward: tokens[0]={tokens[0]!r} is not an integer token id (array dtype {tokens.dtype})"
            )
        seq: Sequence[Any] = tokens.tolist()
    elif isinstance(tokens, (str, bytes)) or not isinstance(tokens, Iterable):
        raise TokenRangeError(f"{name}.forward: tokens must be a sequence of ints, got {type(tokens).__name__}")
    else:
        seq = tokens if isinstance(tokens, (list, tuple)) else list(tokens)
    out: list[int] = []
    for i, t in enumerate(seq):
        if type(t) is not int and not isinstance(t, np.integer):  # bool is excluded on purpose
            raise TokenRangeError(f"{name}.forward: tokens[{i}]={t!r} ({type(t).__name__}) is not an integer token id")
        if not 0 <= t < vocab_size:
            raise TokenRangeError(f"{name}.forward: tokens[{i}]={int(t)} is outside [0, {vocab_size})")
        out.append(int(t))
    if processed + len(out) > max_context:
        raise CapacityError(
            f"{name}.forward: processed={processed} + len(tokens)={len(out)} exceeds max_context={max_context}; "
            "nothing was changed"
        )
    return out


class KVClock:
    """Which forward last wrote each KV slot: lets ``restore`` refuse a snapshot whose KV prefix was rewritten.

    A snapshot at ``processed=n`` taken at clock ``c`` is stale once any slot below ``n`` carries a
    stamp newer than ``c`` (a rollback below ``n`` followed by new tokens overwrote it).
    """

    __slots__ = ("clock", "stamps")

    def __init__(self, max_context: int) -> None:
        self.stamps: npt.NDArray[np.int64] = np.zeros(max_context, np.int64)
        self.clock = 0

    def write(self, base: int, total: int) -> None:
        self.clock += 1
        self.stamps[base:total] = self.clock

    def reset(self) -> None:
        self.clock += 1
        self.stamps.fill(self.clock)

    def check(self, *, name: str, processed: int, write_clock: int, current: int) -> None:
        if processed:
            newer = self.stamps[:processed] > write_clock
            if newer.any():
                slot = int(np.argmax(newer))
                raise StaleSnapshotError(
                    f"{name}.restore: the snapshot at processed={processed} is stale: KV slot {slot} was "
                    f"overwritten after it was taken (current processed={current})"
                )


@attrs.frozen(eq=False)
class FrameworkSnapshot:
    """``processed`` and the recurrent (conv / delta-rule) state of a framework target.

    ``states`` holds the framework's own arrays (copies where the framework updates them in
    place); the KV cache is not copied. ``target_id`` and ``write_clock`` let ``restore``
    refuse a snapshot of another target or one whose KV prefix was overwritten since.
    """

    processed: int
    states: tuple[Any, ...] = attrs.field(repr=lambda s: f"<{len(s)} layer states>")
    target_id: int = attrs.field(repr=False)
    write_clock: int = attrs.field(repr=False)


def check_snapshot(snapshot: object, *, name: str, target_id: int, clock: KVClock, processed: int) -> FrameworkSnapshot:
    """Validate ``snapshot`` for ``restore`` on the target ``target_id``; return it, typed.

    ``TargetContractError`` for a foreign object or another target's snapshot;
    ``StaleSnapshotError`` when a KV slot below its ``processed`` was rewritten since it was taken.
    """
    if not isinstance(snapshot, FrameworkSnapshot):
        raise TargetContractError(
            f"{name}.restore: expected a snapshot taken from this target, got {type(snapshot).__name__}"
        )
    if snapshot.target_id != target_id:
        raise TargetContractError(
            f"{name}.restore: the snapshot (processed={snapshot.processed}) was taken from another target"
        )
    clock.check(name=name, processed=snapshot.processed, write_clock=snapshot.write_clock, current=processed)
    return snapshot


def default_tie_tolerance(dtype: str) -> float:
    """The logit tolerance certify uses for a framework target (``tie_tolerance``): float32 kernels that
    differ between q=1 and q=k+1 differ by ~1e-5 on the tiny models; 16-bit weights need far more (not
    measured)."""
    return 1e-3 if dtype in ("float32", "float64") else 0.1


class ByteTokenizer:
    """The tokenizer of the tiny configs: UTF-8 bytes are token ids 0..255 (ids >= 256 decode to nothing)."""

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < 256:
            raise InvalidSettingError(f"ByteTokenizer needs vocab_size >= 256, got {vocab_size}")
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, tokens: Sequence[int]) -> str:
        return bytes(int(t) for t in tokens if 0 <= int(t) < 256).decode("utf-8", errors="replace")


def _looks_like_path(text: str) -> bool:
    return text.startswith(("/", ".", "~")) or os.sep in text or (os.altsep is not None and os.altsep in text)


def parse_spec(args: str, *, family: str, tiny: Sequence[str]) -> tuple[str, dict[str, int]] | tuple[None, Path]:
    """Split ``NAME[,seed=N,max_context=N]`` or a local path.

    Returns ``(name, overrides)`` for a built-in tiny config, ``(None, path)`` for a local
    directory (which must exist: nothing is ever downloaded).
    """
    text = args.strip()
    known = ", ".join(f"{family}:{t}" for t in tiny)
    if not text:
        raise InvalidSettingError(f"{family}: target spec needs a model: one of {known}, or {family}:/local/path")
    head, _, rest = text.partition(",")
    if head in tiny:
        overrides: dict[str, int] = {}
        for item in filter(None, (p.strip() for p in rest.split(","))):
            key, eq, raw = item.partition("=")
            if not eq or key.strip() not in TINY_OVERRIDES:
                raise InvalidSettingError(
                    f"{family}:{head}: unknown override {item!r}; allowed: {', '.join(TINY_OVERRIDES)}"
                )
            try:
                value = int(raw)
            except ValueError:
                raise InvalidSettingError(f"{family}:{head}: {key.strip()}={raw!r} is not an integer") from None
            if value < (0 if key.strip() == "seed" else 2):
                raise InvalidSettingError(f"{family}:{head}: {key.strip()}={value} is out of range")
            overrides[key.strip()] = value
        return head, overrides
    if _looks_like_path(text):
        path = Path(text).expanduser()
        if not path.is_dir():
            raise InvalidSettingError(
                f"{family}:{text}: no such local model directory (nothing is downloaded; convert or copy the model "
                "there first)"
            )
        if not (path / "config.json").is_file():
            raise InvalidSettingError(f"{family}:{text}: {path / 'config.json'} is missing: not a model directory")
        return None, path
    raise InvalidSettingError(
        f"{family}:{text}: unknown model; built-in: {known}; or a local directory ({family}:/path/to/model). "
        "Hub names are not fetched"
    )


def seeded_normal_init(
    shapes: Mapping[str, tuple[int, ...]], *, seed: int, init_scale: float = 2.0
) -> dict[str, npt.NDArray[np.float32]]:
    """Seeded weights for every tensor of rank >= 2, in the given (name) order.

    ``N(0, (init_scale / sqrt(fan_in))^2)`` with ``fan_in = prod(shape[1:])`` (a linear's input
    width, a depthwise conv's kernel length): the same scale the reference target uses, large
    enough that random models have clear top-2 logit margins. Rank-1 tensors (norms, ``A_log``,
    ``dt_bias``) are left to the framework's own initialisation.
    """
    rng = np.random.default_rng(seed)
    out: dict[str, npt.NDArray[np.float32]] = {}
    for name, shape in shapes.items():
        if len(shape) < 2:
            continue
        fan_in = int(np.prod(shape[1:]))
        out[name] = (rng.standard_normal(shape) * (init_scale / np.sqrt(fan_in))).astype(np.float32)
    return out
