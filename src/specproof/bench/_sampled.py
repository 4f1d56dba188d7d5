"""Acceptance on real contexts at temperature > 0: each drafter's sampled proposal judged by rejection sampling.

The greedy real-context figure (``_real``) compares a drafter's proposal with the target's greedy
continuation. Sampled, there is no one continuation: at each real-context position, for each
temperature and each of ``seeds`` fixed seeds, the drafter proposes ``k`` tokens by sampling
(``propose_sampled``, its ``q`` rows; a drafter without it proposes deterministically, ``q``
one-hot), the target verifies ``[last token, *draft]`` in one forward from the position's
snapshot, and the engine's own rejection rule (``specproof.engine.sampling.rejection_accept_tokens``,
the one ``SpecDecoder(scheme="rejection")`` applies) decides how many draft tokens are kept. The
sampling parameters are ``temperature=T`` alone (no top-k/top-p/min-p), the same for drafter and target.

Per drafter and temperature: ``tokens_per_round`` (the mean of ``accepted + 1`` over positions x seeds,
what one verify round emits) and acceptance by position (of the draft positions reached, the share
kept), as the greedy figure counts them. Seeds: the generator of ``(text, temperature, seed)`` is
``numpy.random.default_rng([SAMPLED_SEED, text, temperature index, seed])``, created afresh for each
drafter, so every drafter starts each text from the same random stream and a run is reproducible.
Reported, never gated (``_gate`` reads ``real_contexts.cells``, the greedy figures, only).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

import attrs
import numpy as np

from specproof.bench._config import SAMPLED_TEMPERATURES
from specproof.bench._real import RealContextText
from specproof.contract import Drafter, Target
from specproof.contract.errors import InvalidSettingError
from specproof.contract.sampling import SamplingParams
from specproof.engine import ContextView
from specproof.engine.sampling import rejection_accept_tokens, target_distribution

__all__ = ["SAMPLED_SEED", "SAMPLED_TEMPERATURES", "SampledContextCell", "measure_sampled_contexts"]

SAMPLED_SEED: Final = 28  # the first entropy word of every generator (issue 28)
SCHEME: Final = "rejection"


@attrs.frozen(kw_only=True)
class SampledContextCell:
    """One drafter's sampled acceptance at one temperature on the real-context positions of one target."""

    target: str
    drafter: str
    k: int
    temperature: float
    scheme: str
    seeds: int
    positions: int
    rounds: int  # positions x seeds
    tokens_per_round: float  # mean of accepted + 1 over the rounds
    acceptance_by_position: tuple[float, ...]
    attempts_by_position: tuple[int, ...]
    mean_draft_length: float
    q: str  # "declared" (the drafter sampled and returned q) or "one-hot" (a deterministic drafter)

    @property
    def key(self) -> str:
        return f"{self.target}/{self.drafter}/k{self.k}/T{self.temperature:g}"

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = attrs.asdict(self)
        data["acceptance_by_position"] = list(self.acceptance_by_position)
        data["attempts_by_position"] = list(self.attempts_by_position)
        data["key"] = self.key
        return data


class _Tally:
    def __init__(self, k: int) -> None:
        self.attempts = [0] * k
        self.accepts = [0] * k
        self.rounds = 0
        self.accepted = 0
        self.drafted = 0

    def add(self, draft_length: int, accepted: int) -> None:
        self.rounds += 1
        self.accepted += accepted
        self.drafted += draft_length
        for i in range(min(draft_length, accepted + 1)):  # a position after a rejection is not attempted
            self.attempts[i] += 1
            self.accepts[i] += i < accepted


def _propose(
    drafter: Drafter, view: ContextView, k: int, params: SamplingParams, rng: np.random.Generator, vocab: int
) -> tuple[list[int], np.ndarray]:
    """The drafter's sampled draft and its q rows, or its deterministic draft with one-hot rows."""
    sampled = getattr(drafter, "propose_sampled", None)
    if callable(sampled):
        got = sampled(view, k, sampling=params, rng=rng)
        draft, q = [int(t) for t in got.tokens][:k], np.asarray(got.q, dtype=np.float64)[:k]
    else:
        draft = [int(t) for t in drafter.propose(view, k)][:k]
        q = np.zeros((len(draft), vocab))
        q[np.arange(len(draft)), draft] = 1.0
    if q.shape != (len(draft), vocab):
        raise InvalidSettingError(
            f"sampled real contexts: drafter {getattr(drafter, 'name', type(drafter).__name__)} returned q of shape "
            f"{q.shape} for a draft of {len(draft)} tokens (expected ({len(draft)}, {vocab}))"
        )
    return draft, q


def measure_sampled_contexts(
    target_spec: str,
    target: Target,
    drafters: Sequence[tuple[str, Callable[[], Drafter]]],
    texts: Sequence[RealContextText],
    *,
    k: int,
    temperatures: Sequence[float] = SAMPLED_TEMPERATURES,
    seeds: int = 2,
    tick: Callable[[str], None] = lambda _m: None,
) -> list[SampledContextCell]:
    """Every drafter's rejection-sampling acceptance at every temperature, ``seeds`` seeded rounds per position."""
    params = [SamplingParams(temperature=t) for t in temperatures]  # validates each temperature
    if any(p.greedy for p in params):
        raise InvalidSettingError(f"sampled real contexts: temperatures {list(temperatures)} must be above 0")
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise InvalidSettingError(f"sampled real contexts: seeds={seeds!r} must be an integer >= 1")
    vocab = target.vocab_size
    made = [(name, factory()) for name, factory in drafters]
    tallies = {(name, ti): _Tally(k) for name, _ in made for ti in range(len(params))}
    for text_index, text in enumerate(texts):
        rngs = {}
        for name, drafter in made:
            reset = getattr(drafter, "reset", None)
            if callable(reset):
                reset()
            for ti in range(len(params)):
                for s in range(seeds):
                    rngs[name, ti, s] = np.random.default_rng([SAMPLED_SEED, text_index, ti, s])
        target.reset()
        fed = 0
        buf: list[int] = []
        view = ContextView(buf)
        for p in text.positions:
            if p - 1 > fed:  # the target holds text[:p-1]; the prefix's last token is the verify's first input
                target.forward(list(text.tokens[fed : p - 1]))
                fed = p - 1
            snap = target.snapshot()
            buf.extend(text.tokens[len(buf) : p])
            for name, drafter in made:
                for ti, prm in enumerate(params):
                    for s in range(seeds):
                        rng = rngs[name, ti, s]
                        draft, q = _propose(drafter, view, k, prm, rng, vocab)
                        logits = np.asarray(target.forward([int(text.tokens[p - 1]), *draft]), dtype=np.float64)
                        target.restore(snap)
                        rows = np.stack([target_distribution(row, prm) for row in logits])
                        accepted, _ = rejection_accept_tokens(draft, q, rows, rng)
                        tallies[name, ti].add(len(draft), accepted)
        tick(f"real contexts sampled: {text.source}")
    cells = []
    for name, drafter in made:
        declared = "declared" if callable(getattr(drafter, "propose_sampled", None)) else "one-hot"
        for ti, prm in enumerate(params):
            t = tallies[name, ti]
            cells.append(
                SampledContextCell(
                    target=target_spec,
                    drafter=name,
                    k=k,
                    temperature=prm.temperature,
                    scheme=SCHEME,
                    seeds=seeds,
                    positions=t.rounds // seeds,
                    rounds=t.rounds,
                    tokens_per_round=(t.accepted + t.rounds) / t.rounds if t.rounds else 0.0,
                    acceptance_by_position=tuple(a / n if n else 0.0 for a, n in zip(t.accepts, t.attempts)),
                    attempts_by_position=tuple(t.attempts),
                    mean_draft_length=t.drafted / t.rounds if t.rounds else 0.0,
                    q=declared,
                )
            )
    return cells
