"""Sampling drafters (issue 28): the draft model, the feature heads and the combined drafter draw their
proposals from the distribution ``q`` they return.

Judged against an independent statement of ``q``: the contract's ``processed_distribution`` of the
draft model's (or head's) logits, computed here from a fresh model, never by the drafter's code. The
frequency checks are chi-square tests (scipy) at ``ALPHA`` with fixed seeds, so they are deterministic;
each comes with a meta-test: a drafter that samples from one distribution and declares another (the
transformers #47932 shape) is rejected, one that samples the same distribution differently is accepted.
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specproof.contract import SampledDraft, SamplingParams, processed_distribution
from specproof.contract.errors import InvalidSettingError
from specproof.engine import NgramDrafter, ReferenceConfig, ReferenceHybrid, SpecDecoder, greedy_decode
from specproof.engine.drafters import CombinedDrafter, ModelDrafter

# the frequency checks: skipped (with the reason) where scipy is missing; tox's test envs install it
needs_scipy = pytest.mark.skipif(
    importlib.util.find_spec("scipy") is None, reason="the frequency (chi-square) checks need scipy"
)
ALPHA = 1e-6  # a correct drafter fails a check with probability at most about this (fixed seeds: never, in fact)
SAMPLES = 1500
VOCAB = 256


def small_model(seed: int = 3, max_context: int = 96) -> ReferenceHybrid:
    cfg = ReferenceConfig(
        vocab_size=VOCAB,
        d_model=16,
        n_heads=2,
        n_kv_heads=1,
        head_dim=8,
        ffn_dim=32,
        layers=("conv", "attn", "gdn"),
        max_context=max_context,
        seed=seed,
    )
    return ReferenceHybrid(cfg)


# a top-k or a nucleus gives each distribution a support of a few tokens, which a chi-square test covers
# with a few thousand draws (temperature 1 keeps all 256 tokens: checked row by row, not by frequency)
SHARP = SamplingParams(temperature=0.8, top_k=6)
NUCLEUS = SamplingParams(temperature=0.8, top_p=0.9, min_p=0.05)
CTX = list(b"def f(x):\n    return x + 1\n")


def rows_of(
    model: ReferenceHybrid, context: Sequence[int], tokens: Sequence[int], params: SamplingParams
) -> np.ndarray:
    """The contract's ``p`` of ``model`` after ``context`` and after each of ``tokens[:-1]``: the rows a draft
    of ``tokens`` from ``model`` must declare (one fresh forward, independent of ``ModelDrafter``)."""
    model.reset()
    logits = np.asarray(model.forward([*context, *tokens[:-1]]))
    return processed_distribution(logits[len(context) - 1 :], params)


def chisquare_pvalue(samples: Sequence[int], probs: np.ndarray, *, min_expected: float = 5.0) -> float:
    """Pearson's chi-square of ``samples`` against ``probs``: the bins expecting fewer than ``min_expected``
    draws pooled; a sample of probability 0 is a p-value of 0."""
    from scipy import stats

    counts = np.bincount(np.asarray(samples, dtype=np.int64), minlength=len(probs)).astype(float)
    if counts[probs <= 0].sum() > 0:
        return 0.0
    expected = len(samples) * np.asarray(probs, dtype=float)
    big = expected >= min_expected
    obs, exp = list(counts[big]), list(expected[big])
    if (~big).any() and expected[~big].sum() > 0:
        obs.append(counts[~big].sum())
        exp.append(expected[~big].sum())
    if len(obs) < 2:
        return 1.0 if obs[0] == len(samples) else 0.0
    return float(stats.chisquare(obs, exp).pvalue)


def generator(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


# --------------------------------------------------------------------------- q is what the drafter drew from


@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
@pytest.mark.parametrize("params", [SHARP, NUCLEUS, SamplingParams(temperature=1.0)], ids=["top_k", "top_p", "T1"])
def test_q_rows_are_the_draft_models_processed_distribution(rollback: str, params: SamplingParams) -> None:
    drafter = ModelDrafter(small_model(), rollback=rollback)
    for seed in range(6):  # one drafter along several proposals: the catch-up after sampled drafts too
        got = drafter.propose_sampled(CTX, 5, sampling=params, rng=generator(seed))
        assert isinstance(got, SampledDraft) and len(got.tokens) == 5 and got.q.shape == (5, VOCAB)
        want = rows_of(small_model(), CTX, got.tokens, params)
        np.testing.assert_allclose(got.q, want, rtol=0, atol=1e-12)
        assert all(got.q[i, t] > 0 for i, t in enumerate(got.tokens))  # never a token of probability 0


@needs_scipy
def test_the_first_token_is_distributed_as_its_q_and_a_raw_logits_q_is_rejected() -> None:
    drafter = ModelDrafter(small_model())
    q0 = rows_of(small_model(), CTX, [0], SHARP)[0]
    firsts = [drafter.propose_sampled(CTX, 1, sampling=SHARP, rng=generator(s)).tokens[0] for s in range(SAMPLES)]
    assert chisquare_pvalue(firsts, q0) > ALPHA
    assert len(set(firsts)) > 2  # it sampled, not a constant
    # meta: the #47932 shape (samples from the processed row, declares the raw softmax) is caught
    raw = processed_distribution(np.asarray(small_model().forward(CTX))[-1], SamplingParams(temperature=1.0))
    assert chisquare_pvalue(firsts, raw) < ALPHA


class _GumbelModelDrafter(ModelDrafter):
    """Correct, differently: draws each token by the Gumbel-max trick (other tokens for one seed, same law)."""

    def propose_sampled(self, context, k, *, sampling, rng):  # type: ignore[no-untyped-def,override]
        from specproof.engine.drafters._pick import sampled_draft

        def pick(row: np.ndarray) -> tuple[int, np.ndarray]:
            q = processed_distribution(row, sampling)
            with np.errstate(divide="ignore"):
                return int(np.argmax(np.log(q) + rng.gumbel(size=q.shape))), q

        return sampled_draft(self._draft(context, k, pick), self.vocab_size)


class _TemperatureOneDrafter(ModelDrafter):
    """Broken: draws at the request's parameters but declares q at temperature 1 (q of the wrong row)."""

    def propose_sampled(self, context, k, *, sampling, rng):  # type: ignore[no-untyped-def,override]
        got = super().propose_sampled(context, k, sampling=sampling, rng=rng)
        rows = rows_of(small_model(), context, got.tokens, SamplingParams(temperature=1.0))
        return SampledDraft(got.tokens, rows)


def _pairs_pvalue(drafter: ModelDrafter, params: SamplingParams) -> float:
    """Chi-square of seeded two-token proposals against the law their declared ``q`` rows give (each
    proposal's rows fix ``q0`` and ``q1`` given its first token): the whole draft, not just its first token."""
    seen: dict[int, np.ndarray] = {}
    q0: np.ndarray | None = None
    codes = []
    for s in range(SAMPLES):
        got = drafter.propose_sampled(CTX, 2, sampling=params, rng=generator(10_000 + s))
        q0 = got.q[0] if q0 is None else q0
        seen.setdefault(got.tokens[0], got.q[1])
        codes.append(got.tokens[0] * VOCAB + got.tokens[1])
    assert q0 is not None
    law = np.zeros(VOCAB * VOCAB)
    for x in np.flatnonzero(q0):  # every first token the declared q0 allows: its q1 from a fresh model
        q1 = seen.get(int(x))
        if q1 is None:
            q1 = rows_of(small_model(), CTX, [int(x), 0], params)[1]
        law[int(x) * VOCAB : (int(x) + 1) * VOCAB] = q0[x] * q1
    return chisquare_pvalue(codes, law)


@needs_scipy
@pytest.mark.slow
def test_two_token_drafts_follow_their_declared_q_meta_wrong_row_rejected_gumbel_accepted() -> None:
    assert _pairs_pvalue(ModelDrafter(small_model()), SHARP) > ALPHA
    assert _pairs_pvalue(_GumbelModelDrafter(small_model()), SHARP) > ALPHA  # correct, different draws
    assert _pairs_pvalue(_TemperatureOneDrafter(small_model()), SHARP) < ALPHA  # declares the wrong rows


def test_same_generator_state_same_proposal_and_the_generator_advances() -> None:
    a = ModelDrafter(small_model()).propose_sampled(CTX, 4, sampling=NUCLEUS, rng=generator(7))
    b = ModelDrafter(small_model()).propose_sampled(CTX, 4, sampling=NUCLEUS, rng=generator(7))
    assert a.tokens == b.tokens and np.array_equal(a.q, b.q)
    rng = generator(7)
    drafter = ModelDrafter(small_model())
    draws = {drafter.propose_sampled(CTX, 4, sampling=NUCLEUS, rng=rng).tokens for _ in range(20)}
    assert len(draws) > 1  # one generator over many proposals: not one repeated stream


@settings(max_examples=20)
@given(
    ctx=st.lists(st.integers(0, 255), min_size=1, max_size=40),
    steps=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 3), st.integers(0, 5)), min_size=1, max_size=8),
    rollback=st.sampled_from(["checkpoint", "replay"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_along_a_sampled_decoding_each_draft_equals_a_fresh_drafters(ctx, steps, rollback, seed) -> None:
    """Accept j of a *sampled* draft, add a bonus token and maybe a user turn: a fresh drafter with the generator
    in the same state proposes the same tokens and the same q rows, bit for bit (drafter.deterministic)."""
    params = SamplingParams(temperature=0.9, top_k=8)
    drafter = ModelDrafter(small_model(), rollback=rollback)
    rng = generator(seed)
    ctx = list(ctx)
    for j, extra, k in steps:
        twin = copy.deepcopy(rng)
        got = drafter.propose_sampled(ctx, k, sampling=params, rng=rng)
        fresh = ModelDrafter(small_model()).propose_sampled(ctx, k, sampling=params, rng=twin)
        assert got.tokens == fresh.tokens and np.array_equal(got.q, fresh.q), (ctx, k)
        assert rng.bit_generator.state == twin.bit_generator.state  # one uniform per token, both
        ctx = ctx + list(got.tokens[:j]) + [(ctx[-1] * 7 + 1) % 256] + [(i * 13) % 256 for i in range(extra)]
        ctx = ctx[:90]


def test_propose_stays_greedy_and_temperature_zero_samples_the_argmax() -> None:
    greedy = ModelDrafter(small_model()).propose(CTX, 4)
    zero = ModelDrafter(small_model()).propose_sampled(CTX, 4, sampling=SamplingParams(temperature=0), rng=generator(0))
    assert list(zero.tokens) == greedy
    assert np.array_equal(zero.q, np.eye(VOCAB)[greedy])


def test_empty_drafts_and_bad_sampling_arguments() -> None:
    drafter = ModelDrafter(small_model(max_context=40))
    for context, k in ((CTX, 0), ([], 3), (list(range(41)), 3)):
        got = drafter.propose_sampled(context, k, sampling=SHARP, rng=generator(0))
        assert got.tokens == () and got.q.shape == (0, VOCAB)
    with pytest.raises(InvalidSettingError, match="SamplingParams"):
        drafter.propose_sampled(CTX, 2, sampling={"temperature": 1.0}, rng=generator(0))  # type: ignore[arg-type]
    with pytest.raises(InvalidSettingError, match="Generator"):
        drafter.propose_sampled(CTX, 2, sampling=SHARP, rng=0)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- combined


def test_combined_lookup_tokens_are_one_hot_and_the_models_are_sampled() -> None:
    ctx = list(b"abcdefgh abcdefgh abcdefgh abcde")  # the lookup matches: 'fgh a...' follows
    lookup = NgramDrafter(min_n=3, max_n=4, extend=False)
    looked = lookup.propose(ctx, 12)
    assert 0 < len(looked) < 12  # the match ends at the context's end: the model completes it
    combined = CombinedDrafter(ModelDrafter(small_model()))
    got = combined.propose_sampled(ctx, 12, sampling=SHARP, rng=generator(3))
    assert len(got.tokens) == 12
    n = len(looked)
    assert list(got.tokens[:n]) == looked and np.array_equal(got.q[:n], np.eye(VOCAB)[looked])
    want = rows_of(small_model(), [*ctx, *looked], got.tokens[n:], SHARP)
    np.testing.assert_allclose(got.q[n:], want, rtol=0, atol=1e-12)
    assert combined.completed_drafts == 1
    # no match at all: the model's sampled draft as is; a full match: the lookup only
    nomatch = combined.propose_sampled(CTX[:5], 3, sampling=SHARP, rng=generator(4))
    twin = ModelDrafter(small_model()).propose_sampled(CTX[:5], 3, sampling=SHARP, rng=generator(4))
    assert nomatch.tokens == twin.tokens and np.array_equal(nomatch.q, twin.q)
    full = combined.propose_sampled(ctx, 2, sampling=SHARP, rng=generator(5))
    assert list(full.tokens) == looked[:2] and np.array_equal(full.q, np.eye(VOCAB)[looked[:2]])


# --------------------------------------------------------------------------- the decoder samples with them


TARGET_SEED = 3


class Perturbed:
    """The target's model with a fixed bias on its logits: a draft model whose q overlaps the target's p
    without equalling it (an unrelated random model's top tokens miss the target's: every draft rejected)."""

    def __init__(self, inner: ReferenceHybrid, *, scale: float = 1.5, seed: int = 11) -> None:
        self.inner = inner
        self.vocab_size, self.max_context = inner.vocab_size, inner.max_context
        self.bias = (np.random.default_rng(seed).standard_normal(inner.vocab_size) * scale).astype(np.float32)

    @property
    def processed(self) -> int:
        return self.inner.processed

    def forward(self, tokens: Sequence[int]) -> np.ndarray:
        return np.asarray(self.inner.forward(tokens)) + self.bias

    def forward_with_checkpoints(self, tokens: Sequence[int]) -> tuple[np.ndarray, list[object]]:
        logits, checkpoints = self.inner.forward_with_checkpoints(tokens)
        return np.asarray(logits) + self.bias, checkpoints

    def snapshot(self) -> object:
        return self.inner.snapshot()

    def restore(self, snapshot: object) -> None:
        self.inner.restore(snapshot)

    def reset(self) -> None:
        self.inner.reset()


def draft_model() -> ModelDrafter:
    return ModelDrafter(Perturbed(small_model(TARGET_SEED)))  # type: ignore[arg-type]


def _first_two_law(params: SamplingParams, prompt: Sequence[int]) -> np.ndarray:
    """The law of plain sampling's first two tokens from the target (the contract's p, fresh forwards)."""
    p0 = rows_of(small_model(TARGET_SEED), prompt, [0], params)[0]
    law = np.zeros(VOCAB * VOCAB)
    for x in np.flatnonzero(p0):
        law[int(x) * VOCAB : (int(x) + 1) * VOCAB] = (
            p0[x] * rows_of(small_model(TARGET_SEED), prompt, [int(x), 0], params)[1]
        )
    return law


def _emitted_pairs(drafter: object, scheme: str, rollback: str, params: SamplingParams) -> tuple[list[int], int, int]:
    decoder = SpecDecoder(small_model(TARGET_SEED), drafter, k=2, rollback=rollback, scheme=scheme)  # type: ignore[arg-type]
    codes, partial, full = [], 0, 0
    for s in range(SAMPLES):
        gen = decoder.generate(CTX, 3, sampling=params.with_seed(s))
        codes.append(gen.tokens[0] * VOCAB + gen.tokens[1])
        step = gen.steps[0]
        full += len(step.accepted) > len(step.draft)
        partial += 0 < len(step.accepted) - 1 < len(step.draft)
    return codes, partial, full


@needs_scipy
@pytest.mark.slow  # seconds: SAMPLES generations each
@pytest.mark.parametrize(
    ("scheme", "rollback"), [("rejection", "checkpoint"), ("rejection", "replay"), ("match", "checkpoint")]
)
def test_decoding_with_the_sampling_draft_model_emits_plain_samplings_law(scheme: str, rollback: str) -> None:
    law = _first_two_law(SHARP, CTX)
    codes, partial, full = _emitted_pairs(draft_model(), scheme, rollback, SHARP)
    assert partial > 20 and full > 20  # both kinds of round ran: rejections and full accepts
    assert chisquare_pvalue(codes, law) > ALPHA


@needs_scipy
@pytest.mark.slow
def test_meta_the_decoder_with_a_drafter_declaring_the_wrong_q_is_caught() -> None:
    """Rejection sampling is lossless only with the q the draft was drawn from: a wrong q shows in the output."""
    law = _first_two_law(SHARP, CTX)

    class WrongQ(ModelDrafter):  # a subclass of ModelDrafter over the same perturbed model
        def propose_sampled(self, context, k, *, sampling, rng):  # type: ignore[no-untyped-def,override]
            got = super().propose_sampled(context, k, sampling=sampling, rng=rng)
            flat = np.full_like(got.q, 1.0 / got.q.shape[1])  # claims it drew uniformly
            return SampledDraft(got.tokens, flat)

    model = Perturbed(small_model(TARGET_SEED))
    codes, _, _ = _emitted_pairs(WrongQ(model), "rejection", "checkpoint", SHARP)  # type: ignore[arg-type]
    assert chisquare_pvalue(codes, law) < ALPHA
    # correct, differently: Gumbel-max draws from the same q (other tokens for each seed) keep the law
    codes, _, _ = _emitted_pairs(_GumbelModelDrafter(model), "rejection", "checkpoint", SHARP)  # type: ignore[arg-type]
    assert chisquare_pvalue(codes, law) > ALPHA


@pytest.mark.parametrize("scheme", ["rejection", "match"])
@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
def test_sampled_generation_is_seeded_and_temperature_zero_is_greedy(scheme: str, rollback: str) -> None:
    def run(params: SamplingParams) -> list[int]:
        drafter = CombinedDrafter(draft_model())
        decoder = SpecDecoder(small_model(TARGET_SEED), drafter, k=3, rollback=rollback, scheme=scheme)
        return list(decoder.generate(CTX, 24, sampling=params).tokens)

    params = SamplingParams(temperature=0.8, top_p=0.95, seed=5)
    assert run(params) == run(params)
    assert run(params) != run(params.with_seed(6))
    greedy = list(greedy_decode(small_model(TARGET_SEED), CTX, 24).tokens)
    assert run(SamplingParams(temperature=0.0, seed=1)) == greedy
    assert run(SamplingParams(temperature=0.7, top_k=1, seed=2)) == greedy


# --------------------------------------------------------------------------- the feature heads


HEAD_CTX = list(b'import os\n\n\ndef main():\n    """Run the thing."""\n    for x in range(10):\n        print(x)\n')
HEAD_PARAMS = SamplingParams(temperature=0.8, top_p=0.95)


def head_rows(kind: str, context: Sequence[int], tokens: Sequence[int], params: SamplingParams) -> np.ndarray:
    """The contract's p of the head's logits at the last real position and along the chain of ``tokens``:
    the target's features in one forward and a fresh head cache fed in one batch (no ``HeadDrafter`` code)."""
    from specproof.fixtures import load_trained_target
    from specproof.fixtures._feature_heads import load_feature_head

    head = load_feature_head(kind)
    target = load_trained_target()
    target.reset()
    _, feats, _ = target.forward_with_features(list(context[:-1]), head.feature_layers)
    cache = head.new_cache()
    m = len(context)
    last = head.step(cache, 0, [int(t) for t in context[1:m]], head.fuse(feats, 0, m - 1))[-1]
    rows = [head.logits(last)[0]]
    for i, tok in enumerate(tokens[:-1]):
        last = head.step(cache, m - 1 + i, [int(tok)], last[None, :])[0]
        rows.append(head.logits(last)[0])
    return processed_distribution(np.stack(rows), params)


def target_features(context: Sequence[int], layers: Sequence[int]) -> dict[int, np.ndarray]:
    from specproof.fixtures import load_trained_target

    target = load_trained_target()
    target.reset()
    _, feats, _ = target.forward_with_features(list(context[:-1]), layers)
    return {layer: np.asarray(feats[layer]) for layer in layers}


@pytest.mark.parametrize("spec", ["eagle:trained", "mtp:trained", "eagle:trained,replay"])
def test_head_q_rows_are_the_heads_processed_distribution_with_and_without_features(spec: str) -> None:
    from specproof.plugins import load_drafter

    kind = spec.partition(":")[0]
    drafter = load_drafter(spec)
    feats = target_features(HEAD_CTX, drafter.feature_layers)  # type: ignore[attr-defined]
    for seed in range(4):
        for given_features in (None, feats):
            got = drafter.propose_sampled(  # type: ignore[attr-defined]
                HEAD_CTX, 4, sampling=HEAD_PARAMS, rng=generator(seed), features=given_features
            )
            assert len(got.tokens) == 4 and got.q.shape == (4, VOCAB)
            np.testing.assert_allclose(got.q, head_rows(kind, HEAD_CTX, got.tokens, HEAD_PARAMS), rtol=0, atol=1e-12)
            assert all(got.q[i, t] > 0 for i, t in enumerate(got.tokens))


@needs_scipy
@pytest.mark.parametrize("kind", ["eagle", "mtp"])
def test_head_first_tokens_follow_their_q(kind: str) -> None:
    from specproof.plugins import load_drafter

    drafter = load_drafter(f"{kind}:trained")
    q0 = head_rows(kind, HEAD_CTX, [0], HEAD_PARAMS)[0]
    firsts = [
        drafter.propose_sampled(HEAD_CTX, 1, sampling=HEAD_PARAMS, rng=generator(s)).tokens[0]  # type: ignore[attr-defined]
        for s in range(SAMPLES)
    ]
    assert len(set(firsts)) > 1 and chisquare_pvalue(firsts, q0) > ALPHA
    raw = head_rows(kind, HEAD_CTX, [0], SamplingParams(temperature=1.0))[0]
    assert chisquare_pvalue(firsts, raw) < ALPHA  # meta: declaring the raw softmax (#47932's shape) is caught


@pytest.mark.parametrize("kind", ["eagle", "mtp"])
def test_along_a_sampled_decoding_a_fresh_head_with_the_same_generator_agrees(kind: str) -> None:
    """Accept some of a sampled draft, add a bonus token: a fresh head proposes the same, bit for bit."""
    from specproof.plugins import load_drafter

    drafter = load_drafter(f"{kind}:trained")
    rng, ctx = generator(99), list(HEAD_CTX)
    for j in (2, 0, 4, 1):
        twin = copy.deepcopy(rng)
        got = drafter.propose_sampled(ctx, 4, sampling=HEAD_PARAMS, rng=rng)  # type: ignore[attr-defined]
        fresh = load_drafter(f"{kind}:trained").propose_sampled(ctx, 4, sampling=HEAD_PARAMS, rng=twin)  # type: ignore[attr-defined]
        assert got.tokens == fresh.tokens and np.array_equal(got.q, fresh.q)
        ctx = ctx + list(got.tokens[:j]) + [ord("\n")]


@pytest.mark.parametrize("scheme", ["rejection", "match"])
@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
@pytest.mark.parametrize("spec", ["eagle:trained", "mtp:trained"])
def test_spec_decoder_samples_with_the_heads(spec: str, scheme: str, rollback: str) -> None:
    from specproof.fixtures import load_trained_target
    from specproof.plugins import load_drafter

    def run(params: SamplingParams) -> object:
        decoder = SpecDecoder(load_trained_target(), load_drafter(spec), k=4, rollback=rollback, scheme=scheme)
        return decoder.generate(HEAD_CTX, 40, sampling=params)

    params = HEAD_PARAMS.with_seed(3)
    gen = run(params)
    assert gen.tokens == run(params).tokens and gen.tokens != run(params.with_seed(4)).tokens  # type: ignore[attr-defined]
    assert gen.stats.accepted > 0 and gen.stats.rounds < 40  # type: ignore[attr-defined]  # the head's drafts are kept
    greedy = greedy_decode(load_trained_target(), HEAD_CTX, 40).tokens
    assert run(SamplingParams(temperature=0.0, seed=1)).tokens == greedy  # type: ignore[attr-defined]
