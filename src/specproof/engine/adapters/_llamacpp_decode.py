"""The ``llamacpp:`` engine's decode parameters: ``DecodeParams`` as llama.cpp's own sampler chain, or a refusal
naming what llama.cpp cannot honour (docs/contract.md, "Decode state"; docs/real-engines.md).

``Llama.generate`` builds its chain once per call and feeds it every token it commits (``llama_sampler_sample``
accepts the sampled token; a draft token is never accepted, only the sample at its row), so the state under
test is llama.cpp's. The chain here is made of llama.cpp's samplers in the contract's order:

1. ``penalties`` (repeat only), fed the prompt before decoding: the contract's ``repetition_penalty`` counts
   the prompt and the output (llama-cpp-python feeds the sampler nothing of the prompt);
2. ``penalties`` (presence and frequency only), fed nothing before decoding: they count the output;
3. ``logit_bias``;
4. with ``logprobs`` asked, a recording stage (``_llamacpp_logprobs``): the processed row each pick sees;
5. greedy, or the sampling chain with the temperature first (``temp``, then top-k, top-p, min-p, ``dist``):
   the contract's order.

Both penalty windows cover the whole context (llama.cpp counts the last ``penalty_last_n`` tokens only).
A ``grammar`` is llama.cpp's grammar sampler after the bias (the contract's order: the grammar last, the logprobs
after it) on the request's grammar translated to GBNF (``_llamacpp_grammar``, which refuses what it cannot
translate faithfully); llama.cpp ends a complete grammar only on its end-of-generation id, so the request's EOS
ids must be that one id (the engine's ``eos=`` option). Refused (``UnsupportedParameterError``): ``min_tokens``
and ``bad_words``, which llama.cpp's sampler chain and ``Llama.generate`` lack (docs/real-engines.md).
Stops (EOS ids, token-sequence stops) are the caller's with llama-cpp-python
(``create_completion`` cuts its stop strings itself): the adapter stops the token stream where the contract
says, so ``decode.stop`` judges the tokens llama.cpp emitted up to the stop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from specproof.contract import DecodeParams, SamplingParams
from specproof.contract.errors import InvalidSettingError, UnsupportedParameterError
from specproof.engine.adapters._decode_option import refuse_unmapped

__all__ = ["LLAMACPP_DECODE_FEATURES", "build_decode_chain", "check_llamacpp_decode", "stop_reason_after"]

_MAPPED = frozenset({"repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias", "eos_token_ids",
                     "stop", "logprobs", "grammar"})  # fmt: skip

LLAMACPP_DECODE_FEATURES: tuple[str, ...] = (
    "penalties", "logit_bias", "stop_sequences", "logprobs", "top_logprobs", "grammar",
)  # fmt: skip
"""What the ``llamacpp:`` engine declares (``decode_features``); ``min_tokens`` and ``bad_words`` are refused, and
a grammar without a faithful GBNF translation."""


def check_llamacpp_decode(decode: object) -> DecodeParams:
    """``decode`` if llama.cpp can honour all of it, else ``UnsupportedParameterError`` naming the parameter."""
    if not isinstance(decode, DecodeParams):
        raise InvalidSettingError(f"decode must be DecodeParams or None, got {type(decode).__name__}")
    if decode.min_tokens > 0:
        raise UnsupportedParameterError(
            f"llamacpp: min_tokens={decode.min_tokens}: llama.cpp's sampler chain has no min-tokens sampler and "
            "Llama.generate no such argument"
        )
    if decode.bad_words:
        raise UnsupportedParameterError(
            f"llamacpp: bad_words {[list(w) for w in decode.bad_words]}: llama.cpp's sampler chain has no "
            "bad-words sampler and Llama.generate no such argument"
        )
    refuse_unmapped(decode, mapped=_MAPPED, where="llamacpp")
    return decode


def build_decode_chain(
    internals: Any,
    *,
    n_vocab: int,
    window: int,
    decode: DecodeParams,
    prompt: Sequence[int],
    sampling: SamplingParams | None,
    seed: int,
    recorder: Callable[[Any], None] | None = None,
    grammar: Callable[[Any], None] | None = None,
) -> Any:
    """A ``LlamaSampler`` (``internals``: ``llama_cpp._internals``) for ``decode`` on a request of ``prompt``,
    greedy or sampled at ``sampling``; ``window``: the penalties' ``penalty_last_n`` (the context's size);
    ``recorder``: a custom stage after the processors, before the pick (``LogprobRecorder``); ``grammar``: adds
    llama.cpp's grammar sampler to the chain it is given (after the bias, before the recorder)."""
    chain = internals.LlamaSampler()
    if decode.repetition_penalty != 1.0:
        chain.add_penalties(
            n_vocab=n_vocab, penalty_last_n=window, penalty_repeat=decode.repetition_penalty,
            penalty_freq=0.0, penalty_present=0.0,
        )  # fmt: skip
        for token in prompt:  # only this sampler is in the chain yet: only it sees the prompt
            chain.accept(int(token))
    if (decode.presence_penalty, decode.frequency_penalty) != (0.0, 0.0):
        chain.add_penalties(
            n_vocab=n_vocab, penalty_last_n=window, penalty_repeat=1.0,
            penalty_freq=decode.frequency_penalty, penalty_present=decode.presence_penalty,
        )  # fmt: skip
    if decode.logit_bias:
        chain.add_logit_bias(n_vocab, {int(t): float(b) for t, b in decode.logit_bias})
    if grammar is not None:
        grammar(chain)
    if recorder is not None:
        chain.add_custom(recorder)
    if sampling is None or sampling.greedy:
        chain.add_greedy()
        return chain
    chain.add_temp(float(sampling.temperature))  # the contract divides by the temperature before truncating
    chain.add_top_k(int(sampling.top_k))  # 0: off in llama.cpp as in the contract
    chain.add_top_p(float(sampling.top_p), 1)
    chain.add_min_p(float(sampling.min_p), 1)
    chain.add_dist(int(seed))
    return chain


def stop_reason_after(output: Sequence[int], decode: DecodeParams, eos_ids: frozenset[int]) -> str | None:
    """``eos`` when ``output`` ends with an EOS id, ``stop_sequence`` when it ends with one of ``decode.stop``,
    else None (the contract's order: an EOS wins)."""
    if not output:
        return None
    if output[-1] in eos_ids:
        return "eos"
    for seq in decode.stop:
        if len(output) >= len(seq) and tuple(output[-len(seq) :]) == seq:
            return "stop_sequence"
    return None
