"""Sampled decoding with decode parameters: the emitted tokens follow plain sampling from the **processed**
``p`` (docs/contract.md, "Decode state", "Sampled runs"), judged by the sampling contract's all-token PIT test.

Each example is one request: a prompt, the processors the engine declares (all on), sampling parameters and
``GENERATIONS`` seeded generations, the suite's drafts following plain greedy decoding with the same
processors (so every round drafts, and blocks are accepted and rejected). Every emitted token is scored on a
fresh copy of the model by teacher forcing: the row after the prompt and the tokens before it, through
``OracleProcessors`` fed those tokens, then the sampling contract's processing (``processed_distribution``).
Under losslessness the randomized PIT values of all of them are iid U(0, 1) (``_pit``), so the DKW-Massart
test at ``alpha`` (the false-fail bound split over the profile's examples) fails a correct engine with
probability at most ``FALSE_FAIL_BOUND`` a run; the smallest deviation it detects (power 0.99) is in the note.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
from hypothesis import strategies as st

from specproof.conformance._pit import PitTest, pit_values
from specproof.conformance.checks.decode_state import PROCESSOR_FEATURES, DecodeSubject, ScheduleDrafter
from specproof.contract import DecodeParams, Generation, Violation
from specproof.contract.decode_state import plain_decode_with, scored_rows
from specproof.contract.errors import UnsupportedParameterError
from specproof.contract.sampling import SamplingParams, processed_distribution
from specproof.strategies import contexts, processor_configs

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._registry import Invariant

__all__ = ["GENERATIONS", "SAMPLINGS", "SampledDecodeExample", "check_sampled_decode", "draw_sampled_decode"]

GENERATIONS = 48
"""Seeded generations per example (each of 8-16 tokens: a few hundred PIT values an example)."""

SAMPLINGS: tuple[SamplingParams, ...] = (
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=1.5, top_k=12),
    SamplingParams(temperature=0.8, top_p=0.95),
)
"""The sampling parameters an example draws from: plain, flattened and cut, sharpened and cut."""


@attrs.frozen(kw_only=True)
class SampledDecodeExample:
    """One request of a sampled decode check, run ``generations`` times with seeds ``first_seed ..``."""

    prompt: tuple[int, ...]
    max_new_tokens: int
    params: DecodeParams
    sampling: SamplingParams
    first_seed: int
    alpha: float
    generations: int = GENERATIONS

    @property
    def seeds(self) -> range:
        return range(self.first_seed, self.first_seed + self.generations)

    def to_json(self) -> dict[str, object]:
        return {
            "prompt": list(self.prompt),
            "max_new_tokens": self.max_new_tokens,
            "decode": self.params.to_json(),
            "sampling": self.sampling.to_json(),
            "seeds": [self.seeds[0], self.seeds[-1]],
        }


def draw_sampled_decode(data: st.DataObject, subject: DecodeSubject, *, alpha: float) -> SampledDecodeExample:
    prompt = data.draw(contexts(subject.vocab_size, min_size=1, max_size=min(subject.max_prompt, 16)), label="prompt")
    n = data.draw(st.integers(8, max(8, min(subject.max_new_tokens, 16))), label="max_new_tokens")
    features = subject.features & PROCESSOR_FEATURES
    params = data.draw(processor_configs(subject.vocab_size, features=features, active=True), label="processors")
    sampling = data.draw(st.sampled_from(SAMPLINGS), label="sampling")
    seed = data.draw(st.integers(0, 2**20), label="first seed")
    return SampledDecodeExample(
        prompt=tuple(prompt), max_new_tokens=n, params=params, sampling=sampling, first_seed=seed, alpha=alpha
    )


def _generate(subject: DecodeSubject, ex: SampledDecodeExample, source: tuple[int, ...], seed: int) -> Generation:
    engine = subject.make_engine()
    if subject.takes_drafter:  # every round drafts along plain greedy decoding: accepted and rejected blocks
        engine.drafter = ScheduleDrafter(len(ex.prompt), source, [(subject.k, subject.k)], subject.vocab_size)
    gen = engine.generate(list(ex.prompt), ex.max_new_tokens, decode=ex.params, sampling=ex.sampling.with_seed(seed))
    if not isinstance(gen, Generation):
        raise TypeError(f"generate returned {type(gen).__name__}, not a Generation")
    return gen


def check_sampled_decode(
    inv: Invariant, subject: DecodeSubject, ex: SampledDecodeExample
) -> tuple[list[Violation], int, str]:
    """The PIT values of every emitted token against the processed ``p`` are uniform (DKW-Massart at ``alpha``)."""
    reference = subject.make_reference()  # one fresh copy, reset before each use (scored_rows resets it)
    source = plain_decode_with(reference, ex.prompt, ex.max_new_tokens + 8, decode=ex.params).tokens
    test = PitTest(name=inv.id, alpha=ex.alpha)
    example = ex.to_json()
    for seed in ex.seeds:
        try:
            gen = _generate(subject, ex, source, seed)
        except UnsupportedParameterError as exc:  # refusing is allowed (parameter parity): a skip with its reason
            return [], 0, f"the engine refused the request: {exc}"
        except Exception as exc:  # the check reports it as the engine's failure, naming the cause
            text = f"the sampled generation with decode parameters (seed {seed}) failed: {type(exc).__name__}: {exc}"
            return [inv.violation(text, example=example)], 1, ""
        if not gen.tokens:
            continue
        rows = scored_rows(reference, ex.prompt, gen.tokens, decode=ex.params, eos_token_id=None)
        p = processed_distribution(rows, ex.sampling)
        test.add(pit_values(p, list(gen.tokens), seed=seed))
        if test.rejected:
            text = (
                f"sampled with decode parameters, the emitted tokens do not follow plain sampling from the processed "
                f"p: {test.describe()}; {test.direction()}"
            )
            return [inv.violation(text, expected="PIT values uniform", actual=test.distance, example=example)], 1, ""
    if not test.tested:
        return [], 0, test.describe()
    return [], test.tested, test.describe()
