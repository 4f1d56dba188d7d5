"""Engines with one decode-state bug each (docs/contract.md, "Decode state").

Each member is ``SpecDecoder`` on the zoo's small model with its ``processors_class`` changed in one
method, in the shape of a public report: penalties counted from the last token of a round only
(SGLang #33643), penalties or the logit bias dropped on the verify path of a round with a draft (vLLM
#18902, #38467), ``min_tokens`` masking EOS on one extra draft row (vLLM #41768), rejected draft tokens
left in the penalty buffer after the rollback (llama.cpp ``test_spec_checkpoint_sampler``), a stop
sequence looked for only at the end of a round (SGLang #23802). ``DecodeZooEngine`` is their control;
the correct variants roll back differently (replay rollback; processors advanced in place through the
draft and restored from a checkpoint).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from specproof.conformance.zoo._targets import small_reference
from specproof.contract import StopReason
from specproof.engine import NgramDrafter, RequestProcessors, SpecDecoder

__all__ = [
    "CheckpointedProcessorsEngine",
    "DecodeReplayEngine",
    "DecodeZooEngine",
    "LogitBiasIgnoredWhenDrafting",
    "MinTokensExtraRow",
    "PenaltiesIgnoredWhenDrafting",
    "PenaltyBufferKeepsRejected",
    "PenaltyFromLastToken",
    "StopMissedInsideBlock",
]


class DecodeZooEngine(SpecDecoder):
    """The control: the reference speculative decoder with decode parameters on the zoo's small model."""

    rollback_kind = "checkpoint"

    def __init__(self) -> None:
        super().__init__(small_reference(), NgramDrafter(), k=4, rollback=self.rollback_kind)  # type: ignore[arg-type]


class DecodeReplayEngine(DecodeZooEngine):
    """Correct, differently: replay rollback (the processors' committed state is untouched by it)."""

    rollback_kind = "replay"


class _Checkpointed(RequestProcessors):
    """The penalty buffer advanced in place through the draft while verifying, then put back to its
    checkpoint (its length before the draft) and advanced by the emitted tokens only."""

    def verify_rows(self, logits: np.ndarray, draft: Sequence[int]) -> np.ndarray:
        mark = (len(self.output), len(self.counted))
        rows = np.empty(logits.shape, dtype=np.float64)
        for i in range(logits.shape[0]):
            rows[i] = self.process(logits[i], (), draft_row=i)
            if i < len(draft):
                self.output.append(int(draft[i]))
                self.counted.append(int(draft[i]))
        del self.output[mark[0] :], self.counted[mark[1] :]  # the checkpoint restored
        return rows


class CheckpointedProcessorsEngine(DecodeZooEngine):
    """Correct, differently: processors advanced in place through each draft and restored from a checkpoint."""

    processors_class = _Checkpointed


class _LastTokenOnly(RequestProcessors):
    def commit(self, emitted: Sequence[int], *, draft: Sequence[int]) -> None:
        self.output.extend(int(t) for t in emitted)
        self.counted.extend(int(t) for t in emitted[-1:])


class PenaltyFromLastToken(DecodeZooEngine):
    """The penalty state is updated from the last token of each round only (SGLang #33643): the penalty
    becomes nominal over the mean accepted length."""

    processors_class = _LastTokenOnly


def _dropping(**off: object) -> type[RequestProcessors]:
    class Dropping(RequestProcessors):
        def verify_rows(self, logits: np.ndarray, draft: Sequence[int]) -> np.ndarray:
            if not draft:
                return super().verify_rows(logits, draft)
            kept = self.params, self.bias
            self.params = attrs.evolve(self.params, **off)
            if "logit_bias" in off:
                self.bias = np.zeros_like(self.bias)
            try:
                return super().verify_rows(logits, draft)
            finally:
                self.params, self.bias = kept

    return Dropping


class PenaltiesIgnoredWhenDrafting(DecodeZooEngine):
    """Repetition, presence and frequency penalties are skipped on the verify path of every round with a
    draft (vLLM #18902: frequency penalty silently without effect under EAGLE)."""

    processors_class = _dropping(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0)


class LogitBiasIgnoredWhenDrafting(DecodeZooEngine):
    """The logit bias is dropped on the verify path of every round with a draft (vLLM #38467)."""

    processors_class = _dropping(logit_bias={})


class _MinTokensExtraRow(RequestProcessors):
    def masks_eos(self, generated: int, *, draft_row: int) -> bool:
        return generated < self.params.min_tokens + (1 if draft_row > 0 else 0)


class MinTokensExtraRow(DecodeZooEngine):
    """``min_tokens`` masks EOS on one row too many when the row is a draft row (vLLM #41768)."""

    processors_class = _MinTokensExtraRow


class _KeepsRejected(RequestProcessors):
    def commit(self, emitted: Sequence[int], *, draft: Sequence[int]) -> None:
        super().commit(emitted, draft=draft)
        kept = len(emitted) - 1  # draft tokens accepted before the target's own token
        if kept < len(draft):
            self.counted.extend(int(t) for t in draft[kept:])  # the rejected ones stay in the buffer


class PenaltyBufferKeepsRejected(DecodeZooEngine):
    """After a rejection the penalty buffer keeps the rejected draft tokens (llama.cpp's
    test_spec_checkpoint_sampler: restoring a checkpoint did not restore the sampler)."""

    processors_class = _KeepsRejected


class _StopAtRoundEnd(RequestProcessors):
    def cut(self, emitted: Sequence[int]) -> tuple[list[int], StopReason | None]:
        tokens = list(emitted)
        for i, token in enumerate(tokens):
            if token in self.eos:
                return tokens[: i + 1], "eos"
        whole = [*self.output, *tokens]
        if tokens and any(tuple(whole[-len(seq) :]) == seq for seq in self.params.stop if len(whole) >= len(seq)):
            return tokens, "stop_sequence"
        return tokens, None


class StopMissedInsideBlock(DecodeZooEngine):
    """A stop sequence is looked for only at the end of a round, so one that ends inside an accepted block
    is missed (SGLang #23802)."""

    processors_class = _StopAtRoundEnd
