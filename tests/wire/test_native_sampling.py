"""The native C++ engine samples (capabilities ``sampling`` and ``seeded``; docs/protocol.md, Sampling):
one seed one output on both rollbacks and both schemes, different seeds different outputs,
``temperature=0`` equal to greedy, the first token distributed as the contract's ``p`` with the engine's
own drafts, a one-hot suite draft and a suite drafter's ``q`` rows, and the planted ``--bug
wrong-residual`` (a rejected draft token replaced by a draw from ``p``, not from the residual) caught by
both the structural rule and the distribution test.

The distribution test is Hoeffding's inequality with a union bound over the vocabulary: for ``n``
independent first tokens, ``P(max_t |count_t - n p_t| > sqrt(n ln(2V/delta) / 2)) <= delta`` at every
``n``, not only asymptotically, so a correct engine fails it with probability at most ``delta = 1e-6``
(and never here: the seeds are fixed, so each run is the same run).
"""

from __future__ import annotations

import math
import re
import shlex
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from _wire_helpers import Certified, certify_command, slow_certify
from specproof.contract.sampling import SampledDraft, SamplingParams, processed_distribution
from specproof.engine import greedy_decode
from specproof.plugins import load_target
from specproof.strategies import PlannedRound, RoundPlan, ScriptedDrafter
from specproof.wire import ExecEngine, WireEngine, drafter_generator

pytestmark = pytest.mark.slow  # seconds per test: outside `tox -e quick`, always in `tox`

PROMPT = list(b"The quick brown fox")
PARAMS = SamplingParams(temperature=1.0, top_p=0.95)
RUNS = 400
DELTA = 1e-6


@pytest.fixture(scope="module")
def start(native: tuple[Path, Path]) -> Callable[..., WireEngine]:
    binary, weights = native

    def make(*args: str, state: bool = True) -> ExecEngine:
        return ExecEngine(
            [str(binary), "--weights", str(weights), *args], timeout=30.0, state=state, load_target=load_target
        )

    return make


@pytest.fixture(scope="module", params=["checkpoint", "replay"])
def engine(request: pytest.FixtureRequest, start: Callable[..., WireEngine]) -> Iterator[WireEngine]:
    with start("--rollback", request.param) as e:
        yield e


def contract_p(prompt: Sequence[int], params: SamplingParams) -> np.ndarray:
    """The contract's ``p`` of the token after ``prompt`` (the numpy ``trained`` target's logits)."""
    target = load_target("trained")
    target.reset()
    return processed_distribution(target.forward(list(prompt))[-1], params)


def hoeffding_excess(counts: Counter[int], p: np.ndarray, n: int) -> tuple[float, int, float]:
    """``(largest |count - n p|, its token, the bound it must stay within)``: the bound is crossed by a
    correct sampler with probability at most ``DELTA`` (Hoeffding, union bound over the vocabulary)."""
    observed = np.zeros(len(p))
    for token, c in counts.items():
        observed[token] = c
    gaps = np.abs(observed - n * p)
    worst = int(np.argmax(gaps))
    return float(gaps[worst]), worst, math.sqrt(n * math.log(2 * len(p) / DELTA) / 2)


class FixedDrafter:
    """Always proposes ``token`` (deterministic: q one-hot)."""

    def __init__(self, token: int) -> None:
        self.token = token

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        return [self.token] * k


class MixDrafter(FixedDrafter):
    """A sampling drafter: every token drawn from the fixed distribution ``row``."""

    def __init__(self, row: np.ndarray) -> None:
        super().__init__(int(np.argmax(row)))
        self.row = row

    def propose_sampled(
        self, context: Sequence[int], k: int, *, sampling: SamplingParams, rng: np.random.Generator
    ) -> SampledDraft:
        tokens = [int(rng.choice(len(self.row), p=self.row)) for _ in range(k)]
        return SampledDraft(tokens, np.tile(self.row, (len(tokens), 1)))


def first_tokens(engine: WireEngine, params: SamplingParams, runs: int = RUNS) -> tuple[Counter[int], int, int]:
    """The first emitted token of ``runs`` seeded two-token generations (seeds 0..runs-1): each verifies
    at most one draft token (k_eff 1) from the engine's or the suite's drafter. Also: how many rounds
    replaced a rejected draft token with that same token (never, in a lossless rejection sampler with
    one-hot q), and how many first rounds verified a draft token."""
    counts: Counter[int] = Counter()
    same = drafted = 0
    for seed in range(runs):
        generation = engine.generate(PROMPT, 2, sampling=params.with_seed(seed))
        counts[generation.tokens[0]] += 1
        assert generation.steps, "a generation without round records"
        step = generation.steps[0]
        drafted += bool(step.draft)
        j = len(step.accepted) - 1
        if j < len(step.draft) and step.accepted[j] == step.draft[j]:
            same += 1
    return counts, same, drafted


# --------------------------------------------------------------------------- handshake, seeds, greedy


def test_the_handshake_declares_sampling_and_the_default_scheme_first(start: Callable[..., WireEngine]) -> None:
    with start() as e:
        assert {"sampling", "seeded"} <= e.capabilities and e.sampling_schemes == ("rejection", "match")
    with start("--scheme", "match") as e:
        assert e.sampling_schemes == ("match", "rejection") and e.scheme == "match"


@pytest.mark.parametrize("scheme", ["rejection", "match"])
def test_one_seed_one_output_and_different_seeds_differ(
    engine: WireEngine, start: Callable[..., WireEngine], scheme: str
) -> None:
    engine.scheme = scheme
    params = SamplingParams(temperature=1.0, top_k=50, seed=0)
    outputs = {}
    try:
        for seed in range(6):
            got = engine.generate(PROMPT, 24, sampling=params.with_seed(seed)).tokens
            assert engine.generate(PROMPT, 24, sampling=params.with_seed(seed)).tokens == got, f"seed {seed}"
            outputs[seed] = got
        engine.drafter = FixedDrafter(32)  # suite drafts: the same
        for seed in range(3):
            first = engine.generate(PROMPT, 24, sampling=params.with_seed(seed)).tokens
            assert engine.generate(PROMPT, 24, sampling=params.with_seed(seed)).tokens == first
    finally:
        engine.drafter = None
        engine.scheme = None
    assert len(set(outputs.values())) >= 5, outputs
    top = params.with_seed(2**63 - 1)  # the largest seed travels as a 64-bit integer
    assert engine.generate(PROMPT, 24, sampling=top).tokens == engine.generate(PROMPT, 24, sampling=top).tokens
    with start("--rollback", engine.rollback, "--scheme", scheme) as fresh:  # a new process: the same output
        assert fresh.generate(PROMPT, 24, sampling=params.with_seed(3)).tokens == outputs[3]


@pytest.mark.parametrize("scheme", ["rejection", "match"])
def test_temperature_zero_and_top_k_one_equal_greedy(engine: WireEngine, scheme: str) -> None:
    engine.scheme = scheme
    prompts = [PROMPT, list(b"def main():\n    "), list(b"for i in range(")]
    plan = RoundPlan((PlannedRound(1, 0), PlannedRound(3, 2), PlannedRound(4, 4), PlannedRound(2, 0)))
    try:
        for prompt in prompts:
            want = list(greedy_decode(load_target("trained"), prompt, 20).tokens)
            plain = engine.generate(prompt, 20)
            assert list(plain.tokens) == want
            for params in (SamplingParams(temperature=0.0, seed=1), SamplingParams(temperature=0.9, top_k=1)):
                sampled = engine.generate(prompt, 20, sampling=params)
                assert list(sampled.tokens) == want and sampled.steps == plain.steps, params
                # suite drafts, rejected and accepted
                engine.drafter = ScriptedDrafter(prompt, want, plan, vocab_size=256)
                scripted = engine.generate(prompt, 20, sampling=params)
                engine.drafter = None
                assert list(scripted.tokens) == want, params
    finally:
        engine.drafter = None
        engine.scheme = None


# --------------------------------------------------------------------------- the distribution


@pytest.fixture(scope="module")
def fast(start: Callable[..., WireEngine]) -> Iterator[WireEngine]:
    with start(state=False) as e:  # no state messages: 400 generations in a second or two
        yield e


@pytest.mark.parametrize("drafts", ["engine (no draft)", "one-hot suite draft", "suite q rows"])
@pytest.mark.parametrize("scheme", ["rejection", "match"])
def test_the_first_token_is_distributed_as_the_contracts_p(fast: WireEngine, scheme: str, drafts: str) -> None:
    p = contract_p(PROMPT, PARAMS)
    x = int(np.argmax(p * (1 - p)))
    assert 0.3 < p[x] < 0.7, "the prompt no longer has a draft token of middling probability"
    row = np.zeros(len(p))
    row[[x, int(np.argsort(p)[-2]), 0]] = [0.6, 0.3, 0.1]  # token 0 has p = 0: always rejected
    drafter = {"engine (no draft)": None, "one-hot suite draft": FixedDrafter(x), "suite q rows": MixDrafter(row)}[
        drafts
    ]
    fast.scheme, fast.drafter = scheme, drafter
    try:
        counts, same, drafted = first_tokens(fast, PARAMS)
    finally:
        fast.scheme, fast.drafter = None, None
    # the engine's n-gram finds no match in PROMPT: its case is p itself (the bonus path); the suite's
    # drafts go through the acceptance rule every time
    assert drafted == (0 if drafter is None else RUNS)
    assert all(p[t] > 0 for t in counts), f"emitted tokens of p = 0: {[t for t in counts if p[t] == 0]}"
    gap, token, bound = hoeffding_excess(counts, p, RUNS)
    assert gap <= bound, f"token {token}: {counts[token]} of {RUNS}, expected {RUNS * p[token]:.1f} (bound {bound:.1f})"
    if scheme == "rejection" and drafts == "one-hot suite draft":
        assert same == 0  # the residual max(0, p - q) has no mass on the one-hot draft token
        assert counts[x] < RUNS  # rejections happened (the residual path ran)


def test_the_planted_wrong_residual_is_caught(start: Callable[..., WireEngine]) -> None:
    p = contract_p(PROMPT, PARAMS)
    x = int(np.argmax(p * (1 - p)))
    with start("--bug", "wrong-residual", state=False) as planted:
        assert "wrong-residual" in planted.hello.get("notes", "")
        planted.drafter = FixedDrafter(x)
        counts, same, _ = first_tokens(planted, PARAMS)
    # structural: a rejected draft token replaced by itself (the residual has no mass there)
    assert same >= 1
    # distributional: x is emitted with probability p + (1 - p) p, far past the bound
    gap, token, bound = hoeffding_excess(counts, p, RUNS)
    assert gap > bound and token == x, (gap, token, bound, counts[x], RUNS * p[x])


def test_the_suite_drafters_draws_come_from_the_request_seed(fast: WireEngine) -> None:
    row = np.zeros(fast.vocab_size)
    row[[32, 101, 116]] = [0.5, 0.25, 0.25]
    fast.drafter = MixDrafter(row)
    try:
        generation = fast.generate(PROMPT, 12, sampling=PARAMS.with_seed(9))
    finally:
        fast.drafter = None
    rng = drafter_generator(PARAMS.with_seed(9))
    assert generation.steps
    for step in generation.steps:
        assert list(step.draft) == [int(rng.choice(len(row), p=row)) for _ in step.draft]


def test_bad_sampling_requests_are_refused_and_the_engine_stays_usable(fast: WireEngine) -> None:
    from specproof.wire import EngineRequestError

    for bad, problem in (
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": 1.0, "top_p": 0.0}, "top_p"),
        ({"temperature": 1.0, "seed": -4}, "seed"),
        ({"temperature": 1.0, "colour": 1}, "unknown field"),
    ):
        rid = fast._channel.new_id()
        fast._channel.send(
            {"type": "generate", "id": rid, "prompt": PROMPT, "max_new_tokens": 2, "sampling": bad}, "test"
        )
        answer = fast._channel.receive(("error", "final"), "test")
        assert answer["type"] == "error" and problem in answer["message"], answer
    with pytest.raises(EngineRequestError, match="q\\[0\\] does not sum to 1"):
        fast.drafter = MixDrafter(np.full(fast.vocab_size, 1 / fast.vocab_size))
        original = fast._bridge.answer

        def corrupt(msg, drafter, ctx, rid, request):  # type: ignore[no-untyped-def]
            inner = fast._channel.send

            def send(message, request):  # type: ignore[no-untyped-def]
                if message.get("q"):
                    message["q"][0] = message["q"][0][:-1]  # one pair short: the row sums below 1
                inner(message, request)

            fast._channel.send = send  # type: ignore[method-assign]
            try:
                return original(msg, drafter, ctx, rid, request)
            finally:
                fast._channel.send = inner  # type: ignore[method-assign]

        fast._bridge.answer = corrupt  # type: ignore[method-assign]
        try:
            fast.generate(PROMPT, 4, sampling=PARAMS.with_seed(1))
        finally:
            fast._bridge.answer = original  # type: ignore[method-assign]
            fast.drafter = None
    assert len(fast.generate(PROMPT, 4, sampling=PARAMS.with_seed(1)).tokens) == 4


# ----------------------------------------------------------------------------- certified with --sampling

SAMPLED_CHECKS = "engine.sampled*,engine.seeds,engine.greedy-limit"


def _certify_sampled(native: tuple[Path, Path], *engine_args: str) -> Certified:
    binary, weights = native
    spec = "exec:" + shlex.join([str(binary), "--weights", str(weights), *engine_args])
    return certify_command(
        [
            "engine",
            "--engine",
            spec,
            "--profile",
            "quick",
            "--sampling",
            "temperature=0.8,top_p=0.95",
            "--only",
            SAMPLED_CHECKS,
            "--db",
            "none",
        ],
        timeout=300,
    )


@slow_certify
@pytest.mark.parametrize("scheme", ["rejection", "match"])
def test_certify_with_sampling_passes_the_native_engine(native: tuple[Path, Path], scheme: str) -> None:
    done = _certify_sampled(native, "--scheme", scheme)
    assert done.returncode == 0, done.output[-5000:]
    assert "verdict: PASS (5 pass)" in done.output, done.output[-3000:]


@slow_certify
def test_certify_with_sampling_rejects_the_planted_wrong_residual(native: tuple[Path, Path]) -> None:
    done = _certify_sampled(native, "--bug", "wrong-residual")
    assert done.returncode == 1, done.output[-5000:]
    assert re.search(r"engine\.sampled-support\s*│\s*fail", done.output), done.output[-5000:]
    assert "--sampling temperature=0.8,top_p=0.95" in done.output  # the reproduce line carries it
