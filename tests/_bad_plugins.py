"""Plug-ins for the verdict meta-tests (tests/conformance/test_verdicts.py): each should get a non-PASS verdict."""

from __future__ import annotations

from collections.abc import Sequence


class ReturnsNone:
    """A drafter that returns None: no generation with it completes."""

    def propose(self, context: Sequence[int], k: int) -> object:
        return None


class Interrupts:
    """A drafter that simulates Ctrl-C on its 40th call."""

    calls = 0

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        type(self).calls += 1
        if type(self).calls == 40:
            raise KeyboardInterrupt
        return []


def returns_none() -> ReturnsNone:
    return ReturnsNone()


def interrupts() -> Interrupts:
    return Interrupts()
