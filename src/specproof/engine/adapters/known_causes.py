"""The known upstream causes of the ``vllm:`` and ``llamacpp:`` engines' failures, and their workarounds.

One table, the single source of two things: the sentence a failing check's message gains when the
engine's settings match a row (``known_cause``: the engines' ``known_cause(invariant)``, which the
certification appends to the failure), and the table in docs/real-engines.md ("Known causes"), which
``markdown_table`` renders and tests/frameworks/test_known_causes.py holds equal to the page. A row
names the setting it applies to, the checks it shows in, the cause, the workaround and the page's
finding where the evidence and the upstream report are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

__all__ = ["DOC", "KNOWN_CAUSES", "KnownCause", "known_cause", "markdown_table"]

DOC = "docs/real-engines.md"

# every check a wrong token shows in: greedy, across requests, sampled, in batches (each request of a
# batch is compared with its solo run: a wrong token alone is one there too) and with decode parameters
_WRONG_TOKENS = (
    "engine.lossless",
    "engine.session",
    "engine.greedy-limit",
    "engine.sampled-distribution",
    "engine.sampled-support",
    "engine.seeds",
    "batch.isolation",
    "batch.schedule-invariance",
    "batch.slot-reuse",
    # with decode parameters: each request is compared with plain decoding under them
    "decode.penalties",
    "decode.min-tokens",
    "decode.stop",
    "decode.logprobs",  # judges the output against plain decoding's before the logprobs
    "decode.grammar",  # a valid output under the grammar, but not plain decoding's
)


@attrs.frozen(kw_only=True)
class KnownCause:
    """One row: ``when`` tests the adapter's settings; ``checks`` empty means every check (a crash)."""

    engine: str  # "vllm" | "llamacpp": the spec prefix
    setting: str  # the options it applies to, as a user writes them
    when: Callable[[Any], bool] = attrs.field(eq=False, repr=False)
    checks: tuple[str, ...]
    cause: str
    workaround: str
    finding: str  # where docs/real-engines.md tells it

    def sentence(self) -> str:
        """What a failure message gains: the cause, the workaround and where the page tells it."""
        return f"known cause ({DOC}, {self.finding}): {self.cause}; workaround: {self.workaround}"


KNOWN_CAUSES: tuple[KnownCause, ...] = (
    KnownCause(
        engine="vllm",
        setting="`speculative=ngram:K` with `prefix_caching=1`",
        when=lambda s: s.method is not None and s.prefix_caching,
        checks=(),
        cause="vLLM's hybrid prefix caching with speculation runs a Triton-only kernel, so every request crashes "
        "on CPU",
        workaround="`prefix_caching=0` (the default)",
        finding="vLLM finding 3",
    ),
    KnownCause(
        engine="vllm",
        setting="`speculative=ngram:K`",
        when=lambda s: s.method == "ngram",
        checks=_WRONG_TOKENS,
        cause="vLLM's CPU short-conv layer (ShortConv.forward_native) advances the conv state over rejected draft "
        "tokens, so n-gram speculation is lossy on LFM2",
        workaround="drop `speculative=` (plain greedy is lossless); no speculative setting of vLLM 0.32.0 on CPU is "
        "lossless on this hybrid model",
        finding="vLLM finding 1",
    ),
    KnownCause(
        engine="vllm",
        setting="`rotary=kernel`",
        when=lambda s: s.rotary == "kernel" and s.eager,
        checks=_WRONG_TOKENS,
        cause="vLLM's eager CPU rotary kernel (ops.rotary_embedding) is wrong on the 3-D query/key LFM2 passes",
        workaround="`rotary=native` (the default), or `eager=0`",
        finding="vLLM finding 2",
    ),
    KnownCause(
        engine="llamacpp",
        setting="`speculative=lookup:K` with `n_rs_seq` < K (llama.cpp's default 0)",
        when=lambda s: s.lookup > 0 and s.n_rs_seq < s.lookup,
        checks=(),
        cause="llama.cpp refuses to roll the recurrent state back past its n_rs_seq snapshots and Llama.generate "
        "ignores the refusal, so the first rejected draft ends the generation (llama_decode returned -1)",
        workaround="`n_rs_seq=K` (at least the draft length)",
        finding="llama.cpp finding 1",
    ),
    KnownCause(
        engine="llamacpp",
        setting="`speculative=lookup:K,n_rs_seq=N,reuse=1`",
        when=lambda s: s.lookup > 0 and s.n_rs_seq > 0 and s.reuse,
        checks=("engine.session",),
        cause="a prefix reuse across calls rolls LFM2's conv state back to a snapshot the last ubatch did not write "
        "(stale state)",
        workaround="`reuse=0` (the default: a fresh state per call)",
        finding="llama.cpp finding 2",
    ),
)


def known_cause(engine: str, settings: Any, invariant: str) -> KnownCause | None:
    """The first row of ``engine`` whose setting ``settings`` match and that shows in ``invariant``."""
    for row in KNOWN_CAUSES:
        if row.engine == engine and (not row.checks or invariant in row.checks) and row.when(settings):
            return row
    return None


def markdown_table() -> str:
    """The table of docs/real-engines.md's "Known causes" section (tests/frameworks/test_known_causes.py)."""
    lines = ["| engine | setting | shows in | cause | workaround | told in |", "|---|---|---|---|---|---|"]
    for row in KNOWN_CAUSES:
        shows = ", ".join(f"`{c}`" for c in row.checks) if row.checks else "every check (each request fails)"
        lines.append(f"| `{row.engine}:` | {row.setting} | {shows} | {row.cause} | {row.workaround} | {row.finding} |")
    return "\n".join(lines) + "\n"
