"""Engines whose grammar is right on greedy requests and wrong on sampled ones (docs/contract.md, "Decode state",
"Sampled runs").

Each is the decode zoo's engine whose sampled requests get request processors changed in one method: the
replacement token after a draft token the grammar forbids drawn from the row without the grammar mask (the
recovered-token sampler that forgets the bitmask), or the verify rows' matcher advanced through the target's
own greedy tokens instead of the draft's (a shortcut that is exact when greedy, as an accepted draft token is
then the argmax). Greedy, both pass every check; ``decode.grammar-sampled`` rejects them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specproof.conformance.zoo._decode_engines import DecodeZooEngine
from specproof.contract import DecodeParams, Generation, SamplingParams
from specproof.engine import RequestProcessors

__all__ = ["GrammarFollowsArgmaxWhenSampling", "GrammarUnmaskedResidualWhenSampling"]


class _UnmaskedResidual(RequestProcessors):
    def verify_rows(self, logits: np.ndarray, draft: Sequence[int]) -> np.ndarray:
        rows = super().verify_rows(logits, draft)
        for i, token in enumerate(draft):
            if self.grammar is not None and rows[i, token] == -np.inf:  # the draft token is out: a sure rejection
                raw = np.asarray(logits[i], dtype=np.float64).copy()
                raw[token] = -np.inf  # still rejected, but the replacement comes from the unmasked row
                rows[i] = raw
        return rows


class _FollowsArgmax(RequestProcessors):
    def verify_rows(self, logits: np.ndarray, draft: Sequence[int]) -> np.ndarray:
        rows = np.empty(logits.shape, dtype=np.float64)
        ahead: list[int] = []
        for i in range(logits.shape[0]):
            rows[i] = self.process(logits[i], ahead, draft_row=i)
            if i < len(draft):
                ahead.append(int(np.argmax(rows[i])))  # the target's token, not the draft's
        return rows


class _SampledOnly(DecodeZooEngine):
    sampled_processors: type[RequestProcessors] = RequestProcessors

    def generate(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        *,
        eos_token_id: int | None = None,
        sampling: SamplingParams | None = None,
        decode: DecodeParams | None = None,
    ) -> Generation:
        self.processors_class = self.sampled_processors if sampling is not None else RequestProcessors
        return super().generate(prompt, max_new_tokens, eos_token_id=eos_token_id, sampling=sampling, decode=decode)


class GrammarUnmaskedResidualWhenSampling(_SampledOnly):
    """Sampled, a draft token the grammar forbids is rejected, and its replacement is drawn from the row without
    the grammar mask (the recovered-token sampler forgets the bitmask): tokens the grammar forbids come out."""

    sampled_processors = _UnmaskedResidual


class GrammarFollowsArgmaxWhenSampling(_SampledOnly):
    """Sampled, each verify row's matcher (and penalty state) is advanced through the target's greedy tokens of
    the rows before it instead of the draft's: exact when greedy, a wrong mask after a sampled non-argmax
    acceptance."""

    sampled_processors = _FollowsArgmax
