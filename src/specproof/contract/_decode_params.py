"""``DecodeParams``: the decode-time state a request carries beside ``SamplingParams`` (docs/contract.md,
"Decode state"), validated here and nowhere else.

A request's processors (repetition / presence / frequency penalties, a logit bias, bad words,
``min_tokens``), its stops (several EOS ids, token-sequence stops, byte-level stop strings) and whether it
asks for logprobs. Every field is keyword-only;
``check_vocab`` checks the token ids against a vocabulary before any decoding starts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from numbers import Integral, Real

import attrs

from specproof.contract._grammar import Grammar
from specproof.contract.errors import InvalidSettingError, TokenRangeError

__all__ = ["DECODE_FEATURES", "DecodeParams"]

DECODE_FEATURES: tuple[str, ...] = (
    "penalties",
    "logit_bias",
    "bad_words",
    "min_tokens",
    "stop_sequences",
    "grammar",
    "logprobs",
    "top_logprobs",
    "stop_strings",
    "prompt_logprobs",
)
"""What an engine may declare it honours (``decode_features``); a check needing an undeclared one skips."""


def _number(name: str, value: object, *, low: float, high: float, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise InvalidSettingError(f"decode {name}={value!r} must be a finite number")
    number = float(value)
    if number < low or (low_open and number == low) or number > high:
        raise InvalidSettingError(f"decode {name}={value!r} must be in {'(' if low_open else '['}{low:g}, {high:g}]")
    return number


def _token(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or int(value) < 0:
        raise InvalidSettingError(f"decode {name} holds {value!r}, which is not a token id (an integer >= 0)")
    return int(value)


def _bias(value: object) -> tuple[tuple[int, float], ...]:
    if isinstance(value, tuple) and all(isinstance(pair, tuple) and len(pair) == 2 for pair in value):
        value = dict(value)  # the converted form itself (attrs.evolve passes it back through)
    if not isinstance(value, Mapping):
        raise InvalidSettingError(f"decode logit_bias={value!r} must be a mapping token id -> bias")
    return tuple(
        sorted((_token("logit_bias", k), _number(f"logit_bias[{k}]", v, low=-1e2, high=1e2)) for k, v in value.items())
    )


def _sequences(name: str, value: object) -> tuple[tuple[int, ...], ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidSettingError(f"decode {name}={value!r} must be a list of token-id sequences")
    out = []
    for seq in value:
        if isinstance(seq, (str, bytes)) or not isinstance(seq, Iterable):
            raise InvalidSettingError(f"decode {name} holds {seq!r}, which is not a sequence of token ids")
        tokens = tuple(_token(name, t) for t in seq)
        if not tokens:
            raise InvalidSettingError(f"decode {name} holds an empty sequence (it would match everywhere)")
        out.append(tokens)
    return tuple(out)


def _bad_words(value: object) -> tuple[tuple[int, ...], ...]:
    return _sequences("bad_words", value)


def _stops(value: object) -> tuple[tuple[int, ...], ...]:
    return _sequences("stop", value)


def _ids(value: object) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidSettingError(f"decode eos_token_ids={value!r} must be a list of token ids")
    return tuple(sorted({_token("eos_token_ids", t) for t in value}))


def _stop_strings(value: object) -> tuple[bytes, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidSettingError(f"decode stop_strings={value!r} must be a list of strings (str or bytes)")
    out = []
    for text in value:
        if not isinstance(text, (str, bytes)):
            raise InvalidSettingError(f"decode stop_strings holds {text!r}, which is not a str or bytes")
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        if not data:
            raise InvalidSettingError("decode stop_strings holds an empty string (it would match everywhere)")
        out.append(data)
    return tuple(out)


MAX_TOP_LOGPROBS = 20
"""The most alternatives a request may ask for per position (as OpenAI-style APIs allow)."""


def _top_logprobs(value: object, name: str = "logprobs") -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Integral) or not 0 <= int(value) <= MAX_TOP_LOGPROBS:
        raise InvalidSettingError(
            f"decode {name}={value!r} must be None (not asked) or how many alternatives, 0-{MAX_TOP_LOGPROBS}"
        )
    return int(value)


def _min_tokens(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or int(value) < 0:
        raise InvalidSettingError(f"decode min_tokens={value!r} must be an integer >= 0")
    return int(value)


def _grammar(value: object) -> Grammar | None:
    return None if value is None else Grammar.from_json(value)


@attrs.frozen(kw_only=True)
class DecodeParams:
    """A request's logits processors and stops (all off by default).

    ``repetition_penalty`` (1: off) divides a positive logit and multiplies a negative one of every
    token seen in the prompt or the output; ``presence_penalty`` and ``frequency_penalty`` (0: off)
    subtract ``presence * (count > 0) + frequency * count`` over the output's tokens; ``logit_bias`` adds
    a bias per token id; ``bad_words`` bans a sequence's last token where the output ends with the rest
    of it; ``min_tokens`` masks every EOS id until that many tokens are out; ``eos_token_ids`` (beside
    ``generate``'s ``eos_token_id``) end the output with stop reason ``eos``, ``stop`` (token
    sequences) with ``stop_sequence``, the stopping tokens included. ``grammar`` (a ``Grammar``, or its
    ``to_json`` form) masks every token the grammar does not allow next, after the other processors; it
    needs an EOS id to end on (``grammar_eos``). ``logprobs`` (None: not asked) asks
    for each emitted token's logprob after the processors and that many top alternatives
    (``Generation.logprobs``). ``stop_strings`` (str, UTF-8, or bytes) end the output with ``stop_sequence`` at
    the token whose text completes one, on a byte vocabulary (token ``t < 256`` is the byte ``t``).
    ``prompt_logprobs`` (None: not asked) asks for each prompt token's logprob after the ones before it (the
    first has none), before any processor, and that many top alternatives (``Generation.prompt_logprobs``).
    """

    repetition_penalty: float = attrs.field(
        default=1.0, converter=lambda v: _number("repetition_penalty", v, low=0.0, high=100.0, low_open=True)
    )
    presence_penalty: float = attrs.field(
        default=0.0, converter=lambda v: _number("presence_penalty", v, low=-100.0, high=100.0)
    )
    frequency_penalty: float = attrs.field(
        default=0.0, converter=lambda v: _number("frequency_penalty", v, low=-100.0, high=100.0)
    )
    logit_bias: tuple[tuple[int, float], ...] = attrs.field(factory=dict, converter=_bias)
    bad_words: tuple[tuple[int, ...], ...] = attrs.field(default=(), converter=_bad_words)
    min_tokens: int = attrs.field(default=0, converter=_min_tokens)
    eos_token_ids: tuple[int, ...] = attrs.field(default=(), converter=_ids)
    stop: tuple[tuple[int, ...], ...] = attrs.field(default=(), converter=_stops)
    grammar: Grammar | None = attrs.field(default=None, converter=_grammar)
    logprobs: int | None = attrs.field(default=None, converter=_top_logprobs)
    stop_strings: tuple[bytes, ...] = attrs.field(default=(), converter=_stop_strings)
    prompt_logprobs: int | None = attrs.field(default=None, converter=lambda v: _top_logprobs(v, "prompt_logprobs"))

    def features(self) -> frozenset[str]:
        """The ``DECODE_FEATURES`` this request uses (what an engine must declare to be judged on it)."""
        penalties = (self.repetition_penalty, self.presence_penalty, self.frequency_penalty) != (1.0, 0.0, 0.0)
        used = {
            "penalties": penalties,
            "logit_bias": bool(self.logit_bias),
            "bad_words": bool(self.bad_words),
            "min_tokens": self.min_tokens > 0,
            "stop_sequences": bool(self.stop),
            "grammar": self.grammar is not None,
            "logprobs": self.logprobs is not None,
            "top_logprobs": bool(self.logprobs) or bool(self.prompt_logprobs),  # alternatives beside a logprob
            "stop_strings": bool(self.stop_strings),
            "prompt_logprobs": self.prompt_logprobs is not None,
        }
        return frozenset(name for name, on in used.items() if on)

    def check_vocab(self, vocab_size: int) -> None:
        """A ``TokenRangeError`` naming the field whose token id is outside ``[0, vocab_size)``."""
        fields: dict[str, Iterable[int]] = {
            "logit_bias": (t for t, _ in self.logit_bias),
            "bad_words": (t for seq in self.bad_words for t in seq),
            "eos_token_ids": self.eos_token_ids,
            "stop": (t for seq in self.stop for t in seq),
            "grammar reasoning_end": () if self.grammar is None else self.grammar.reasoning_end,
        }
        for name, asked in (("logprobs", self.logprobs), ("prompt_logprobs", self.prompt_logprobs)):
            if asked is not None and asked > vocab_size:
                raise TokenRangeError(f"decode {name}={asked} asks for more alternatives than the {vocab_size} ids")
        for name, tokens in fields.items():
            for token in tokens:
                if token >= vocab_size:
                    raise TokenRangeError(f"decode {name} holds token {token}, outside [0, {vocab_size})")

    def eos_set(self, eos_token_id: int | None) -> frozenset[int]:
        """Every EOS id of a call: ``eos_token_ids`` and ``generate``'s ``eos_token_id``."""
        return frozenset((*self.eos_token_ids, *(() if eos_token_id is None else (int(eos_token_id),))))

    def grammar_eos(self, eos_token_id: int | None) -> frozenset[int]:
        """The EOS ids a grammar ends on (``eos_set``); an ``InvalidSettingError`` when there is none."""
        eos = self.eos_set(eos_token_id)
        if self.grammar is not None and not eos:
            raise InvalidSettingError(
                "decode grammar needs an EOS id to end on: give eos_token_ids or generate's eos_token_id"
            )
        return eos

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = {
            "repetition_penalty": self.repetition_penalty,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "logit_bias": {str(t): b for t, b in self.logit_bias},
            "bad_words": [list(s) for s in self.bad_words],
            "min_tokens": self.min_tokens,
            "eos_token_ids": list(self.eos_token_ids),
            "stop": [list(s) for s in self.stop],
        }
        # absent when off: a request without them reads as before (and as an engine of the wire expects)
        if self.logprobs is not None:
            data["logprobs"] = self.logprobs
        if self.stop_strings:
            data["stop_strings"] = [list(text) for text in self.stop_strings]  # bytes as JSON: their values
        if self.grammar is not None:
            data["grammar"] = self.grammar.to_json()
        if self.prompt_logprobs is not None:
            data["prompt_logprobs"] = self.prompt_logprobs
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> DecodeParams:
        known = {f.name for f in attrs.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidSettingError(f"decode: unknown parameter {unknown[0]!r} (known: {', '.join(sorted(known))})")
        values = dict(data)
        strings = values.get("stop_strings")
        if isinstance(strings, list) and all(isinstance(t, list) for t in strings):  # to_json's byte values
            try:
                values["stop_strings"] = [bytes(t) for t in strings]
            except (TypeError, ValueError):
                raise InvalidSettingError(f"decode stop_strings={strings!r} holds a value that is not a byte") from None
        bias = values.get("logit_bias")
        if isinstance(bias, Mapping):  # JSON object keys are strings
            try:
                values["logit_bias"] = {int(str(k)): v for k, v in bias.items()}
            except ValueError:
                raise InvalidSettingError(f"decode logit_bias={bias!r} has a key that is not a token id") from None
        return cls(**values)  # type: ignore[arg-type]
