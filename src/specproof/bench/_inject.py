"""Planted regressions: how the speed gate's sensitivity is measured (docs/bench.md, the gate).

Each injector makes a round slower in one place, by a CPU-time cost given in seconds
(burned in this thread, so a CPU-time figure sees it whatever the machine's load):

- ``slow_proposal(delay)``: a drafter factory, the n-gram drafter plus ``delay`` per proposal;
- ``slow_verify(delay)``: a decoder factory whose target burns ``delay`` in every multi-token
  forward (the verify; replay's re-feeds of several tokens too);
- ``extra_forward``: a decoder factory whose engine does a wasted one-token forward
  (then a restore) before every round.

``round_cpu_seconds(result)`` is the speculative side's CPU time per round of a run, the
unit the delays are expressed in ("a 15 % slower round" burns 0.15 of it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from specproof.contract import Drafter, Target
from specproof.contract.errors import InvalidSettingError
from specproof.engine import DecodeSession, NgramDrafter, SpecDecoder

__all__ = ["burn", "extra_forward", "round_cpu_seconds", "slow_proposal", "slow_verify"]


def burn(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _check_delay(delay: float) -> float:
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not 0 <= delay < 1:
        raise InvalidSettingError(f"injected delay must be seconds in [0, 1), got {delay!r}")
    return float(delay)


def round_cpu_seconds(result: Mapping[str, Any]) -> float:
    """CPU seconds per speculative round over all cells of a bench result (``BenchResult.to_json()``)."""
    cells = [c for c in result.get("cells", []) if "spec_cpu_seconds" in c]
    rounds = sum(int(c["rounds"]) for c in cells)
    if not rounds:
        raise InvalidSettingError("round_cpu_seconds: the result has no cells with CPU times and rounds")
    return sum(float(c["spec_cpu_seconds"]) for c in cells) / rounds


def slow_proposal(delay: float) -> Callable[[], Drafter]:
    wait = _check_delay(delay)

    class SlowNgram(NgramDrafter):
        def propose(self, context: Sequence[int], k: int) -> list[int]:
            burn(wait)
            return super().propose(context, k)

    return SlowNgram


class _SlowVerifyTarget:
    """Passes everything to ``inner``; a forward of more than one token burns ``delay`` first."""

    def __init__(self, inner: Target, delay: float) -> None:
        self._inner = inner
        self._delay = delay
        if callable(getattr(inner, "forward_with_checkpoints", None)):
            self.forward_with_checkpoints = self._forward_with_checkpoints

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def forward(self, tokens: Sequence[int]) -> Any:
        if len(tokens) > 1:
            burn(self._delay)
        return self._inner.forward(tokens)

    def _forward_with_checkpoints(self, tokens: Sequence[int]) -> Any:
        burn(self._delay)
        return self._inner.forward_with_checkpoints(tokens)  # type: ignore[attr-defined]


def slow_verify(delay: float) -> Callable[..., SpecDecoder]:
    wait = _check_delay(delay)

    def make(target: Target, drafter: Drafter, *, k: int, rollback: str) -> SpecDecoder:
        return SpecDecoder(_SlowVerifyTarget(target, wait), drafter, k=k, rollback=rollback)  # type: ignore[arg-type]

    return make


class _ExtraForwardSession(DecodeSession):
    def _round(self, k_eff, remaining, eos, counter):  # type: ignore[no-untyped-def]
        target = self.decoder.target
        snap = target.snapshot()
        target.forward([self._ctx[-1]])
        target.restore(snap)
        return super()._round(k_eff, remaining, eos, counter)


class _ExtraForwardDecoder(SpecDecoder):
    def start(self, prompt: Sequence[int]) -> DecodeSession:
        return _ExtraForwardSession(self, prompt)


def extra_forward(target: Target, drafter: Drafter, *, k: int, rollback: str) -> SpecDecoder:
    return _ExtraForwardDecoder(target, drafter, k=k, rollback=rollback)  # type: ignore[arg-type]
