"""The public protocols: what a target, a drafter and an engine must provide.

docs/contract.md ("Protocols and records") is their reference.

They are ``typing.Protocol`` classes, so an adapter for another system implements
them by shape; nothing needs to subclass them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from specproof.contract._records import Generation
    from specproof.contract.sampling import SampledDraft, SamplingParams

__all__ = [
    "CheckpointingTarget",
    "Drafter",
    "Engine",
    "FeatureDrafter",
    "FeatureTarget",
    "SamplingDrafter",
    "Target",
    "WhiteBoxTarget",
]


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
class FeatureTarget(Target, Protocol):
    """A target that returns hidden states with the logits of a forward (docs/contract.md, "Targets").

    ``feature_layers``: the layers it can return (layer ``i`` is the residual stream after
    block ``i``); ``d_model``: the width of a feature row. ``forward_with_features(tokens,
    layers, checkpoints=False)`` is ``forward`` plus ``{layer: [len(tokens), d_model]}`` for
    each requested layer (and ``forward_with_checkpoints``'s list when ``checkpoints`` is true,
    else ``None``), in the same pass.
    """

    d_model: int
    feature_layers: tuple[int, ...]

    def forward_with_features(
        self, tokens: Sequence[int], layers: Sequence[int], *, checkpoints: bool = False
    ) -> tuple[np.ndarray, Mapping[int, np.ndarray], list[object] | None]: ...


@runtime_checkable
class Drafter(Protocol):
    """Proposes up to ``k`` tokens to follow ``context``.

    Optional: ``reset()``, called at the start of every generation.
    """

    def propose(self, context: Sequence[int], k: int) -> Sequence[int]: ...


@runtime_checkable
class FeatureDrafter(Drafter, Protocol):
    """A drafter that reads the target's hidden states (docs/contract.md, "Feature drafters").

    ``feature_layers`` names the target layers it needs. The engine calls
    ``propose(context, k, features=F)`` where ``F[layer]`` holds exactly one row per
    position of ``context[:-1]`` (the positions the target has processed, all accepted);
    the last token of ``context`` (the bonus token) has no feature yet. ``propose(context, k)``
    without features must give the same draft (the drafter computes them itself).
    """

    feature_layers: tuple[int, ...]


@runtime_checkable
class SamplingDrafter(Drafter, Protocol):
    """A drafter that samples its proposal and says from which distribution (docs/contract.md, "Sampling").

    ``propose_sampled(context, k, *, sampling, rng)`` draws up to ``k`` tokens with the request's
    ``numpy.random.Generator`` and returns them with ``q``, one proposal-distribution row per token
    (``q[i]`` is what ``tokens[i]`` was drawn from, given ``context + tokens[:i]``). A feature drafter
    also takes ``features=``. ``propose`` stays its greedy (deterministic) proposal.
    """

    def propose_sampled(
        self, context: Sequence[int], k: int, *, sampling: SamplingParams, rng: np.random.Generator
    ) -> SampledDraft: ...


@runtime_checkable
class Engine(Protocol):
    """Anything that generates tokens for a prompt.

    An engine that samples declares the capability ``sampling`` and takes ``sampling=``
    (``SamplingParams``; None: greedy); docs/contract.md, "Sampling".
    """

    def generate(
        self, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None
    ) -> Generation: ...
