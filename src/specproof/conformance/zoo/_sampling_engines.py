"""The sampling zoo: a correct sampled speculative engine and the sampling bugs engines shipped.

``SamplingZooEngine`` is ``ZooEngine`` (the greedy control) plus ``generate(..., sampling=)``:
rejection sampling against the draft's ``q`` (one-hot for the suite's deterministic drafts and the
oracle drafter; declared by its own ``DraftSampler``) or sample-and-match, with a generator per
request. Every step that a shipped bug got wrong is a hook; each member overrides one. Greedy
calls (``sampling=None``) take ``ZooEngine``'s path unchanged, so the members pass the greedy
contract and are caught only by the sampling invariants (docs/contract.md, "Sampling").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from specproof.conformance.zoo._engines import OracleDrafter, ZooEngine, _Tally
from specproof.conformance.zoo._model_drafters import DRAFT_MODEL
from specproof.conformance.zoo._targets import small_reference
from specproof.contract import Generation, Step, Target
from specproof.contract.sampling import SampledDraft, SamplingParams
from specproof.engine import greedy_decode
from specproof.engine.sampling import target_distribution
from specproof.plugins import load_target

__all__ = [
    "ArgmaxVerification",
    "BonusFromWrongRow",
    "BroadcastSeed",
    "DraftSampler",
    "GreedyLimitSamples",
    "QFromRawLogits",
    "QOfNextPosition",
    "ResidualFromP",
    "SampledCountsReplacement",
    "UnseededDrafterRng",
    "BonusAfterAcceptedEos",
    "MatchesArgmaxAtLastPosition",
    "DrafterIgnoresRng",
    "SamplesPaddedVocab",
    "SamplingZooEngine",
    "SharedRngStream",
    "UnfilteredSampling",
    "UnnormalizedResidual",
]


class DraftSampler:
    """A sampling drafter over a small draft model: each token drawn from the model's processed
    distribution at the request's parameters, ``q`` the rows it drew from (a ``SamplingDrafter``)."""

    def __init__(self, model: Target | None = None) -> None:
        # default: the zoo's draft model of the reference target (as a drafter plug-in, it drafts for it)
        self.model = load_target(DRAFT_MODEL) if model is None else model
        self.vocab_size = self.model.vocab_size
        self.name = "specproof.zoo.DraftSampler"

    def _rows(self, row: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
        """(the row tokens are drawn from, the row declared as q); the same here."""
        p = target_distribution(row, params)
        return p, p

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        return list(self.propose_sampled(context, k, sampling=SamplingParams(temperature=0.0), rng=None).tokens)

    def propose_sampled(
        self, context: Sequence[int], k: int, *, sampling: SamplingParams, rng: np.random.Generator | None
    ) -> SampledDraft:
        model = self.model
        if k <= 0 or not context or len(context) + k > model.max_context:
            return SampledDraft((), np.zeros((0, self.vocab_size)))
        model.reset()
        row = np.asarray(model.forward(list(context)))[-1]
        tokens: list[int] = []
        declared: list[np.ndarray] = []
        for _ in range(k):
            drawn, q = self._rows(row, sampling)
            token = int(np.argmax(drawn)) if rng is None else _draw(drawn, rng)
            tokens.append(token)
            declared.append(q)
            row = np.asarray(model.forward([token]))[-1]
        return SampledDraft(tokens, np.stack(declared))


def _draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Inverse CDF on one uniform in [0, 1): right only for a normalized ``probs``."""
    token = int(np.searchsorted(np.cumsum(probs), rng.random(), side="right"))
    return min(token, len(probs) - 1)


@attrs.define
class _Request:
    params: SamplingParams
    rng: np.random.Generator


class SamplingZooEngine(ZooEngine):
    """A correct sampled speculative engine (the sampling members' control); see the module docstring.

    ``SamplingZooEngine(*, k=4, rollback="checkpoint", scheme="rejection", own_sampler=False)``; with
    ``own_sampler`` it drafts with its own ``DraftSampler`` (declared ``q``) and takes no suite drafts.
    """

    seeded = True

    def __init__(
        self, *, k: int = 4, rollback: str = "checkpoint", scheme: str = "rejection", own_sampler: bool = False
    ) -> None:
        super().__init__(k=k, rollback=rollback)
        self.scheme = scheme
        self.sampling_scheme = scheme  # declared: the suite's sampled drafts are judged by its rule
        self._request: _Request | None = None
        self._sampler = DraftSampler(small_reference(seed=7)) if own_sampler else None
        if own_sampler:
            del self.drafter  # drafts for itself: no settable drafter (judged on its own drafts)
        self.name = f"specproof.zoo.{type(self).__name__}(k={k}, rollback={rollback}, scheme={scheme})"

    # ------------------------------------------------------------------ the sampling hooks (correct here)

    def _params(self, sampling: SamplingParams) -> SamplingParams:
        return sampling

    def _rng(self, sampling: SamplingParams) -> np.random.Generator:
        return np.random.default_rng(sampling.seed)

    def _drafter_rng(self, request: _Request) -> np.random.Generator:
        """The generator a sampling drafter draws with: the request's."""
        return request.rng

    def _p(self, row: np.ndarray, params: SamplingParams) -> np.ndarray:
        """p as the rule draws from it (residuals, the bonus, match's samples)."""
        return target_distribution(row, params)

    def _p_accept(self, row: np.ndarray, params: SamplingParams) -> np.ndarray:
        """p as the acceptance test reads it."""
        return target_distribution(row, params)

    def _draw_from(self, p_row: np.ndarray, row: np.ndarray, params: SamplingParams) -> np.ndarray:
        """The distribution the bonus is drawn from."""
        return p_row

    def _keeps(self, x: int, p_row: np.ndarray, q_row: np.ndarray, u: float) -> bool:
        return u * q_row[x] < p_row[x]

    def _residual(self, p_row: np.ndarray, q_row: np.ndarray) -> np.ndarray:
        residual = np.maximum(p_row - q_row, 0.0)
        return residual / residual.sum() if residual.sum() > 0 else p_row

    def _q_row(self, q: np.ndarray, i: int) -> np.ndarray:
        return q[i]

    def _bonus_row(self, p: np.ndarray, drafted: int) -> np.ndarray:
        return p[drafted]

    def _count(self, tally: _Tally, draft: list[int], accepted: list[int]) -> None:
        tally.count(draft, accepted)

    def _match_sample(self, i: int, drafted: int, p_row: np.ndarray, rng: np.random.Generator) -> int:
        """Sample-and-match: the target's own sample at draft position ``i`` (of ``drafted``)."""
        return _draw(p_row, rng)

    # ------------------------------------------------------------------ generation

    def generate(  # type: ignore[override]
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        *,
        eos_token_id: int | None = None,
        sampling: SamplingParams | None = None,
    ) -> Generation:
        if sampling is None:
            self._request = None
        else:
            self._request = _Request(params=self._params(sampling), rng=self._rng(sampling))
        return super().generate(prompt, max_new_tokens, eos_token_id=eos_token_id)

    def _drafter_for(self, ctx: list[int], max_new_tokens: int) -> Any:
        if self._sampler is None:
            return super()._drafter_for(ctx, max_new_tokens)
        if self._request is not None:
            return self._sampler  # sampled requests draft with it; greedy ones with the oracle drafter
        continuation = greedy_decode(self._oracle, ctx, max_new_tokens + self.k).tokens
        return OracleDrafter(ctx, continuation, vocab_size=self.vocab_size)

    def _round(
        self, ctx: list[int], drafter: Any, remaining: int, room: int, eos: int | None, steps: list[Step], tally: _Tally
    ) -> list[int]:
        request = self._request
        if request is None:
            return super()._round(ctx, drafter, remaining, room, eos, steps, tally)
        target = self.target
        k_eff = self._round_bound(remaining, room)
        base = target.processed
        before = target.snapshot()
        draft, q = self._propose(drafter, ctx, k_eff, request)
        fed = [ctx[-1], *draft]
        checkpoints: list[object] | None = None
        if self.rollback == "checkpoint":
            logits, checkpoints = target.forward_with_checkpoints(fed)
        else:
            logits = target.forward(fed)
        tally.verify += 1
        logits = np.asarray(logits, dtype=np.float64)
        accepted = self._sampled_accept(draft, q, logits, request)
        emitted = self._emit(accepted, remaining, eos)
        keep = self._kept(len(emitted))
        if keep < len(fed):
            tally.replay += self._roll_back(fed, keep, checkpoints, before)
        argmax = [int(i) for i in np.argmax(logits, axis=1)]
        steps.append(Step(base=base, draft=draft, argmax=argmax, accepted=accepted, processed=target.processed))
        self._count(tally, draft, accepted)
        return emitted

    def _propose(self, drafter: Any, ctx: list[int], k_eff: int, request: _Request) -> tuple[list[int], np.ndarray]:
        if k_eff <= 0:
            return [], np.zeros((0, self.vocab_size))
        sampled = getattr(drafter, "propose_sampled", None)
        if callable(sampled):
            proposal = sampled(ctx, k_eff, sampling=request.params, rng=self._drafter_rng(request))
            return list(proposal.tokens), np.asarray(proposal.q, dtype=np.float64)
        draft = self._take(drafter.propose(ctx, k_eff), k_eff)
        q = np.zeros((len(draft), self.vocab_size))
        q[np.arange(len(draft)), draft] = 1.0
        return draft, q

    def _sampled_accept(self, draft: list[int], q: np.ndarray, logits: np.ndarray, request: _Request) -> list[int]:
        params, rng = request.params, request.rng
        p = np.stack([self._p(row, params) for row in logits])
        p_accept = np.stack([self._p_accept(row, params) for row in logits])
        for i, x in enumerate(draft):
            if self.scheme == "match":
                token = self._match_sample(i, len(draft), self._draw_from(p[i], logits[i], params), rng)
                if token == x:
                    continue
                return [*draft[:i], token]
            if self._keeps(x, p_accept[i], self._q_row(q, i), rng.random()):
                continue
            return [*draft[:i], _draw(self._residual(p[i], self._q_row(q, i)), rng)]
        row = self._bonus_row(p, len(draft))
        return [*draft, _draw(self._draw_from(row, logits[len(draft)], params), rng)]


# ---------------------------------------------------------------------------- the members


class ArgmaxVerification(SamplingZooEngine):
    """``engine.sampled-distribution``: verifies by argmax at temperature > 0 (SGLang #31214).

    A draft token is kept when it is the target's top token, and the replacement and bonus are the
    top token: the output is greedy whatever the temperature.
    """

    def _keeps(self, x: int, p_row: np.ndarray, q_row: np.ndarray, u: float) -> bool:
        return x == int(np.argmax(p_row))

    def _residual(self, p_row: np.ndarray, q_row: np.ndarray) -> np.ndarray:
        out = np.zeros_like(p_row)
        out[int(np.argmax(p_row))] = 1.0
        return out

    def _bonus_row(self, p: np.ndarray, drafted: int) -> np.ndarray:
        return self._residual(p[drafted], p[drafted])


class ResidualFromP(SamplingZooEngine):
    """``engine.sampled-support``: after a rejection, samples the replacement from p, not max(0, p - q).

    The rejected token can come back as its own replacement, and the output over-weights draft tokens.
    """

    def _residual(self, p_row: np.ndarray, q_row: np.ndarray) -> np.ndarray:
        return p_row


class UnnormalizedResidual(SamplingZooEngine):
    """``engine.sampled-distribution``: draws the replacement from max(0, p - q) without normalizing it.

    An inverse CDF on a uniform in [0, 1) over a residual of mass below 1 runs off its end, onto the
    last token id, whenever the uniform exceeds the residual's mass.
    """

    def _residual(self, p_row: np.ndarray, q_row: np.ndarray) -> np.ndarray:
        return np.maximum(p_row - q_row, 0.0)


class BonusFromWrongRow(SamplingZooEngine):
    """``engine.sampled-distribution``: after a full accept, samples the bonus from the last draft
    position's row of p instead of the next one (an off-by-one in the verify logits)."""

    def _bonus_row(self, p: np.ndarray, drafted: int) -> np.ndarray:
        return p[max(drafted - 1, 0)]


class UnfilteredSampling(SamplingZooEngine):
    """``engine.sampled-support``: applies top-k/top-p/min-p for acceptance but draws replacements and
    the bonus from the unfiltered ``softmax(logits / T)`` (vLLM #10198: parameters applied inconsistently)."""

    def _p(self, row: np.ndarray, params: SamplingParams) -> np.ndarray:
        return target_distribution(row, attrs.evolve(params, top_k=0, top_p=1.0, min_p=0.0))


class SharedRngStream(SamplingZooEngine):
    """``engine.seeds``: one generator for the engine's lifetime, the request's seed ignored: a seed
    asked again gives another output, though the engine declares ``seeded``."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._shared = np.random.default_rng(0)

    def _rng(self, sampling: SamplingParams) -> np.random.Generator:
        return self._shared


class BroadcastSeed(SamplingZooEngine):
    """``engine.seeds``: every request's generator is seeded with the same value (vLLM #50440: one
    broadcast seed for a batch): different seeds give the same output."""

    def _rng(self, sampling: SamplingParams) -> np.random.Generator:
        return np.random.default_rng(1234)


class QOfNextPosition(SamplingZooEngine):
    """``engine.sampled-distribution``: tests acceptance against the q row of the next draft position
    (``p[i] / q[i + 1]``): an index off by one between the drafter's rows and the verify logits."""

    def _q_row(self, q: np.ndarray, i: int) -> np.ndarray:
        return q[min(i + 1, len(q) - 1)]


class GreedyLimitSamples(SamplingZooEngine):
    """``engine.greedy-limit``: reads temperature 0 as "unset" and samples at temperature 1
    (``temperature or 1.0``): a greedy request is not greedy."""

    def _params(self, sampling: SamplingParams) -> SamplingParams:
        return sampling if sampling.temperature else attrs.evolve(sampling, temperature=1.0)


class SampledCountsReplacement(SamplingZooEngine):
    """``engine.sampled-rounds``: in sampled rounds, counts the replacement token of a rejection as an
    accepted draft token (its acceptance metrics overstate the drafter)."""

    def _count(self, tally: _Tally, draft: list[int], accepted: list[int]) -> None:
        tally.count(draft, accepted)
        if len(accepted) <= len(draft):
            tally.accepted += 1


class QFromRawLogits(DraftSampler):
    """``drafter.proposal-distribution``: samples from the processed distribution but declares q from
    the raw logits (``softmax(logits)``, temperature and top-p not applied; transformers #47932)."""

    def _rows(self, row: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
        raw = np.exp(np.asarray(row, dtype=np.float64) - np.max(row))
        return target_distribution(row, params), raw / raw.sum()


class SamplesPaddedVocab(SamplingZooEngine):
    """``engine.sampled-support``: draws a sampled request's last token on a fast path over its LM head padded to
    twice the vocabulary (the padding rows tile the real ones, and the path skips the vocabulary mask): about
    half the time that id is ``>= vocab_size``, an id outside the vocabulary."""

    def generate(  # type: ignore[override]
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        *,
        eos_token_id: int | None = None,
        sampling: SamplingParams | None = None,
    ) -> Generation:
        gen = super().generate(prompt, max_new_tokens, eos_token_id=eos_token_id, sampling=sampling)
        request = self._request
        if request is None or not gen.tokens or request.rng.random() < 0.5:
            return gen
        return attrs.evolve(gen, tokens=(*gen.tokens[:-1], gen.tokens[-1] + self.vocab_size))


class UnseededDrafterRng(SamplingZooEngine):
    """``engine.seeds``: hands its sampling drafter a fresh unseeded generator (``default_rng()``) instead of the
    request's: the draft, and so the output, changes when a seed is asked again, though the engine declares
    ``seeded``."""

    def _drafter_rng(self, request: _Request) -> np.random.Generator:
        return np.random.default_rng()


class DrafterIgnoresRng(DraftSampler):
    """``engine.seeds`` (a drafter): ignores the ``rng`` it is given and draws from a generator of its own, seeded
    from the operating system when it is made: an engine using it no longer gives one output per seed."""

    def __init__(self, model: Target | None = None) -> None:
        super().__init__(model)
        self._own = np.random.default_rng()

    def propose_sampled(
        self, context: Sequence[int], k: int, *, sampling: SamplingParams, rng: np.random.Generator | None
    ) -> SampledDraft:
        return super().propose_sampled(context, k, sampling=sampling, rng=self._own)


class MatchesArgmaxAtLastPosition(SamplingZooEngine):
    """``engine.sampled-distribution``: sample-and-match that, at the last draft position only, compares the draft
    token with the target's argmax instead of its sample (a greedy fast path left in the verify kernel's last
    slot): reached only when every earlier draft token was kept, it is greedy there."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**{"scheme": "match", **options})

    def _match_sample(self, i: int, drafted: int, p_row: np.ndarray, rng: np.random.Generator) -> int:
        token = _draw(p_row, rng)  # the same draws as the control: only the last slot's token differs
        return int(np.argmax(p_row)) if i == drafted - 1 else token


class BonusAfterAcceptedEos(SamplingZooEngine):
    """``engine.sampled-rounds``: in a sampled round that keeps the EOS id as a draft token, it still emits the
    token drawn after it (SGLang #33758: the bonus token sampled after an accepted EOS), then stops with
    ``eos``: a token after the first EOS. Greedy rounds cut at EOS correctly."""

    def _emit(self, accepted: list[int], remaining: int, eos: int | None) -> list[int]:
        if self._request is None or eos is None or eos not in accepted[:-1]:
            return super()._emit(accepted, remaining, eos)
        return accepted[: accepted.index(eos) + 2][:remaining]
