"""The parameter-parity principle (docs/contract.md, "Decode state"): an engine that cannot honour a decode
parameter refuses the request with ``UnsupportedParameterError`` naming it, and the decode checks skip such
a request with that reason; an engine that silently ignores the parameter is rejected at quick.

The engines here are the zoo's decode control with one change each (``certify`` loads them as
``test_decode_refusals:NAME``, as tests/conformance/test_drafts_used.py loads its own).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import pytest

from specproof.conformance import certify
from specproof.conformance.zoo._decode_engines import DecodeZooEngine
from specproof.contract import DecodeParams, Generation, SamplingParams
from specproof.contract.errors import UnsupportedParameterError

pytestmark = pytest.mark.slow  # a certification of a few seconds per test


class _BiasOnly(DecodeZooEngine):
    decode_features = ("logit_bias",)


class _RefusesBias(_BiasOnly):
    """Declares logit_bias, refuses every request that carries one (an engine honest about a gap)."""

    def generate(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        *,
        eos_token_id: int | None = None,
        sampling: SamplingParams | None = None,
        decode: DecodeParams | None = None,
    ) -> Generation:
        if decode is not None and decode.logit_bias:
            raise UnsupportedParameterError("logit_bias: this engine has no bias processor")
        return super().generate(prompt, max_new_tokens, eos_token_id=eos_token_id, sampling=sampling, decode=decode)


class _IgnoresBias(_BiasOnly):
    """Declares logit_bias and drops it (vLLM #18902's class: the parameter silently without effect)."""

    def generate(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        *,
        eos_token_id: int | None = None,
        sampling: SamplingParams | None = None,
        decode: DecodeParams | None = None,
    ) -> Generation:
        dropped = None if decode is None else attrs.evolve(decode, logit_bias={})
        return super().generate(prompt, max_new_tokens, eos_token_id=eos_token_id, sampling=sampling, decode=dropped)


class _RefusesLongStops(DecodeZooEngine):
    """Stops on single tokens only (as vLLM on token ids): refuses a longer stop sequence."""

    def generate(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        *,
        eos_token_id: int | None = None,
        sampling: SamplingParams | None = None,
        decode: DecodeParams | None = None,
    ) -> Generation:
        if decode is not None and any(len(s) > 1 for s in decode.stop):
            raise UnsupportedParameterError("stop: sequences of more than one token are not supported")
        return super().generate(prompt, max_new_tokens, eos_token_id=eos_token_id, sampling=sampling, decode=decode)


class _RefusesEverything(DecodeZooEngine):
    """Declares every decode feature and refuses every request that carries any (sampled or greedy)."""

    def generate(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        *,
        eos_token_id: int | None = None,
        sampling: SamplingParams | None = None,
        decode: DecodeParams | None = None,
    ) -> Generation:
        if decode is not None and decode != DecodeParams():
            raise UnsupportedParameterError("this engine takes no decode parameters")
        return super().generate(prompt, max_new_tokens, eos_token_id=eos_token_id, sampling=sampling, decode=decode)


def refuses_everything() -> _RefusesEverything:
    return _RefusesEverything()


def refuses_bias() -> _RefusesBias:
    return _RefusesBias()


def ignores_bias() -> _IgnoresBias:
    return _IgnoresBias()


def refuses_long_stops() -> _RefusesLongStops:
    return _RefusesLongStops()


def _results(engine: str, only: str) -> dict[str, dict[str, object]]:
    report = certify("engine", engine=f"test_decode_refusals:{engine}", only=(only,), decode_state=True).to_json()
    return {str(r["invariant"]): r for r in report["results"]}


def test_a_refused_parameter_skips_its_check_naming_it() -> None:
    result = _results("refuses_bias", "decode.penalties")["decode.penalties"]
    assert result["status"] == "skip" and result["exercised"] == 0, result
    assert "refused" in str(result["detail"]) and "logit_bias" in str(result["detail"]), result


def test_a_silently_ignored_parameter_is_rejected_at_quick() -> None:
    result = _results("ignores_bias", "decode.penalties")["decode.penalties"]
    assert result["status"] == "fail", result
    assert "plain decoding with the same decode parameters" in str(result["violations"][0]), result


def test_requests_refused_in_part_leave_the_rest_judged() -> None:
    result = _results("refuses_long_stops", "decode.stop")["decode.stop"]
    assert result["status"] == "pass" and int(str(result["exercised"])) > 0, result


@pytest.mark.parametrize("check", ["decode.sampled", "decode.grammar-sampled"])
def test_a_refused_parameter_skips_the_sampled_checks_naming_it(check: str) -> None:
    """A refusal on a sampled run is the engine honest about a gap, as on a greedy one: a skip, not a failure."""
    report = certify(
        "engine", engine="test_decode_refusals:refuses_everything", only=(check,), decode_state=True
    ).to_json()
    (result,) = [r for r in report["results"] if r["invariant"] == check]
    assert result["status"] == "skip" and result["exercised"] == 0, result
    assert "refused" in str(result["detail"]) and "no decode parameters" in str(result["detail"]), result
