"""Byte-level stop strings (docs/contract.md, "Decode state", "Stop strings"): on a byte vocabulary, SpecDecoder's
output, token ids and logprobs are cut at the token that completes a stop string, exactly where plain decoding
stops, with its stop reason, whether the string ends inside an accepted block, straddles two rounds or ends on an
EOS."""

from __future__ import annotations

import pytest

from _targets import small_target
from specproof.conformance.checks.decode_state import ScheduleDrafter
from specproof.contract import DecodeParams
from specproof.contract.decode_state import ends_a_stop_string, plain_decode_with
from specproof.contract.errors import InvalidSettingError
from specproof.engine import NgramDrafter, SpecDecoder

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


def _free() -> list[int]:
    return list(plain_decode_with(small_target(), PROMPT, 16, decode=DecodeParams()).tokens)


@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
@pytest.mark.parametrize(
    ("where", "span", "eos", "schedule"),
    [
        ("inside an accepted block", slice(1, 3), None, [(4, 4)]),
        ("straddling two rounds", slice(3, 6), None, [(4, 4)]),  # rounds of 5: tokens 0-4, then 5-9
        ("after a rejection, across rounds", slice(2, 5), None, [(4, 1), (4, 4)]),
        ("on the same token as an EOS", slice(6, 8), 7, [(4, 4)]),
    ],
)
def test_a_stop_string_cuts_tokens_and_logprobs_where_plain_decoding_stops(
    rollback: str, where: str, span: slice, eos: int | None, schedule: list[tuple[int, int]]
) -> None:
    free = _free()
    params = DecodeParams(stop_strings=[bytes(free[span])], logprobs=0)
    eos_id = None if eos is None else free[eos]
    want = plain_decode_with(small_target(), PROMPT, 16, decode=params, eos_token_id=eos_id)
    assert want.stop_reason in ("eos", "stop_sequence") and len(want.tokens) < 16, where
    decoder = SpecDecoder(small_target(), NgramDrafter(), k=4, rollback=rollback)  # type: ignore[arg-type]
    decoder.drafter = ScheduleDrafter(len(PROMPT), free, schedule, decoder.target.vocab_size)
    gen = decoder.generate(PROMPT, 16, decode=params, eos_token_id=eos_id)
    assert (gen.tokens, gen.stop_reason) == (want.tokens, want.stop_reason), where
    assert gen.logprobs is not None and [lp.token for lp in gen.logprobs] == list(gen.tokens)


def test_the_straddling_case_straddles() -> None:
    """The fixture's worth: with rounds of five tokens, the second case's string spans rounds 0 and 1."""
    free = _free()
    decoder = SpecDecoder(small_target(), NgramDrafter(), k=4)
    decoder.drafter = ScheduleDrafter(len(PROMPT), free, [(4, 4)], decoder.target.vocab_size)
    gen = decoder.generate(PROMPT, 16, decode=DecodeParams(stop_strings=[bytes(free[3:6])]))
    assert gen.steps is not None and [len(s.accepted) for s in gen.steps][:1] == [5] and len(gen.tokens) == 6


def test_the_oracle_matches_a_string_ending_on_the_last_token_only() -> None:
    assert ends_a_stop_string([1, 2, 3], [b"\x02\x03"])
    assert not ends_a_stop_string([1, 2, 3, 4], [b"\x02\x03"])  # it ended one token earlier
    assert not ends_a_stop_string([1, 300], [b"\x01"])  # an id past the bytes has no text
    assert ends_a_stop_string([1, 300, 2], [b"\x01\x02"])  # ...and does not break the text it sits in


@pytest.mark.parametrize(("bad", "message"), [([""], "empty"), ("ab", "list of strings"), ([3], "not a str")])
def test_bad_stop_strings_are_refused_naming_them(bad: object, message: str) -> None:
    with pytest.raises(InvalidSettingError, match=message):
        DecodeParams(stop_strings=bad)  # type: ignore[arg-type]


def test_stop_strings_take_text_and_round_trip_through_json() -> None:
    params = DecodeParams(stop_strings=["ab", b"\xff"])
    assert params.stop_strings == (b"ab", b"\xff")
    assert DecodeParams.from_json(params.to_json()) == params
