"""A batched engine whose requests share one penalty buffer (docs/contract.md, "Decode state", "Batches").

``BatchSharedPenaltyBuffer`` is ``BatchSpecDecoder`` with one change: every request's processors count
their tokens in one buffer held by the engine (a per-batch penalty state indexed by the engine, not by
the request), so a neighbour's output penalizes a request's row. Alone, a request is right; batched, its
penalties see its neighbours' tokens. ``batch.decode-state`` rejects it.
"""

from __future__ import annotations

from specproof.conformance.zoo._batch_engines import BatchZooEngine
from specproof.contract import BatchRequest

__all__ = ["BatchSharedPenaltyBuffer"]


class BatchSharedPenaltyBuffer(BatchZooEngine):
    """``batch.decode-state``: every request's penalties count one buffer the whole batch shares."""

    def __init__(self) -> None:
        super().__init__()
        self._shared: list[int] = []

    def add_request(self, request: BatchRequest) -> None:
        super().add_request(request)
        processors = self._requests[request.request_id].processors
        if processors is not None:
            if not self._requests_with_processors():
                self._shared.clear()  # a batch of one: its own buffer, as a solo call
            processors.counted = self._shared

    def _requests_with_processors(self) -> list[str]:
        return [
            rid
            for rid, req in self._requests.items()
            if req.processors is not None and req.processors.counted is self._shared
        ]
