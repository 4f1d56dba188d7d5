"""Batched engines whose requests' grammars are not kept apart (docs/contract.md, "Decode state", "Batches").

Each is ``BatchSpecDecoder`` with one change to where a request's grammar matcher lives: one matcher shared by
every request with a grammar in flight (a per-batch matcher indexed by the engine, not by the request), or
each row's rejected draft tokens rolled back on the next row's matcher (a per-row index off by one). Alone, a
request is right; batched, its rows are masked by a neighbour's grammar state. ``batch.grammar`` rejects
them; ``BatchScratchMatchers`` is correct, differently (each draft scanned on a copy of its own matcher).
"""

from __future__ import annotations

from typing import Any

from specproof.conformance.zoo._batch_engines import BatchZooEngine
from specproof.conformance.zoo._grammar_engines import ScratchMatcherEngine
from specproof.contract import BatchRequest, RequestOutput
from specproof.engine import EngineGrammar, RequestProcessors

__all__ = ["BatchGrammarRollbackWrongRequest", "BatchScratchMatchers", "BatchSharedGrammarMatcher"]


class BatchSharedGrammarMatcher(BatchZooEngine):
    """``batch.grammar``: every request with a grammar in flight uses the first one's matcher."""

    def add_request(self, request: BatchRequest) -> None:
        super().add_request(request)
        mine = self._requests[request.request_id].processors
        if mine is None or mine.grammar is None:
            return
        for rid, req in self._requests.items():
            if rid != request.request_id and req.processors is not None and req.processors.grammar is not None:
                mine.grammar = req.processors.grammar  # the batch's one matcher
                return


class _NeighbourRollback(EngineGrammar):
    neighbour: EngineGrammar | None = None

    def rewind(self, n: int) -> None:
        other = self.neighbour
        if other is None or n <= 0:
            super().rewind(n)
            return
        other.matcher.rollback(min(n, len(other.fed)))  # the next row's matcher rolled back instead of this one's
        del self.fed[len(self.fed) - n :]


class BatchGrammarRollbackWrongRequest(BatchZooEngine):
    """``batch.grammar``: each row's rejected draft tokens are rolled back on the next row's matcher."""

    processors_class = type("NeighbourRollbackProcessors", (RequestProcessors,), {"grammar_class": _NeighbourRollback})

    def _verify_round(self, batch: list[Any]) -> list[RequestOutput]:  # the engine's RequestState records
        grammars = [r.processors.grammar for r in batch if r.processors is not None and r.processors.grammar]
        if len(grammars) > 1:  # alone, a request rolls back its own matcher
            for i, grammar in enumerate(grammars):
                grammar.neighbour = grammars[(i + 1) % len(grammars)]  # type: ignore[attr-defined]
        try:
            return super()._verify_round(batch)
        finally:
            for grammar in grammars:
                grammar.neighbour = None  # type: ignore[attr-defined]


class BatchScratchMatchers(BatchZooEngine):
    """Correct, differently: each request's draft scanned on a copy of its own matcher, dropped after the round."""

    processors_class = ScratchMatcherEngine.processors_class
