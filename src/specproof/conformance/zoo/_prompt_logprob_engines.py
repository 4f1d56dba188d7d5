"""Engines with a prompt-logprobs bug, and one correct written differently (docs/contract.md, "Decode state",
"Prompt logprobs").

``PromptLogprobsOffByOne`` scores each prompt token with the prefill's row after its own (the row that predicts
the next token: an off-by-one between fed and scored positions, the shape of vLLM #53488's silently wrong
prompt logprobs on hybrids with MTP). ``PromptLogprobsFloat32`` scores the same rows in float32, within the
contract's tolerance.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import attrs
import numpy as np

from specproof.conformance.zoo._decode_engines import DecodeZooEngine
from specproof.contract import TokenLogprob
from specproof.engine import RequestProcessors

__all__ = ["PROMPT_LOGPROB_MEMBERS", "PromptLogprobsFloat32", "PromptLogprobsOffByOne"]


class _NextRow(RequestProcessors):
    def score_prompt(self, rows: np.ndarray, prompt: Sequence[int]) -> list[TokenLogprob]:
        shifted = np.concatenate([rows[1:], rows[-1:]]) if len(rows) else rows  # token i + 1 scored on row i + 1
        return super().score_prompt(shifted, prompt)


class PromptLogprobsOffByOne(DecodeZooEngine):
    """Each prompt token is scored with the prefill's next row (the one that predicts the token after it)."""

    processors_class = _NextRow


class _Float32Prompt(RequestProcessors):
    def score_prompt(self, rows: np.ndarray, prompt: Sequence[int]) -> list[TokenLogprob]:
        scored = super().score_prompt(rows, prompt)
        low = np.asarray(rows, dtype=np.float32)
        low = low - np.max(low, axis=1, keepdims=True)
        low = low - np.log(np.exp(low).sum(axis=1, keepdims=True))
        return [attrs.evolve(entry, logprob=min(0.0, float(low[i, entry.token]))) for i, entry in enumerate(scored)]


class PromptLogprobsFloat32(DecodeZooEngine):
    """Correct, differently: the prompt's logprobs computed in float32 (within the contract's tolerance)."""

    processors_class = _Float32Prompt


PROMPT_LOGPROB_MEMBERS: Final[dict[str, type[DecodeZooEngine]]] = {
    "prompt_logprobs_off_by_one": PromptLogprobsOffByOne,
}
"""The prompt-logprobs zoo members, by name (``decode.prompt-logprobs`` claims them)."""
