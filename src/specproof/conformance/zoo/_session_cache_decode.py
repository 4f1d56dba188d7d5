"""A caching session engine that takes decode parameters, and one whose penalty counts outlive the request.

``DecodeSessionEngine`` is ``SessionEngine`` (its cache kept between requests) with the built-in decoder's
processors: ``generate`` takes ``decode=`` and declares the processors (``decode_features``), so
``engine.session`` with ``--decode-state`` sends some of its requests with them. ``SessionPenaltiesCarriedOver``
keeps one presence / frequency penalty buffer for the session, cleared by ``reset()`` only (a long-lived slot's
sampler state, not reset between requests): a request with penalties after one that emitted tokens counts
those tokens too. Without decode parameters it is the correct ``SessionEngine``: only the session machine
that draws processors (``--decode-state``) rejects it.
"""

from __future__ import annotations

from collections.abc import Sequence

from specproof.conformance.zoo._session_engines import SessionEngine
from specproof.contract import DecodeParams, Generation
from specproof.engine import DecodeSession, RequestProcessors, SpecDecoder

__all__ = ["DecodeSessionEngine", "SessionPenaltiesCarriedOver"]


class DecodeSessionEngine(SessionEngine):
    """Correct: the prefix-caching session engine with decode parameters (the built-in processors)."""

    decode_features: tuple[str, ...] = ("penalties", "logit_bias", "bad_words")
    processors_class: type[RequestProcessors] = RequestProcessors

    def _decoder(self) -> SpecDecoder:
        decoder = super()._decoder()
        decoder.processors_class = self.processors_class
        return decoder

    def generate(  # type: ignore[override]
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        *,
        eos_token_id: int | None = None,
        decode: DecodeParams | None = None,
    ) -> Generation:
        self._decode = decode
        try:
            return super().generate(prompt, max_new_tokens, eos_token_id=eos_token_id)
        finally:
            self._decode = None

    _decode: DecodeParams | None = None  # the current call's decode parameters

    def _run(self, session: DecodeSession, max_new_tokens: int, eos_token_id: int | None) -> Generation:
        return session.generate(max_new_tokens, eos_token_id=eos_token_id, decode=self._decode)


class SessionPenaltiesCarriedOver(DecodeSessionEngine):
    """The presence / frequency penalty counts kept for the session, cleared by ``reset()`` only: a request with
    penalties counts the tokens the session's earlier penalised requests emitted (a slot's sampler state reset
    with the slot, not per request)."""

    bug = "the penalty counts of earlier requests carry into the next request of the session"

    def __init__(self) -> None:
        self._buffer: list[int] = []  # every output token the session's penalised requests emitted
        super().__init__()
        buffer = self._buffer

        class Carried(RequestProcessors):
            def __init__(self, params: DecodeParams, prompt: Sequence[int], eos: frozenset[int], vocab: int) -> None:
                super().__init__(params, prompt, eos, vocab)
                self.counted = buffer

        self.processors_class = Carried

    def reset(self) -> None:
        super().reset()
        self._buffer.clear()  # the only place the counts are cleared
