"""The session machine's oracle for requests with decode parameters (docs/contract.md, "Decode state"): plain
decoding with the request's processors (``contract.decode_state.plain_decode_with``) on a copy of the model,
never the engine under test."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from specproof.contract import DecodeParams, UsageError
from specproof.contract.decode_state import plain_decode_with

__all__ = ["DecodeOracle"]


class DecodeOracle:
    """Plain decoding with decode parameters on one copy of the model from ``factory`` (made when first needed:
    a session without decode parameters builds none; ``plain_decode_with`` resets it before every decode)."""

    def __init__(self, factory: Callable[[], Any] | None) -> None:
        self.factory = factory
        self._model: Any = None

    def _target(self) -> Any:
        if self._model is None:
            if self.factory is None:
                raise UsageError(
                    "the session has a request with decode parameters, which are judged against plain decoding "
                    "with them on a copy of the model: pass decode_reference_factory"
                )
            self._model = self.factory()
        return self._model

    def continuation(self, prompt: Sequence[int], n: int, decode: DecodeParams) -> list[int]:
        """The first ``n`` tokens with ``decode``'s processors, no EOS of the call: what the request's drafts
        follow and its EOS is drawn from."""
        return [int(t) for t in plain_decode_with(self._target(), prompt, n, decode=decode).tokens]

    def expected(
        self, prompt: Sequence[int], n: int, decode: DecodeParams, eos_token_id: int | None
    ) -> tuple[list[int], str]:
        """The tokens and stop reason the request must give."""
        want = plain_decode_with(self._target(), prompt, n, decode=decode, eos_token_id=eos_token_id)
        return [int(t) for t in want.tokens], str(want.stop_reason)
