"""Sampling over specproof-engine/1 (docs/protocol.md, Sampling): the ``sampling`` object on ``generate``,
the suite drafter's sparse ``q`` rows on ``draft`` and their bounds, the capability a client needs before
it asks, and the Python test engine (``tests/_wire_py_engine.py sampling``) sampling with ``SpecDecoder``:
one seed one output, different seeds different outputs, ``temperature=0`` equal to greedy.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _wire_helpers import PY_ENGINE, start
from specproof.contract.errors import DrafterContractError, InvalidSettingError
from specproof.contract.sampling import SampledDraft, SamplingParams
from specproof.engine import NgramDrafter
from specproof.wire import (
    WireEngine,
    decode_q_rows,
    drafter_generator,
    encode_q_rows,
    message_errors,
)
from specproof.wire import _q_rows as q_rows_module

PROMPT = [1, 2, 3, 4, 5, 1, 2, 3]


# --------------------------------------------------------------------------- schemas


def _generate(**extra: Any) -> dict[str, Any]:
    return {"type": "generate", "id": 1, "prompt": [1, 2], "max_new_tokens": 4, **extra}


def test_a_generate_carries_the_sampling_parameters_as_sampling_params_writes_them() -> None:
    params = SamplingParams(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, seed=2**63 - 1)
    message = json.loads(json.dumps(_generate(sampling=params.to_json(), scheme="match")))
    assert message_errors(message) == []
    assert SamplingParams.from_json(message["sampling"]) == params
    assert message_errors(_generate(sampling={"temperature": 1.0})) == []  # the rest default to off
    assert message_errors(_generate(sampling={"temperature": 1.0, "seed": None})) == []


@pytest.mark.parametrize(
    ("sampling", "field"),
    [
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": 1e7}, "temperature"),
        ({"top_p": 0.9}, "temperature"),  # temperature is required
        ({"temperature": 1.0, "top_p": 0.0}, "top_p"),
        ({"temperature": 1.0, "top_p": 1.5}, "top_p"),
        ({"temperature": 1.0, "min_p": 1.0}, "min_p"),
        ({"temperature": 1.0, "top_k": -1}, "top_k"),
        ({"temperature": 1.0, "top_k": 2.5}, "top_k"),
        ({"temperature": 1.0, "seed": 2**63}, "seed"),
        ({"temperature": 1.0, "seed": -1}, "seed"),
        ({"temperature": 1.0, "temp": 2}, "temp"),  # closed: a typo is an error
    ],
)
def test_the_schema_refuses_sampling_parameters_out_of_range(sampling: dict[str, Any], field: str) -> None:
    errors = message_errors(_generate(sampling=sampling))
    assert errors and any(field in e for e in errors), errors


def test_the_schema_refuses_an_unknown_scheme() -> None:
    assert message_errors(_generate(sampling={"temperature": 1.0}, scheme="typical"))


def test_a_hello_may_list_schemes_and_a_newer_engines_names_pass() -> None:
    hello = {
        "type": "hello",
        "protocol": "specproof-engine/1",
        "engine": {"name": "x"},
        "vocab_size": 8,
        "max_context": 16,
        "k": 2,
        "rollback": "replay",
        "capabilities": ["greedy", "sampling", "seeded"],
        "sampling_schemes": ["match", "typical-acceptance"],
    }
    assert message_errors(hello) == []
    assert message_errors({**hello, "sampling_schemes": []})


def test_draft_q_rows_validate_and_malformed_pairs_are_refused() -> None:
    good = {"type": "draft", "id": 1, "round": 0, "tokens": [3, 4], "q": [[[3, 0.25], [5, 0.75]], [[4, 1.0]]]}
    assert message_errors(good) == []
    assert message_errors({**good, "q": [[[3, 0.0]]]})  # probability 0 is not sent
    assert message_errors({**good, "q": [[[3, 0.5, 1]]]})  # a pair has two items
    assert message_errors({**good, "q": [[]]})  # a row has at least one pair
    assert message_errors({**good, "q": [[[-1, 1.0]]]})


# --------------------------------------------------------------------------- q rows


def _rows(draw: st.DrawFn) -> tuple[np.ndarray, list[int]]:
    vocab = draw(st.integers(2, 40))
    n = draw(st.integers(0, 4))
    q = np.zeros((n, vocab))
    tokens = []
    for i in range(n):
        support = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=vocab, unique=True))
        weights = np.array(draw(st.lists(st.floats(1e-6, 1.0), min_size=len(support), max_size=len(support))))
        q[i, support] = weights / weights.sum()
        tokens.append(draw(st.sampled_from(support)))
    return q, tokens


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_q_rows_round_trip_through_json_exactly(data: st.DataObject) -> None:
    q, tokens = data.draw(st.composite(_rows)())
    encoded = encode_q_rows(q, tokens)
    one_hot = all(q[i, t] == 1.0 for i, t in enumerate(tokens))
    assert (encoded is None) == one_hot
    wire = json.loads(json.dumps(encoded))
    decoded = decode_q_rows(wire, tokens, q.shape[1])
    assert np.array_equal(decoded, q)  # float64 survives JSON bit for bit; zeros are left out and come back
    if encoded is not None:
        for row in encoded:
            ids = [pair[0] for pair in row]
            assert ids == sorted(ids) and all(pair[1] > 0 for pair in row)


@pytest.mark.parametrize(
    ("rows", "tokens", "problem"),
    [
        ([[[1, 1.0]]], [1, 2], "1 rows for 2 draft tokens"),
        ([[[9, 1.0]]], [1], "expected [token in [0, 8)"),
        ([[[1, 0.5], [1, 0.5]]], [1], "twice"),
        ([[[1, 0.5], [2, 0.4]]], [1], "sums to"),
        ([[[2, 1.0]]], [1], "no mass"),
        ([[[1, 1.5]]], [1], "not in (0, 1]"),
        ([[]], [1], "non-empty"),
        ("[[1, 1.0]]", [1], "rows for 1 draft tokens"),
    ],
)
def test_decode_q_rows_names_the_problem(rows: object, tokens: list[int], problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)):
        decode_q_rows(rows, tokens, 8)


def test_q_rows_past_the_limit_are_refused_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(q_rows_module, "MAX_Q_PAIRS", 5)
    q = np.full((2, 4), 0.25)
    with pytest.raises(InvalidSettingError, match="8 non-zero entries, more than the 5"):
        encode_q_rows(q, [0, 1])
    rows = [[[t, 0.25] for t in range(4)]] * 2
    with pytest.raises(ValueError, match="8 pairs, more than the limit 5"):
        decode_q_rows(rows, [0, 1], 4)
    assert encode_q_rows(q[:1], [0]) is not None  # 4 pairs: within


def test_the_drafter_generator_is_seeded_by_the_request_seed_apart_from_the_engines() -> None:
    params = SamplingParams(temperature=1.0, seed=7)
    first, again = drafter_generator(params).random(4), drafter_generator(params).random(4)
    assert np.array_equal(first, again)
    assert not np.array_equal(first, np.random.default_rng(7).random(4))  # not the engine's stream
    assert not np.array_equal(first, drafter_generator(params.with_seed(8)).random(4))


# --------------------------------------------------------------------------- the client


class _Spy:
    """Every message the client sends over ``engine``'s channel."""

    def __init__(self, engine: WireEngine) -> None:
        self.sent: list[dict[str, Any]] = []
        inner = engine._channel.send

        def send(message: dict[str, Any], request: str) -> None:
            self.sent.append(json.loads(json.dumps(message)))
            inner(message, request)

        engine._channel.send = send  # type: ignore[method-assign]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.sent if m["type"] == kind]


class MixDrafter:
    """A sampling drafter: every token drawn from one fixed distribution ``row`` (context ignored)."""

    def __init__(self, row: np.ndarray) -> None:
        self.row = row

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        return [int(np.argmax(self.row))] * k

    def propose_sampled(
        self, context: Sequence[int], k: int, *, sampling: SamplingParams, rng: np.random.Generator
    ) -> SampledDraft:
        tokens = [int(rng.choice(len(self.row), p=self.row)) for _ in range(k)]
        return SampledDraft(tokens, np.tile(self.row, (len(tokens), 1)))


@pytest.fixture(scope="module")
def sampler() -> Iterator[WireEngine]:
    with start(PY_ENGINE, "sampling", timeout=30.0) as engine:
        yield engine


@pytest.fixture
def engine(sampler: WireEngine) -> Iterator[WireEngine]:
    sampler.drafter = None
    sampler.scheme = None
    sampler.reset()
    yield sampler
    sampler.drafter = None
    sampler.scheme = None


@pytest.mark.slow
def test_an_engine_without_the_capability_is_never_asked_to_sample() -> None:
    with start(PY_ENGINE, "ok", timeout=30.0) as plain:
        assert "sampling" not in plain.capabilities and plain.sampling_schemes == () and plain.scheme is None
        before = plain.traffic["bytes_sent"]
        with pytest.raises(InvalidSettingError, match=r"does not declare the capability 'sampling'.*nothing was sent"):
            plain.generate(PROMPT, 4, sampling=SamplingParams(temperature=0.8, seed=1))
        assert plain.traffic["bytes_sent"] == before
        with pytest.raises(InvalidSettingError, match="not one its handshake offers"):
            plain.scheme = "rejection"
        assert len(plain.generate(PROMPT, 4).tokens) == 4  # greedy still works


@pytest.mark.slow
def test_the_handshake_declares_sampling_seeded_and_the_schemes(engine: WireEngine) -> None:
    assert {"sampling", "seeded"} <= engine.capabilities
    assert engine.sampling_schemes == ("rejection", "match") and engine.scheme == "rejection"
    with pytest.raises(InvalidSettingError, match=r"sampling=.*SamplingParams"):
        engine.generate(PROMPT, 4, sampling={"temperature": 1.0})  # type: ignore[arg-type]
    with pytest.raises(InvalidSettingError, match="'typical' is not one its handshake offers"):
        engine.scheme = "typical"


@pytest.mark.slow
def test_the_request_carries_the_parameters_and_the_scheme_asked_for(engine: WireEngine) -> None:
    spy = _Spy(engine)
    params = SamplingParams(temperature=0.8, top_k=30, top_p=0.9, min_p=0.01, seed=11)
    engine.generate(PROMPT, 4, sampling=params)
    engine.scheme = "match"
    engine.generate(PROMPT, 4, sampling=params)
    engine.generate(PROMPT, 4)
    first, second, greedy = spy.of("generate")
    assert first["sampling"] == params.to_json() and "scheme" not in first  # the engine's default
    assert second["sampling"] == params.to_json() and second["scheme"] == "match"
    assert "sampling" not in greedy and "scheme" not in greedy  # greedy requests are as before


@pytest.mark.slow
def test_a_sampling_drafters_q_rows_go_with_its_draft_drawn_from_the_request_seed(engine: WireEngine) -> None:
    vocab = engine.vocab_size
    row = np.zeros(vocab)
    row[[2, 3, 4, 31]] = [0.4, 0.3, 0.2, 0.1]
    engine.drafter = MixDrafter(row)
    spy = _Spy(engine)
    params = SamplingParams(temperature=1.0, seed=5)
    first = engine.generate(PROMPT, 10, sampling=params)
    drafts = spy.of("draft")
    assert drafts, "the engine asked for no draft"
    rng = drafter_generator(params)  # the client's generator: the drafts are reproducible from the seed
    for message in drafts:
        tokens = message["tokens"]
        assert tokens == [int(rng.choice(vocab, p=row)) for _ in tokens]
        assert message["q"] == [[[2, 0.4], [3, 0.3], [4, 0.2], [31, 0.1]]] * len(tokens)
        assert np.array_equal(decode_q_rows(message["q"], tokens, vocab), np.tile(row, (len(tokens), 1)))
    assert engine.generate(PROMPT, 10, sampling=params).tokens == first.tokens
    # a deterministic drafter (no propose_sampled) sends no q: its rows are one-hot
    engine.drafter = NgramDrafter()
    spy.sent.clear()
    engine.generate(PROMPT, 10, sampling=params)
    assert spy.of("draft") and all("q" not in m for m in spy.of("draft"))


@pytest.mark.slow
def test_a_drafter_whose_q_is_not_a_distribution_is_refused_and_the_engine_stays_usable(engine: WireEngine) -> None:
    row = np.zeros(engine.vocab_size)
    row[[2, 3]] = [0.7, 0.7]
    bad = MixDrafter(row / row.sum())
    bad.propose_sampled = lambda context, k, *, sampling, rng: SampledDraft([2] * k, np.tile(row, (k, 1)))  # type: ignore[method-assign]
    engine.drafter = bad
    with pytest.raises(DrafterContractError, match="not distributions"):
        engine.generate(PROMPT, 6, sampling=SamplingParams(temperature=1.0, seed=1))
    engine.drafter = None
    assert len(engine.generate(PROMPT, 4, sampling=SamplingParams(temperature=1.0, seed=1)).tokens) == 4


# --------------------------------------------------------------------------- the Python engine samples


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["rejection", "match"])
@pytest.mark.parametrize("drafts", ["engine", "suite"])
def test_one_seed_one_output_and_different_seeds_differ(engine: WireEngine, scheme: str, drafts: str) -> None:
    engine.scheme = scheme
    if drafts == "suite":
        engine.drafter = NgramDrafter()
    params = SamplingParams(temperature=1.0, seed=0)
    outputs = {}
    for seed in range(5):
        got = engine.generate(PROMPT, 12, sampling=params.with_seed(seed)).tokens
        assert engine.generate(PROMPT, 12, sampling=params.with_seed(seed)).tokens == got, f"seed {seed}"
        outputs[seed] = got
    assert len(set(outputs.values())) >= 4, outputs  # 12 tokens at temperature 1: distinct seeds differ


@pytest.mark.slow
@pytest.mark.parametrize("greedy_params", [SamplingParams(temperature=0.0, seed=3), SamplingParams(top_k=1, seed=4)])
def test_temperature_zero_or_top_k_one_equals_greedy(engine: WireEngine, greedy_params: SamplingParams) -> None:
    plain = engine.generate(PROMPT, 12)
    assert engine.generate(PROMPT, 12, sampling=greedy_params).tokens == plain.tokens
    assert list(plain.tokens) == engine.greedy(PROMPT, 12)


@pytest.mark.slow
def test_the_planted_sampling_modes_show_their_fault() -> None:
    """The test engine's planted modes, for the sampling checks' meta-tests: each shows its fault here."""
    params = SamplingParams(temperature=1.0, seed=0)
    with start(PY_ENGINE, "sampling-argmax", timeout=30.0) as argmax:
        greedy = argmax.generate(PROMPT, 12).tokens
        assert all(argmax.generate(PROMPT, 12, sampling=params.with_seed(s)).tokens == greedy for s in range(4))
    with start(PY_ENGINE, "sampling-fixed-seed", timeout=30.0) as fixed:
        outputs = {fixed.generate(PROMPT, 12, sampling=params.with_seed(s)).tokens for s in range(4)}
        assert len(outputs) == 1
