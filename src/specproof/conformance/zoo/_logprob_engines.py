"""Engines with one logprobs or parameter-parity bug each (docs/contract.md, "Decode state").

Each logprobs member is the decode-state control with ``RequestProcessors.score`` (or what it scores)
changed, in the shape of a public report: the drafter's logprobs for accepted draft tokens (llama.cpp
#27972: every logprob 0.0 with MTP drafting, a one-hot draft's logprob), the row after the token's own
(an off-by-one in the verify forward), the rows before the processors where the contract says after, and
logprobs for the whole accepted block past the stop (vLLM #47616: the text cut, the logprobs not).
``FrequencyPenaltyIgnored`` takes decode parameters and declares none, ignoring the frequency penalty
under speculation (vLLM #18902). The correct variant ``Float32LogprobsEngine`` scores in float32.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from specproof.conformance.zoo._decode_engines import DecodeZooEngine, _dropping
from specproof.conformance.zoo._targets import small_reference
from specproof.contract import DecodeParams, Generation, SamplingParams, StopReason, TokenLogprob
from specproof.engine import NgramDrafter, RequestProcessors, SpecDecoder

__all__ = [
    "Float32LogprobsEngine",
    "FrequencyPenaltyIgnored",
    "LogprobsBeforeProcessors",
    "LogprobsFromDrafter",
    "LogprobsPastStop",
    "LogprobsWrongRow",
    "DecodeMatchEngine",
    "PenaltiesSkippedWhenSampling",
    "StopStringMissedAcrossRounds",
]


class _FromDrafter(RequestProcessors):
    def score(self, rows: np.ndarray, emitted: Sequence[int], *, raw: np.ndarray, q: np.ndarray) -> list[TokenLogprob]:
        scored = super().score(rows, emitted, raw=raw, q=q)
        with np.errstate(divide="ignore"):
            drafted = [float(np.log(q[i, t])) for i, t in enumerate(emitted[: len(q)])]
        return [
            attrs.evolve(entry, logprob=drafted[i]) if i < len(drafted) and drafted[i] > -np.inf else entry
            for i, entry in enumerate(scored)
        ]


class LogprobsFromDrafter(DecodeZooEngine):
    """An accepted draft token's logprob is the drafter's (0.0 for a deterministic drafter's one-hot q; llama.cpp
    #27972); only the target's own token of a round gets the target's."""

    processors_class = _FromDrafter


class _WrongRow(RequestProcessors):
    def score(self, rows: np.ndarray, emitted: Sequence[int], *, raw: np.ndarray, q: np.ndarray) -> list[TokenLogprob]:
        shifted = np.concatenate([rows[1:], rows[-1:]])  # token i scored with row i + 1
        return super().score(shifted, emitted, raw=raw, q=q)


class LogprobsWrongRow(DecodeZooEngine):
    """Each token is scored with the verify forward's next row (an off-by-one between fed and emitted positions)."""

    processors_class = _WrongRow


class _BeforeProcessors(RequestProcessors):
    def score(self, rows: np.ndarray, emitted: Sequence[int], *, raw: np.ndarray, q: np.ndarray) -> list[TokenLogprob]:
        return super().score(np.asarray(raw, dtype=np.float64), emitted, raw=raw, q=q)


class LogprobsBeforeProcessors(DecodeZooEngine):
    """Logprobs from the raw rows, before the penalties, bias and masks (the contract says after)."""

    processors_class = _BeforeProcessors


class _PastStop(RequestProcessors):
    _uncut: list[int]

    def settle(self, emitted: Sequence[int], *, draft: Sequence[int]) -> list[int]:
        self._uncut = list(emitted)
        return super().settle(emitted, draft=draft)

    def score(self, rows: np.ndarray, emitted: Sequence[int], *, raw: np.ndarray, q: np.ndarray) -> list[TokenLogprob]:
        return super().score(rows, self._uncut, raw=raw, q=q)


class LogprobsPastStop(DecodeZooEngine):
    """The tokens are cut at a stop inside an accepted block, their logprobs are not (vLLM #47616)."""

    processors_class = _PastStop


class _StringsWithinRound(RequestProcessors):
    _round_start = 0

    def cut(self, emitted: Sequence[int]) -> tuple[list[int], StopReason | None]:
        self._round_start = len(self.output)
        return super().cut(emitted)

    def completes_string(self, output: Sequence[int]) -> bool:
        return super().completes_string(output[self._round_start :])  # the earlier rounds' text forgotten


class StopStringMissedAcrossRounds(DecodeZooEngine):
    """A stop string is looked for in the text of the current round only, so one that straddles two rounds is
    missed (stop strings matched per step, the shape of the stop-string reports issue 36 cites: SGLang
    #23802, #31599)."""

    processors_class = _StringsWithinRound


class _Float32(RequestProcessors):
    def score(self, rows: np.ndarray, emitted: Sequence[int], *, raw: np.ndarray, q: np.ndarray) -> list[TokenLogprob]:
        scored = super().score(rows, emitted, raw=raw, q=q)
        low = np.asarray(rows, dtype=np.float32)
        low = low - np.max(low, axis=1, keepdims=True)
        low = low - np.log(np.exp(low).sum(axis=1, keepdims=True))
        return [attrs.evolve(entry, logprob=min(0.0, float(low[i, entry.token]))) for i, entry in enumerate(scored)]


class Float32LogprobsEngine(DecodeZooEngine):
    """Correct, differently: the logprobs computed in float32 (within the contract's tolerance)."""

    processors_class = _Float32


class _NoFrequencyWhenDrafting(RequestProcessors):
    def verify_rows(self, logits: np.ndarray, draft: Sequence[int]) -> np.ndarray:
        if not draft:
            return super().verify_rows(logits, draft)
        kept = self.params
        self.params = attrs.evolve(self.params, frequency_penalty=0.0)
        try:
            return super().verify_rows(logits, draft)
        finally:
            self.params = kept


class FrequencyPenaltyIgnored(DecodeZooEngine):
    """Takes decode parameters but declares none, and drops the frequency penalty on the verify path of every
    round with a draft (vLLM #18902: frequency penalty silently without effect under EAGLE)."""

    decode_features = None  # type: ignore[assignment]  # a black box: it says nothing about what it honours
    processors_class = _NoFrequencyWhenDrafting


class PenaltiesSkippedWhenSampling(DecodeZooEngine):
    """Greedy requests get every processor; a sampled one gets its penalties dropped on the verify path of every
    round with a draft (the rejection sampler reading the unpenalized rows): greedy checks pass, sampling
    from the processed p does not."""

    def generate(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        *,
        eos_token_id: int | None = None,
        sampling: SamplingParams | None = None,
        decode: DecodeParams | None = None,
    ) -> Generation:
        self.processors_class = _NO_PENALTIES if sampling is not None else RequestProcessors
        return super().generate(prompt, max_new_tokens, eos_token_id=eos_token_id, sampling=sampling, decode=decode)


_NO_PENALTIES = _dropping(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0)


class DecodeMatchEngine(DecodeZooEngine):
    """Correct, differently: sample-and-match acceptance under decode parameters."""

    def __init__(self) -> None:
        SpecDecoder.__init__(self, small_reference(), NgramDrafter(), k=4, scheme="match")  # type: ignore[arg-type]
