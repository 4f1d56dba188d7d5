"""Engines with one grammar bug each (docs/contract.md, "Decode state").

Each member is the decode zoo's engine (``SpecDecoder`` on the small model) whose request processors use
an ``EngineGrammar`` changed in one method, in the shape of a public report: the mask applied at the first
draft position only (TensorRT-LLM #7878), the matcher not rolled back after a rejection (llama.cpp's
``test_spec_checkpoint_sampler``), the matcher one token behind after an accepted block (vLLM #48516, the
doubled ``{{``), the grammar off for the rest of a block the reasoning delimiter arrived in (vLLM #44297),
a complete (terminated) matcher fed draft tokens (vLLM #52767, openvino.genai #4081). Their control is
``DecodeZooEngine``; ``ScratchMatcherEngine`` is correct, differently: it scans each draft on a copy of the
matcher instead of rolling the matcher back.
"""

from __future__ import annotations

from collections.abc import Sequence

import llguidance
import numpy as np

from specproof.conformance.zoo._decode_engines import DecodeZooEngine
from specproof.engine import EngineGrammar, RequestProcessors

__all__ = [
    "GrammarMaskFirstRowOnly",
    "GrammarNotRolledBack",
    "GrammarOffWhenDelimiterInBlock",
    "GrammarOneBehindAfterBlock",
    "GrammarTerminatedAdvanced",
    "ScratchMatcherEngine",
]


def _with_grammar(grammar: type[EngineGrammar]) -> type[RequestProcessors]:
    return type(f"{grammar.__name__}Processors", (RequestProcessors,), {"grammar_class": grammar})


class _FirstRowOnly(EngineGrammar):
    def constrains(self, draft_row: int) -> bool:
        return draft_row == 0


class GrammarMaskFirstRowOnly(DecodeZooEngine):
    """The grammar mask is applied to the first row of a verify forward only (TensorRT-LLM #7878: the draft
    bitmask wrong when more than one token is drafted)."""

    processors_class = _with_grammar(_FirstRowOnly)


class _NoRollback(EngineGrammar):
    def rewind(self, n: int) -> None:
        if n > 0:
            del self.fed[len(self.fed) - n :]  # the bookkeeping is put back, the matcher is not


class GrammarNotRolledBack(DecodeZooEngine):
    """After a rejection the matcher keeps the rejected draft tokens (llama.cpp's test_spec_checkpoint_sampler:
    restoring a checkpoint left them in the grammar state)."""

    processors_class = _with_grammar(_NoRollback)


class _OneBehind(EngineGrammar):
    def settle(self, output: Sequence[int], *, draft: Sequence[int]) -> None:
        emitted = len(output) - self.committed
        if draft and emitted == len(draft) + 1:  # a whole block accepted: the bonus token is not fed
            super().settle(output[:-1], draft=draft)
            self.committed = len(output)
            return
        super().settle(output, draft=draft)


class GrammarOneBehindAfterBlock(DecodeZooEngine):
    """After a fully accepted block the matcher is not fed the target's own next token: it stays one token
    behind (vLLM #48516, the saved grammar state one token behind, a doubled ``{{``)."""

    processors_class = _with_grammar(_OneBehind)


class _DelimiterAtRoundStart(EngineGrammar):
    def start_in_forward(self, history: Sequence[int]) -> int | None:
        return self.start  # where the committed output says; a delimiter inside the draft is not seen


class GrammarOffWhenDelimiterInBlock(DecodeZooEngine):
    """The reasoning delimiter is looked for in the committed output only, so the rows after a delimiter that
    arrives inside a speculated block are unconstrained (vLLM #44297)."""

    processors_class = _with_grammar(_DelimiterAtRoundStart)


class _AdvancesTerminated(EngineGrammar):
    def advance(self, token: int) -> bool:
        if self.matcher.is_stopped():  # "complete: the rest does not matter", and it is fed anyway
            self.matcher.consume_token(token)
            self.fed.append(token)
            return True
        return super().advance(token)


class GrammarTerminatedAdvanced(DecodeZooEngine):
    """Draft tokens after the grammar is complete are fed to the terminated matcher (vLLM #52767,
    openvino.genai #4081), which llguidance answers by entering its error state for good."""

    processors_class = _with_grammar(_AdvancesTerminated)


class _Scratch(EngineGrammar):
    committed_matcher: llguidance.LLMatcher | None = None

    def row_mask(self, history: Sequence[int], *, draft_row: int) -> np.ndarray | None:
        if draft_row == 0 and self.committed_matcher is None:
            self.committed_matcher, self.matcher = self.matcher, self.matcher.deep_copy()
        return super().row_mask(history, draft_row=draft_row)

    def settle(self, output: Sequence[int], *, draft: Sequence[int]) -> None:
        if self.committed_matcher is not None:  # drop the scratch copy: nothing to roll back
            self.matcher, self.committed_matcher = self.committed_matcher, None
            del self.fed[self.settled_fed :]
        super().settle(output, draft=draft)


class ScratchMatcherEngine(DecodeZooEngine):
    """Correct, differently: each draft is scanned on a deep copy of the matcher, dropped after the round; the
    committed matcher is only ever advanced by emitted tokens."""

    processors_class = _with_grammar(_Scratch)
