"""The public protocols of DESIGN.md: what a target, a drafter and an engine must provide.

They are ``typing.Protocol`` classes, so an adapter for another system implements
them by shape; nothing needs to subclass them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from specproof.contract._records import Generation

__all__ = ["CheckpointingTarget", "Drafter", "Engine", "Target", "WhiteBoxTarget"]


@runtime_checkable
class Target(Protocol):
    """A model the engine verifies drafts with.

    ``forward`` feeds tokens after the ``processed`` ones and returns one logit row
    per token; ``snapshot``/``restore`` save and put back the recurrent state and
    ``processed`` (the KV cache is append-only and is not copied).
    """

    vocab_size: int
    max_context: int

    @property
    def processed(self) -> int: ...

    def forward(self, tokens: Sequence[int]) -> np.ndarray: ...

    def snapshot(self) -> object: ...

    def restore(self, snapshot: object) -> None: ...

    def reset(self) -> None: ...


@runtime_checkable
class CheckpointingTarget(Target, Protocol):
    """A target that returns a state checkpoint after every position of a forward."""

    def forward_with_checkpoints(self, tokens: Sequence[int]) -> tuple[np.ndarray, list[object]]: ...


@runtime_checkable
class WhiteBoxTarget(Target, Protocol):
    """A target whose device states can be read (the valid prefix only)."""

    def state_arrays(self) -> Mapping[str, np.ndarray]: ...


@runtime_checkable
class Drafter(Protocol):
    """Proposes up to ``k`` tokens to follow ``context``.

    Optional: ``reset()``, called at the start of every generation.
    """

    def propose(self, context: Sequence[int], k: int) -> Sequence[int]: ...


@runtime_checkable
class Engine(Protocol):
    """Anything that generates tokens for a prompt."""

    def generate(
        self, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None
    ) -> Generation: ...
