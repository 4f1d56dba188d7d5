"""The native C++ engine's decode-time state (native/src/processors.hpp; docs/protocol.md, Decode state):
penalties, a logit bias, bad words, ``min_tokens``, several EOS ids and stop sequences equal plain decoding
with the same processors (``specproof.contract.decode_state.plain_decode_with`` on the numpy target) on
both rollbacks through scripted suite drafts that accept, reject at 0, reject part-way and run past the
stop; ``final.logprobs`` equal a teacher-forced scoring of the output after the processors; a bad
``decode`` is answered with an error naming the field; and the planted ``--bug penalty-counts-rejected``
(the rejected draft tokens put into the penalty buffer) is rejected, directly and by ``certify`` on
``decode.penalties`` over ``exec:``.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import attrs
import numpy as np
import pytest

from _wire_helpers import Certified, certify_command, slow_certify
from specproof.conformance.checks.decode_state import ScheduleDrafter
from specproof.contract import DecodeParams, Generation
from specproof.contract.decode_state import OracleProcessors, plain_decode_with, processor_state
from specproof.contract.sampling import SamplingParams
from specproof.plugins import load_target
from specproof.wire import ExecEngine, WireEngine

pytestmark = pytest.mark.slow  # seconds per test: outside `tox -e quick`, always in `tox`

PROMPT = list(b"The quick brown fox jumps over the lazy dog. The quick")
N = 24
#: the native forward is within 1.5e-5 of numpy's logits (native/README.md); a logprob within this
LOGPROB_ATOL = 1e-4
#: (name, params, eos_token_id): each feature alone and the stops, one at a time
CASES: list[tuple[str, DecodeParams, int | None]] = [
    ("penalties", DecodeParams(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.7), None),
    ("bias and bad words", DecodeParams(logit_bias={32: -5.0, 101: 3.0}, bad_words=[[116, 104], [33]]), None),
    ("min_tokens", DecodeParams(min_tokens=5, eos_token_ids=[32, 101]), None),
    ("stops", DecodeParams(stop=[[32, 116]], eos_token_ids=[46]), 10),
]
#: (length, wrong position) per round: full blocks, rejected at 0, part-way, empty
SCHEDULES = [((4, 9),), ((4, 0),), ((4, 2), (3, 9), (0, 0), (4, 1))]


@pytest.fixture(scope="module")
def start(native: tuple[Path, Path]) -> Callable[..., WireEngine]:
    binary, weights = native

    def make(*args: str) -> ExecEngine:
        return ExecEngine([str(binary), "--weights", str(weights), *args], timeout=30.0, load_target=load_target)

    return make


@pytest.fixture(scope="module", params=["checkpoint", "replay"])
def engine(request: pytest.FixtureRequest, start: Callable[..., WireEngine]) -> Iterator[WireEngine]:
    with start("--rollback", request.param) as e:
        yield e


def plain(params: DecodeParams, eos: int | None, n: int = N) -> Generation:
    return plain_decode_with(load_target("trained"), PROMPT, n, decode=params, eos_token_id=eos)


def scripted(
    engine: WireEngine, params: DecodeParams, eos: int | None, schedule: Sequence[tuple[int, int]]
) -> Generation:
    """The engine's generation with drafts along plain decoding's continuation (run on past the stop)."""
    free = plain(attrs.evolve(params, stop=(), eos_token_ids=(), min_tokens=0), None, N + 4)
    engine.reset()
    engine.drafter = ScheduleDrafter(len(PROMPT), free.tokens, schedule, engine.vocab_size)
    try:
        return engine.generate(PROMPT, N, eos_token_id=eos, decode=params)
    finally:
        engine.drafter = None


def teacher_forced(params: DecodeParams, eos: int | None, tokens: Sequence[int]) -> np.ndarray:
    """Each token's log-softmax under the numpy target's row after the oracle's processors."""
    target = load_target("trained")
    target.reset()
    rows = np.asarray(target.forward([*PROMPT, *tokens[:-1]]), dtype=np.float64)[len(PROMPT) - 1 :]
    processors = OracleProcessors(params, PROMPT, eos_token_id=eos)
    out = []
    for row, token in zip(rows, tokens, strict=True):
        z = processors.apply(row)
        top = z.max()
        out.append(z[token] - top - np.log(np.exp(z - top).sum()))
        processors.feed(token)
    return np.array(out)


def test_the_handshake_declares_every_decode_feature_and_logprobs(engine: WireEngine) -> None:
    decode = {"penalties", "logit_bias", "bad_words", "min_tokens", "stop_sequences", "logprobs", "processor_state"}
    assert decode <= engine.capabilities
    features = ("penalties", "logit_bias", "bad_words", "min_tokens", "stop_sequences", "logprobs")
    assert engine.decode_features == features
    assert engine.ask_logprobs


@pytest.mark.parametrize("schedule", SCHEDULES, ids=["full", "rejected-at-0", "mixed"])
@pytest.mark.parametrize(("name", "params", "eos"), CASES, ids=[c[0] for c in CASES])
def test_each_feature_equals_plain_decoding_with_its_logprobs(
    engine: WireEngine, name: str, params: DecodeParams, eos: int | None, schedule: Sequence[tuple[int, int]]
) -> None:
    want = plain(params, eos)
    assert want.tokens != plain(DecodeParams(), None).tokens, f"{name}: the parameters change nothing here"
    got = scripted(engine, params, eos, schedule)
    assert (got.tokens, got.stop_reason) == (want.tokens, want.stop_reason)
    assert got.logprobs is not None and len(got.logprobs) == len(got.tokens)
    assert [entry.token for entry in got.logprobs] == list(got.tokens)
    values = [entry.logprob for entry in got.logprobs]
    np.testing.assert_allclose(values, teacher_forced(params, eos, got.tokens), atol=LOGPROB_ATOL, rtol=0)
    assert got.stats is not None and got.stats.drafted > 0
    # white-box: after every round, a fresh processor's state fed only the committed tokens
    states = engine.processor_states
    assert got.steps is not None and states is not None and len(states) == len(got.steps)
    assert all(s == processor_state(got.tokens[: s["generated"]]) for s in states)  # type: ignore[index]
    assert states[-1]["generated"] == len(got.tokens)


def test_logprobs_without_decode_state_and_none_when_not_asked(engine: WireEngine) -> None:
    got = engine.generate(PROMPT, 12)
    assert got.logprobs is not None
    values = [entry.logprob for entry in got.logprobs]
    np.testing.assert_allclose(values, teacher_forced(DecodeParams(), None, got.tokens), atol=LOGPROB_ATOL)
    engine.ask_logprobs = False
    try:
        assert engine.generate(PROMPT, 12).logprobs is None
    finally:
        engine.ask_logprobs = True


def test_sampled_requests_take_the_processors_too(engine: WireEngine) -> None:
    """Temperature 0 with processors is plain decoding with them; one seed gives one output at temperature 1."""
    params = CASES[0][1]
    assert (
        engine.generate(PROMPT, N, decode=params, sampling=SamplingParams(temperature=0.0)).tokens
        == plain(params, None).tokens
    )
    seeded = SamplingParams(temperature=1.0, seed=7)
    assert (
        engine.generate(PROMPT, N, decode=params, sampling=seeded).tokens
        == engine.generate(PROMPT, N, decode=params, sampling=seeded).tokens
    )


@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
def test_the_planted_penalty_bug_shows_as_a_divergence(start: Callable[..., WireEngine], rollback: str) -> None:
    params = CASES[0][1]
    with start("--rollback", rollback, "--bug", "penalty-counts-rejected") as buggy:
        assert scripted(buggy, params, None, SCHEDULES[0]).tokens == plain(params, None).tokens  # nothing rejected
        assert scripted(buggy, params, None, SCHEDULES[2]).tokens != plain(params, None).tokens
        first = buggy.processor_states[0]  # type: ignore[attr-defined]
        assert first["generated"] == 3 and first != processor_state(plain(params, None).tokens[:3])


def _exchange(native: tuple[Path, Path], *requests: dict[str, object]) -> list[dict[str, object]]:
    binary, weights = native
    lines = "".join(json.dumps(r) + "\n" for r in (*requests, {"type": "shutdown", "id": 99}))
    done = subprocess.run(
        [str(binary), "--weights", str(weights)], input=lines, capture_output=True, text=True, timeout=30, check=True
    )
    answers = [json.loads(line) for line in done.stdout.splitlines()[1:]]
    return [a for a in answers if a["type"] in ("final", "error", "ok")]  # round records left out


@pytest.mark.parametrize(
    ("decode", "named"),
    [
        ({"top_a": 1}, "unknown field 'top_a'"),
        ({"logit_bias": {"300": 1.0}}, "logit_bias key '300'"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"stop": [[]]}, "decode.stop"),
        ({"bad_words": [[999]]}, "decode.bad_words"),
        ({"bad_words": [[t] for t in range(256)]}, "masked every token"),
    ],
)
def test_a_bad_decode_is_answered_with_an_error_naming_it(
    native: tuple[Path, Path], decode: dict[str, object], named: str
) -> None:
    request = {"type": "generate", "id": 1, "prompt": [104, 105], "max_new_tokens": 3, "decode": decode}
    error, ok, bye = _exchange(native, request, {**request, "id": 2, "decode": {}})
    assert error["type"] == "error" and named in str(error["message"]), error
    assert ok["type"] == "final" and len(ok["tokens"]) == 3  # the engine stays usable
    assert "logprobs" not in ok  # not asked for
    assert bye["type"] == "ok"


def _certify(native: tuple[Path, Path], *engine_args: str) -> Certified:
    binary, weights = native
    spec = "exec:" + shlex.join([str(binary), "--weights", str(weights), *engine_args])
    args = ["engine", "--engine", spec, "--profile", "quick", "--decode-state", "--db", "none", "--only"]
    return certify_command([*args, "decode.*"], timeout=300)


@slow_certify
def test_certify_with_decode_state_passes_the_native_engine(native: tuple[Path, Path]) -> None:
    done = _certify(native)
    assert done.returncode == 0, done.output[-5000:]
    # grammar (greedy and sampled) and stop strings: the native engine declares neither (docs/protocol.md,
    # Decode state); prompt logprobs: the wire does not carry them; decode.session: one engine process across
    # the requests of a session
    assert "verdict: PASS (8 pass, 4 skip)" in done.output, done.output[-3000:]
    for check in ("grammar", "grammar-sampled", "prompt-logprobs", "stop-strings"):
        assert f"skip     specproof-native-decode.{check} " in done.output, done.output[-3000:]


@slow_certify
def test_certify_with_decode_state_rejects_the_planted_penalty_bug(native: tuple[Path, Path]) -> None:
    done = _certify(native, "--bug", "penalty-counts-rejected")
    assert done.returncode == 1, done.output[-5000:]
    # the black-box and the white-box check alike, and the sampled distribution with the same processors
    for check in ("penalties", "processor-state", "sampled"):
        assert re.search(rf"decode\.{check}\s*│\s*fail", done.output), done.output[-5000:]
