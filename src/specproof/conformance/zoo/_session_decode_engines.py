"""Engines that keep one penalty buffer for the whole session (docs/contract.md, "Decode state").

A server that keeps per-request sampler state on a long-lived slot (llama.cpp's slot sampler, a
reused logits-processor object) must start each request's state fresh. ``PenaltyCountsCarriedOver``
does not: the presence / frequency penalty counts of the previous request of the session carry into
the next one (``decode.session`` rejects it). ``SessionPenaltyBufferCleared`` keeps the same
session-long buffer and clears it at the start of every request: correct, differently from the
control, which builds its processors afresh per call. ``OutputCarriedOver`` keeps the committed output
(what ``min_tokens``, bad words and stop sequences count) for the session instead: the previous request's
tokens count toward this one's ``min_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence

from specproof.conformance.zoo._decode_engines import DecodeZooEngine
from specproof.contract import DecodeParams
from specproof.engine import RequestProcessors

__all__ = ["OutputCarriedOver", "PenaltyCountsCarriedOver", "SessionPenaltyBufferCleared"]


class _SessionBufferEngine(DecodeZooEngine):
    """The control with a penalty buffer that lives on the engine (one per instance, i.e. per session)."""

    clears_between_requests = True

    def __init__(self) -> None:
        super().__init__()
        buffer: list[int] = []  # the output tokens counted by the presence / frequency penalties
        clears = self.clears_between_requests

        class SessionBuffer(RequestProcessors):
            def __init__(self, params: DecodeParams, prompt: Sequence[int], eos: frozenset[int], vocab: int) -> None:
                super().__init__(params, prompt, eos, vocab)
                if clears:
                    buffer.clear()
                self.counted = buffer  # the session's buffer, advanced in place by commit

        self.processors_class = SessionBuffer


class PenaltyCountsCarriedOver(_SessionBufferEngine):
    """The penalty counts of the previous request of the session carry into the next (a slot's sampler state
    not reset between requests)."""

    clears_between_requests = False


class SessionPenaltyBufferCleared(_SessionBufferEngine):
    """Correct, differently: one session-long penalty buffer, cleared at the start of every request."""


class OutputCarriedOver(DecodeZooEngine):
    """The committed output (``min_tokens``' count, bad words, stop sequences) kept for the whole session: the
    previous request's tokens count toward this one's ``min_tokens``, so its EOS is unmasked too early."""

    def __init__(self) -> None:
        super().__init__()
        output: list[int] = []

        class SessionOutput(RequestProcessors):
            def __init__(self, params: DecodeParams, prompt: Sequence[int], eos: frozenset[int], vocab: int) -> None:
                super().__init__(params, prompt, eos, vocab)
                self.output = output  # never cleared: the session's output so far

        self.processors_class = SessionOutput
