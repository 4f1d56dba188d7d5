"""Plug-in drafters for the acceptance gate's tests (``--drafter _acceptance_drafters:NAME``).

- ``mtp_spoiled``: the packaged MTP head with its first draft token made wrong at a fixed,
  deterministic 1 in 20 of the proposals (chosen by a hash of the last 16 context tokens): a
  drafter whose acceptance falls by a controlled ~5 % (at ``--quick``, 5.1 % at draft position 1
  on the real contexts), still lossless and deterministic;
- ``features_no_target``: a drafter that declares ``feature_layers`` (it reads a target's hidden
  states) but no ``feature_target_spec``: ``bench --drafter`` must ask for ``--target``.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from specproof.engine import NgramDrafter
from specproof.plugins import load_drafter

SPOIL_EVERY = 20


class _Spoiled:
    feature_target_spec = "trained"

    def __init__(self) -> None:
        self.inner = load_drafter("mtp:trained")
        self.name = f"spoiled(mtp:trained, 1 in {SPOIL_EVERY})"

    def reset(self) -> None:
        self.inner.reset()  # type: ignore[attr-defined]

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        draft = [int(t) for t in self.inner.propose(context, k)]
        if draft and zlib.crc32(bytes(int(t) % 256 for t in context[-16:])) % SPOIL_EVERY == 0:
            draft[0] = (draft[0] + 1) % 256  # a token the target did not choose
        return draft


def mtp_spoiled() -> _Spoiled:
    return _Spoiled()


class _FeaturesNoTarget:
    feature_layers = (3,)
    name = "features, no target named"

    def __init__(self) -> None:
        self.inner = NgramDrafter()

    def propose(self, context: Sequence[int], k: int, *, features: Mapping[int, Any] | None = None) -> list[int]:
        return [int(t) for t in self.inner.propose(context, k)]


def features_no_target() -> _FeaturesNoTarget:
    return _FeaturesNoTarget()
