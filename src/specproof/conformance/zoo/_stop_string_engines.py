"""Engines with one stop-string bug each, and a correct matcher written differently (docs/contract.md, "Decode
state", "Stop strings").

A stop string is matched on the output's text whatever rounds emitted it. An incremental matcher keeps
some of the text before the round it scans; keeping one draft block's worth (enough for every string up
to a block long) misses a longer string that straddles rounds (the shape of SGLang #23802 / #31599: the
stop searched in a window of the latest tokens).
Matching over the prompt's text as well stops where plain decoding does not. The correct variant keeps
exactly the longest string's length less one byte of earlier text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from specproof.conformance.zoo._decode_engines import DecodeZooEngine
from specproof.contract import DecodeParams, StopReason
from specproof.engine import RequestProcessors

__all__ = [
    "STOP_STRING_MEMBERS",
    "StopStringInPromptText",
    "StopStringTailWindow",
    "StopStringWindowOneBlock",
]


_BLOCK = 5  # the most a round of ``DecodeZooEngine`` (k = 4) emits


class _OneBlockWindow(RequestProcessors):
    _round_start = 0

    def cut(self, emitted: Sequence[int]) -> tuple[list[int], StopReason | None]:
        self._round_start = len(self.output)
        return super().cut(emitted)

    def completes_string(self, output: Sequence[int]) -> bool:
        kept = output[max(0, self._round_start - _BLOCK) :]  # one block's worth of the text before the round
        return super().completes_string(kept)


class StopStringWindowOneBlock(DecodeZooEngine):
    """The matcher keeps one draft block's worth of text (k + 1 bytes) from before the round, not the longest
    stop string's length less one, so a string longer than a block that straddles rounds is missed."""

    processors_class = _OneBlockWindow


class _WithPrompt(RequestProcessors):
    def __init__(self, params: DecodeParams, prompt: Sequence[int], eos: frozenset[int], vocab_size: int) -> None:
        super().__init__(params, prompt, eos, vocab_size)
        self._prompt = [int(t) for t in prompt]

    def completes_string(self, output: Sequence[int]) -> bool:
        return output[-1] < 256 and super().completes_string([*self._prompt, *output])


class StopStringInPromptText(DecodeZooEngine):
    """Stop strings are matched on the prompt's text and the output's, so one that begins in the prompt stops the
    output where plain decoding goes on."""

    processors_class = _WithPrompt


class _TailWindow(RequestProcessors):
    def completes_string(self, output: Sequence[int]) -> bool:
        keep = max(len(s) for s in self.params.stop_strings)  # bytes that can end with this token's
        text = bytes(int(t) for t in output if int(t) < 256)[-keep:]
        return output[-1] < 256 and any(text.endswith(s) for s in self.params.stop_strings)


class StopStringTailWindow(DecodeZooEngine):
    """Correct, differently: the matcher keeps only the longest stop string's length of text."""

    processors_class = _TailWindow


STOP_STRING_MEMBERS: Final[dict[str, type[DecodeZooEngine]]] = {
    "stop_string_window_one_block": StopStringWindowOneBlock,
    "stop_string_in_prompt_text": StopStringInPromptText,
}
"""The stop-string zoo members, by name (``decode.stop-strings`` claims them)."""
