"""Drafters whose drafts depend on earlier calls (docs/contract.md, "Drafters that learn across calls").

``PromptOnlyLookup`` indexes only the first context it is shown after ``reset()`` (the prompt)
and drafts what followed the context's last token there — lossless and legitimate, but its
draft at a position depends on where the request started. Undeclared it breaks
``drafter.deterministic`` (whose message says how to declare it); ``DeclaredPromptOnlyLookup``
is the same code with ``history_dependent = True``, which certification accepts.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["DeclaredPromptOnlyLookup", "PromptOnlyLookup"]


class PromptOnlyLookup:
    """``drafter.deterministic``: a prompt-only lookup that does not declare ``history_dependent``."""

    def __init__(self) -> None:
        self.name = f"specproof.zoo.{type(self).__name__}"
        self.reset()

    def reset(self) -> None:
        self._prompt: list[int] | None = None

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        if k <= 0 or not context:
            return []
        if self._prompt is None or list(context[: len(self._prompt)]) != self._prompt:
            self._prompt = [int(t) for t in context]  # a new request: its context is the prompt
        last = int(context[-1])
        prompt = self._prompt
        for i in range(len(prompt) - 2, -1, -1):  # the latest earlier occurrence with a continuation
            if prompt[i] == last:
                return prompt[i + 1 : i + 1 + k]
        return []


class DeclaredPromptOnlyLookup(PromptOnlyLookup):
    """Correct: the same prompt-only lookup, declared ``history_dependent = True``."""

    history_dependent = True
