"""An engine whose bug shows only on a request with decode parameters, and only in the target's state, so the
engine-case search finds it where it draws processors (``--decode-state``) and no decode check does (docs/contract.md,
"Decode state", "In the engine-case search").

``DecodeLastRoundKeepsRejected`` leaves the last round's rejected draft tokens in the target's cache on the
processors' path (a checkpoint restore skipped when the request ends, the shape of llama.cpp's
``test_spec_checkpoint_sampler`` on a hybrid model): every output token is right, every processor state too,
and the model's state after the call is not the committed context's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from specproof.conformance.zoo._decode_engines import DecodeZooEngine
from specproof.engine import DecodeSession, Step

__all__ = ["DECODE_CASE_MEMBERS", "DecodeLastRoundKeepsRejected"]


class _KeepsLastRejected(DecodeSession):
    def _round(self, k_eff: int, remaining: int, eos: int | None, counter: Any) -> tuple[Step, list[int]]:
        step, emitted = super()._round(k_eff, remaining, eos, counter)
        processors = self._processors
        rejected = list(step.draft[len(step.accepted) - 1 :])
        ends = len(emitted) >= remaining or (processors is not None and processors.finished is not None)
        if processors is not None and ends and rejected:
            self.decoder.target.forward(rejected)  # the restore skipped: the rejected draft stays in the cache
        return step, emitted


class DecodeLastRoundKeepsRejected(DecodeZooEngine):
    """With decode parameters, the last round's rejected draft tokens stay in the target's cache (its checkpoint
    restore skipped when the request ends): the output is right, the state after the call is not."""

    def start(self, prompt: Sequence[int]) -> DecodeSession:
        return _KeepsLastRejected(self, prompt)


DECODE_CASE_MEMBERS: Final[dict[str, type[DecodeZooEngine]]] = {
    "decode_last_round_keeps_rejected": DecodeLastRoundKeepsRejected,
}
"""The members only the engine-case search with decode parameters finds, by name."""
