"""``stop_string_sets``: each shape of byte-level stop strings lies where it says on the continuation."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from specproof.strategies import STOP_STRING_SHAPES, stop_string_sets

PROMPT = [7, 8, 9]
CONTINUATION = list(range(20, 40))  # 20 distinct bytes: a string's place in the text is its own
K = 4


@given(data=st.data())
def test_every_string_is_placed_longer_than_a_block_or_begins_in_the_prompt(data: st.DataObject) -> None:
    placed = [bytes([25, 26])]
    strings = data.draw(stop_string_sets(PROMPT, CONTINUATION, k=K, placed=placed))
    text = bytes(CONTINUATION)
    for s in strings:
        if s in placed:
            continue
        if s[0] in PROMPT:  # the prompt's last bytes, then the continuation's first ones
            cut = next(i for i, b in enumerate(s) if b not in PROMPT)
            assert bytes(PROMPT).endswith(s[:cut]) and text.startswith(s[cut:]) and cut < len(s)
        else:  # more than a round emits (k + 1 tokens), at most 2k + 2
            assert s in text and K + 2 <= len(s) <= 2 * K + 2


def test_each_shape_is_drawn() -> None:
    seen: set[str] = set()

    @given(data=st.data())
    def draw(data: st.DataObject) -> None:
        strings = data.draw(stop_string_sets(PROMPT, CONTINUATION, k=K, placed=[b"\x19"]))
        seen.add(
            "begins in the prompt"
            if any(s[0] in PROMPT for s in strings)
            else "longer than a block"
            if any(len(s) > K + 1 for s in strings)
            else "placed"
        )

    draw()
    assert seen == set(STOP_STRING_SHAPES)


def test_a_continuation_shorter_than_a_block_keeps_the_placed_strings() -> None:
    @given(data=st.data())
    def draw(data: st.DataObject) -> None:
        strings = data.draw(stop_string_sets(PROMPT, [20, 21], k=K, placed=[b"\x14"]))
        assert b"\x14" in strings and all(s[0] in PROMPT or len(s) <= K for s in strings)

    draw()
