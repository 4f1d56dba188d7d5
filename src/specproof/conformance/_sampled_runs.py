"""The sampled search of an engine case: many seeded generations, each scored against the oracle's ``p``.

One ``SampledSearch`` per engine case is shared by every sampling invariant (docs/contract.md,
"Sampling"): for each configuration (the built-in decoder: both schemes; drafts from the suite or
from the engine's own sampling drafter) it draws generations with seeds ``s, s + 1, ...`` (``s = 0``
derandomized; drawn from ``--seed`` otherwise) on a few
fixed prompts until the profile's generation budget (``Profile.sampling_generations``) is spent,
stopping early only at the first rejection (the check then says whether the configuration reached
the profile's total-variation sensitivity, ``Profile.sampling_tv``). Each emitted token is scored
with one teacher-forced forward of the oracle (the prompt and the emitted tokens), giving the
``p`` it should have been drawn from; the event tests (``_sequential``) and the all-token PIT test
(``_pit``) read it.

The suite drafts with ``SuiteSamplingDrafter``: deterministic (its ``q`` is one-hot) and read off
the oracle model, so the event "the emitted token equals the draft token" has probability exactly
``p(draft)`` under any lossless scheme, and its drafts mix the top token with lower-ranked ones
(both acceptances and rejections happen).
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from specproof.conformance._pit import PitTest, pit_values
from specproof.conformance._sequential import EventTest
from specproof.conformance._waiting import timed_out, waiting
from specproof.conformance.checks.generation import token_id_problem
from specproof.contract import Generation, Target
from specproof.contract.sampling import SampledDraft, SamplingParams, processed_distribution
from specproof.engine import SpecDecoder
from specproof.engine.drafters import ModelDrafter
from specproof.engine.plugin_modules import declared_capabilities

__all__ = [
    "EVENTS",
    "DraftCall",
    "SampledConfig",
    "SampledRun",
    "SampledSearch",
    "SuiteSamplingDrafter",
    "head_and_tail",
    "run_sampled_search",
]

EVENTS: dict[str, str] = {
    "draft": "the emitted token equals the suite's draft token at its position (probability p(draft))",
    "top": "the emitted token is the target's top token (probability max p)",
    "head": "the emitted token is among the top tokens holding half of p's mass (probability p(head))",
    "tail": "the emitted token is among the bottom tokens holding a tenth of p's mass (probability p(tail))",
    "replacement": "after a rejected draft token d, the token is the top of p without d (probability p'(top))",
    "last": "at the last position of a suite draft whose earlier tokens were all kept, the token is p's top token "
    "(probability max p)",
}
"""The events each scored token is tested on (``EventTest`` s, one per event and configuration)."""

TESTS_PER_CONFIGURATION = len(EVENTS) + 1
"""The event tests and the all-token PIT test (``_pit``): a check's false-fail bound is split evenly over
its configurations and these."""


class SuiteSamplingDrafter(ModelDrafter):
    """Deterministic drafts read off the oracle model, at one catch-up forward per call.

    Two kinds of call, chosen by a hash of the context (so a draft is a function of its context: its
    ``q`` is one-hot). With ``params``, half the calls draw every draft token from the oracle's ``p``
    itself (the row after the context and the draft so far, one one-token forward per token, each
    draw's uniform seeded by the context): such drafts are kept whole often, so every draft position
    is reached and full blocks are common. The others: ``draft[0]`` is the token of rank 0, 1 or 2+
    (by logit, lower id first) in the oracle's row after the context, chosen by a hash of the context
    length and last token; each later token is what followed the previous one at its latest earlier
    occurrence in the context (an n-gram guess), else one of that row's top four tokens, so rounds
    end early and rejections are common. It logs every call (``calls``), so the draft at each
    position is known for black-box engines too.
    """

    def __init__(self, model: Target, *, sampled: bool = False, params: SamplingParams | None = None) -> None:
        super().__init__(model, name="specproof.SuiteSamplingDrafter")
        self.calls: list[DraftCall] = []
        self.params = params  # the request's parameters: the p that half the calls draw from
        if not sampled:  # a deterministic drafter has no propose_sampled: the engine's q is one-hot
            self.propose_sampled = None  # type: ignore[method-assign, assignment]

    def reset(self) -> None:
        super().reset()
        self.calls = []

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        return self._suite_draft(context, k, None, None)

    def propose_sampled(  # type: ignore[no-redef]
        self, context: Sequence[int], k: int, *, sampling: SamplingParams, rng: np.random.Generator
    ) -> SampledDraft:
        """As ``propose``, but ``draft[0]`` is drawn (with the request's generator) from ``q[0]``: the oracle's
        row at a higher temperature, no top-k/top-p/min-p (so q differs from p); later tokens keep one-hot rows."""
        vocab = int(self.model.vocab_size)
        draft = self._suite_draft(context, k, sampling, rng)
        q = np.zeros((len(draft), vocab))
        q[np.arange(len(draft)), draft] = 1.0
        if draft and self.calls[-1].q0 is not None:  # a call that drew from p has one-hot rows only
            q[0] = self.calls[-1].q0
        return SampledDraft(draft, q)

    def _suite_draft(
        self, context: Sequence[int], k: int, sampling: SamplingParams | None, rng: np.random.Generator | None
    ) -> list[int]:
        n = len(context)
        draft: list[int] = []
        q0: np.ndarray | None = None
        if 0 < k and 0 < n <= self.max_context and self.params is not None and _draws_from_p(context):
            draft = [token for token, _ in self._draft(context, k, _p_pick(context, self.params))]
        elif 0 < k and 0 < n <= self.max_context:
            self._catch_up(context)
            assert self._row is not None
            row = np.asarray(self._row, dtype=np.float64)
            ranked = np.lexsort((np.arange(row.shape[0]), -row))  # by logit, lower id first among equals
            if sampling is not None and rng is not None:
                flatter = SamplingParams(temperature=max(sampling.temperature, 0.5) * 1.5)
                q0 = processed_distribution(row, flatter)
                draft.append(int(rng.choice(len(q0), p=q0)))
            else:
                pick = (n * 31 + int(context[-1]) * 7) % 8
                rank = 0 if pick < 4 else 1 if pick < 6 else 2 + (n + int(context[-1])) % 6
                draft.append(int(ranked[min(rank, len(ranked) - 1)]))
            seen = list(context)
            while len(draft) < k:
                last = draft[-1]
                follow = next((seen[i + 1] for i in range(len(seen) - 2, -1, -1) if seen[i] == last), None)
                # no earlier occurrence: one of the row's top tokens (mostly rejected: a partial round)
                draft.append(int(follow) if follow is not None else int(ranked[(n + len(draft)) % 4]))
        self.calls.append(DraftCall(n, tuple(draft), q0))
        return draft


def _draws_from_p(context: Sequence[int]) -> bool:
    """Whether the suite drafter draws this call's whole draft from ``p`` (half the contexts, by a hash)."""
    return (len(context) * 13 + int(context[-1]) * 5) % 4 < 3


def _p_pick(context: Sequence[int], params: SamplingParams) -> Callable[[np.ndarray], tuple[int, None]]:
    """Draws each draft token from ``p`` of its logits row, with uniforms seeded by the context (a deterministic
    draft: the engine's generator never sees them)."""
    uniforms = np.random.default_rng([len(context), *(int(t) for t in context[-8:])])

    def pick(row: np.ndarray) -> tuple[int, None]:
        p = processed_distribution(np.asarray(row, dtype=np.float64), params)
        cdf = np.cumsum(p)
        token = min(int(np.searchsorted(cdf, uniforms.random() * cdf[-1], side="right")), len(p) - 1)
        while p[token] <= 0.0:  # on a flat stretch's edge: back to a token with mass
            token -= 1
        return token, None

    return pick


@attrs.frozen
class DraftCall:
    """One call of the suite drafter: the context length it was given and the draft it returned."""

    context_length: int
    draft: tuple[int, ...]
    q0: np.ndarray | None = attrs.field(default=None, eq=False, repr=False)  # q[0] of a sampled draft


@attrs.frozen(kw_only=True)
class SampledRun:
    """One seeded generation and what scoring it found. ``p``: the oracle's processed distribution
    for each emitted token; ``logits``: the oracle's rows (for the tolerance of the support check)."""

    config: str
    prompt: tuple[int, ...]
    seed: int
    max_new_tokens: int
    generation: Generation | None
    error: str | None = None
    p: np.ndarray | None = attrs.field(default=None, eq=False, repr=False)
    logits: np.ndarray | None = attrs.field(default=None, eq=False, repr=False)
    calls: tuple[DraftCall, ...] = ()
    eos: int | None = None  # the EOS id the generation was given
    # the first emitted id that is not a token: (index, id, why); the run is not scored (engine.sampled-support)
    bad_token: tuple[int, object, str] | None = None


@attrs.define
class SampledConfig:
    """One configuration of a case: its scheme and where its drafts come from, its runs and event tests."""

    name: str
    scheme: str | None  # the built-in decoder's scheme; None: the plug-in engine's own
    # "suite" (SuiteSamplingDrafter, deterministic), "suite-sampled" (its draft[0] sampled from a declared
    # q[0]) or "own" (the engine's or the subject's drafter)
    drafts: str
    tests: dict[str, EventTest]
    runs: list[SampledRun] = attrs.Factory(list)
    pit: PitTest | None = None  # the all-token test (``_pit``); None for a configuration without events
    repeats: list[tuple[SampledRun, SampledRun]] = attrs.Factory(list)  # (first, again with its seed)
    chain: list[SampledRun] = attrs.Factory(list)  # short generations on one prompt, seeds 5000, 5001, ...
    # per draft position m: suite drafts with a token there, and those whose tokens before m were all emitted
    drafted: list[int] = attrs.Factory(list)
    reached: list[int] = attrs.Factory(list)

    @property
    def rejected(self) -> bool:
        """Some test of the configuration rejected (the run stops drawing)."""
        return any(t.rejected for t in self.tests.values()) or (self.pit is not None and self.pit.rejected)

    @property
    def false_fail_bound(self) -> float:
        """The configuration's share of its check's false-fail bound: the sum of its tests' levels."""
        return sum(t.alpha for t in self.tests.values()) + (self.pit.alpha if self.pit is not None else 0.0)

    @property
    def primary(self) -> EventTest:
        """The least sensitive of the sized tests (``top`` and, with suite drafts, ``draft``): the run
        draws until it detects the profile's TV deviation."""
        sized = [self.tests[e] for e in ("draft", "top") if e in self.tests]
        return max(sized, key=lambda t: t.min_detectable)


@attrs.define
class SampledSearch:
    """Every configuration's runs for one engine case, and the greedy-limit runs."""

    params: SamplingParams
    configs: list[SampledConfig]
    greedy_runs: list[tuple[str, SampledRun]] = attrs.Factory(list)  # (the parameters' name, run)
    seeded: bool = False  # the engine promises one output per seed (capability ``seeded``)
    engine: str = ""  # the engine's name, for the examples
    why_not: str | None = None  # why nothing ran (not sampling, no oracle model)


CHAIN_LENGTH = 20  # generations the seed-independence test compares, each with the one before
CHAIN_TOKENS = 16

Generate = Callable[[list[int], int, SamplingParams, "int | None"], Generation]  # (prompt, n, params, eos)


def sample_prompts(vocab_size: int, *, longest: int, seed: int) -> list[list[int]]:
    """Four fixed prompts (lengths 1, 3, 8 and up to ``longest``), drawn once from ``seed``."""
    rng = np.random.default_rng([seed, 28])
    lengths = sorted({1, min(3, longest), min(8, longest), max(1, longest)})
    return [[int(t) for t in rng.integers(0, vocab_size, size=n)] for n in lengths]


def score(model: Target, run: SampledRun, params: SamplingParams) -> SampledRun:
    """``run`` with the oracle's ``p`` (and logits) for each emitted token: one teacher-forced forward of
    ``model`` (an oracle copy, reset here)."""
    gen = run.generation
    if gen is None or not gen.tokens:
        return run
    bad = token_id_problem(gen.tokens, int(model.vocab_size))
    if bad is not None:  # never fed to the oracle: a violation naming the token, not an IndexError
        return attrs.evolve(run, bad_token=bad)
    model.reset()
    fed = [*run.prompt, *gen.tokens[:-1]]
    rows = np.asarray(model.forward(fed), dtype=np.float64)[len(run.prompt) - 1 :]
    return attrs.evolve(run, p=processed_distribution(rows, params), logits=rows)


def add_events(config: SampledConfig, run: SampledRun) -> None:
    """Score ``run``'s tokens on the configuration's events (drafts from the suite drafter's log).

    The draft event's probability is ``p(d)`` for a deterministic draft token (any lossless scheme);
    for a token ``x`` drawn from a declared ``q``, ``min(1, p(x) / q(x))`` under rejection sampling and
    ``p(x)`` under sample-and-match. After a rejection the token is drawn from ``p`` without ``d``
    (``max(0, p - q)`` normalized, for a sampled draft under rejection sampling)."""
    gen, p = run.generation, run.p
    if gen is None or p is None:
        return
    tokens = list(gen.tokens)
    if config.pit is not None and tokens:
        config.pit.add(pit_values(p, tokens, seed=run.seed))
    sequence = [*run.prompt, *tokens]
    drafted = _draft_at_positions(run.calls, sequence, len(run.prompt)) if config.drafts != "own" else {}
    last = _last_draft_positions(run.calls, sequence) if config.drafts != "own" else set()
    for i, token in enumerate(tokens):
        row = p[i]
        top = int(np.argmax(row))
        config.tests["top"].add(token == top, row[top])
        head, tail = head_and_tail(row)
        config.tests["head"].add(bool(head[token]), float(row[head].sum()))
        config.tests["tail"].add(bool(tail[token]), float(row[tail].sum()))
        if len(run.prompt) + i in last:  # a full block's last slot: the position a short draft never reaches
            config.tests["last"].add(token == top, row[top])
        found = drafted.get(len(run.prompt) + i)
        if found is None:
            continue
        draft, q_row = found
        if q_row is None or config.scheme == "match":
            kept, residual = row[draft], _without(row, draft)
        else:
            kept = min(1.0, row[draft] / q_row[draft])
            residual = np.maximum(row - q_row, 0.0)
            residual = residual / residual.sum() if residual.sum() > 0 else None
        config.tests["draft"].add(token == draft, kept)
        if token != draft and residual is not None:
            best = int(np.argmax(residual))
            config.tests["replacement"].add(token == best, residual[best])


def count_reach(config: SampledConfig, run: SampledRun) -> None:
    """Add ``run``'s suite drafts to the configuration's per-position reach: a draft position is reached when
    every draft token before it was emitted and the output goes on to it (the ``draft`` event scores it)."""
    gen = run.generation
    if gen is None:
        return
    sequence = [*run.prompt, *gen.tokens]
    for call in run.calls:
        while len(config.drafted) < len(call.draft):
            config.drafted.append(0)
            config.reached.append(0)
        for m in range(len(call.draft)):
            config.drafted[m] += 1
        for m, token in enumerate(call.draft):
            position = call.context_length + m
            if position >= len(sequence):
                break
            config.reached[m] += 1
            if sequence[position] != token:
                break


def _without(row: np.ndarray, token: int) -> np.ndarray | None:
    """``row`` with ``token`` removed and renormalized (None when it held all the mass)."""
    if row[token] >= 1.0:
        return None
    rest = row.copy()
    rest[token] = 0.0
    return rest / rest.sum()


def head_and_tail(row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Masks of the head (the top tokens, probability descending and lower id first, until half the
    mass) and the tail (the tokens after 90% of the mass; probability 0 ones excluded)."""
    order = np.lexsort((np.arange(row.shape[0]), -row))
    before = np.concatenate(([0.0], np.cumsum(row[order])[:-1]))
    head = np.zeros(row.shape[0], dtype=bool)
    head[order[before < 0.5]] = True
    tail = np.zeros(row.shape[0], dtype=bool)
    tail[order[before >= 0.9]] = True
    return head, tail & (row > 0)


def _draft_at_positions(
    calls: Sequence[DraftCall], sequence: Sequence[int], start: int
) -> dict[int, tuple[int, np.ndarray | None]]:
    """Sequence position -> the suite's draft token there (and its declared q row, None: one-hot), for
    positions whose earlier draft tokens in the same call were all emitted."""
    out: dict[int, tuple[int, np.ndarray | None]] = {}
    for call in calls:
        c = call.context_length
        for m, token in enumerate(call.draft):
            position = c + m
            if position >= len(sequence) or position < start:
                break
            out[position] = (int(token), call.q0 if m == 0 else None)
            if sequence[position] != token:
                break
    return out


def _last_draft_positions(calls: Sequence[DraftCall], sequence: Sequence[int]) -> set[int]:
    """Sequence positions of each call's last draft token (drafts of two or more), where every earlier draft
    token of the call was emitted and the output reaches that position."""
    out: set[int] = set()
    for call in calls:
        c, n = call.context_length, len(call.draft)
        if n >= 2 and c + n - 1 < len(sequence) and list(sequence[c : c + n - 1]) == list(call.draft[:-1]):
            out.add(c + n - 1)
    return out


def new_config(name: str, *, scheme: str | None, drafts: str, alpha: float) -> SampledConfig:
    """A configuration whose event tests and all-token PIT test are each given ``alpha``."""
    events = [e for e in EVENTS if drafts != "own" or e not in ("draft", "replacement", "last")]
    return SampledConfig(
        name=name,
        scheme=scheme,
        drafts=drafts,
        tests={e: EventTest(name=f"{name}: {e}", summary=EVENTS[e], alpha=alpha) for e in events},
        pit=PitTest(name=f"{name}: pit", alpha=alpha),
    )


def run_config(
    config: SampledConfig,
    generate: Generate,
    *,
    make_reference: Callable[[], Target],
    suite_drafter: SuiteSamplingDrafter | None,
    prompts: list[list[int]],
    params: SamplingParams,
    max_new_tokens: int,
    budget: int,
    seeded: bool,
    chain: bool = True,
    first_seed: int = 0,
) -> None:
    """Draw ``budget`` seeded generations (fewer only when a test rejects, a generation raises or emits an id
    that is not a token); then the seed tests' runs: for a ``seeded`` engine (every configuration), a few of
    the seeds again (after the others, so a shared or continuing stream shows, the drafter's included), and
    with ``chain`` a chain of short generations on one prompt (different seeds, independent outputs)."""
    oracle = make_reference()  # one copy per configuration, reset before each scoring forward
    drawn = 0
    while drawn < budget:
        seed = first_seed + drawn
        prompt = prompts[drawn % len(prompts)]
        # every other generation after the first pass stops at an EOS its prompt's earlier drafts kept
        eos = eos_for(config, prompt) if drawn >= len(prompts) and drawn % 2 else None
        run = _one(config, generate, suite_drafter, prompt, seed, params, max_new_tokens, eos=eos)
        run = score(oracle, run, params)
        config.runs.append(run)
        add_events(config, run)
        count_reach(config, run)
        drawn += 1
        # the whole budget is spent unless a test rejects: stopping once the profile's sensitivity is reached
        # would leave deviations just under it to chance; every test's bound holds under this stopping rule
        if run.error is not None or run.bad_token is not None or config.rejected:
            break
    prompt = prompts[min(1, len(prompts) - 1)]
    hung = any(timed_out(r.error) for r in config.runs)  # (asked again, a hung engine waits as long again)
    for i in range(CHAIN_LENGTH if chain and not hung else 0):
        run = _one(config, generate, suite_drafter, prompt, first_seed + budget + i, params, CHAIN_TOKENS)
        config.chain.append(score(oracle, run, params))
        if timed_out(run.error):
            hung = True
            break
    if seeded and not hung:
        for first in config.runs[: min(4, len(config.runs))]:
            if first.generation is None:
                continue
            again = _one(
                config, generate, suite_drafter, list(first.prompt), first.seed, params, max_new_tokens, eos=first.eos
            )
            config.repeats.append((first, again))


def _one(
    config: SampledConfig,
    generate: Generate,
    suite_drafter: SuiteSamplingDrafter | None,
    prompt: list[int],
    seed: int,
    params: SamplingParams,
    max_new_tokens: int,
    *,
    eos: int | None = None,
) -> SampledRun:
    if suite_drafter is not None:
        suite_drafter.calls = []
    try:
        with waiting(f"a sampled generation ({config.name}, seed {seed})"):
            gen = generate(list(prompt), max_new_tokens, params.with_seed(seed), eos)
        error = None
    except Exception as exc:  # a generation that raised fails the checks that needed it, with the cause
        gen, error = None, f"{type(exc).__name__}: {exc}"
    if gen is not None and not isinstance(gen, Generation):
        gen, error = None, f"generate returned {type(gen).__name__}, not a specproof.engine.Generation"
    calls = tuple(suite_drafter.calls) if suite_drafter is not None else ()
    return SampledRun(
        config=config.name,
        prompt=tuple(prompt),
        seed=seed,
        max_new_tokens=max_new_tokens,
        generation=gen,
        error=error,
        calls=calls,
        eos=eos,
    )


def eos_for(config: SampledConfig, prompt: Sequence[int]) -> int | None:
    """An EOS id for a generation on ``prompt``: the token most often kept *inside* a drafted block by the
    configuration's earlier generations on it (a kept draft token is always followed by another token of its
    round, so stopping there cuts a block short); from the engine's own steps when the suite did not draft,
    else its most frequent token. None before any generation on ``prompt`` completed."""
    kept: Counter[int] = Counter()
    emitted: Counter[int] = Counter()
    for run in config.runs:
        gen = run.generation
        if gen is None or run.prompt != tuple(prompt) or run.bad_token is not None:
            continue
        sequence = [*run.prompt, *gen.tokens]
        emitted.update(gen.tokens)
        for call in run.calls:
            for m, token in enumerate(call.draft):
                at = call.context_length + m
                if at + 1 >= len(sequence) or sequence[at] != token:
                    break
                kept[token] += 1
        if not run.calls:
            kept.update(t for step in gen.steps or () for t in step.accepted[:-1])
    found = (kept or emitted).most_common(1)
    return int(found[0][0]) if found else None


def engine_samples(engine: object) -> tuple[bool, bool]:
    """(samples, seeded) for a plug-in engine (docs/contract.md, "Sampling"): it samples when it declares
    the capability ``sampling`` or its ``generate`` takes a ``sampling`` keyword; it is seeded when it
    declares ``seeded`` or has ``seeded = True``."""
    declared = declared_capabilities(engine)
    if declared is not None:
        return "sampling" in declared, "seeded" in declared
    try:
        takes = "sampling" in inspect.signature(engine.generate).parameters  # type: ignore[attr-defined]
    except (TypeError, ValueError, AttributeError):
        takes = False
    return takes, takes and getattr(engine, "seeded", False) is True


def run_sampled_search(
    case: Any,
    *,
    target: Any,
    drafter_subject: Any,
    params: SamplingParams,
    profile: Any,
    seed: int,
    alpha: float,
) -> SampledSearch:
    """The sampled search of one engine case (``EngineCase``) at ``params``; see the module docstring."""
    if case.kind == "builtin":
        make_reference = target.make
        samples, seeded = True, True
    else:
        make_reference = case.make_reference
        samples, seeded = engine_samples(case.engine)
    search = SampledSearch(params=params, configs=[], seeded=seeded, engine=case.name)
    if not samples:
        search.why_not = "the engine does not declare the capability `sampling` (docs/contract.md, Sampling)"
        return search
    if make_reference is None:
        search.why_not = "sampled output is scored against p, which needs a model (`oracle` or `target`), not greedy()"
        return search
    plans = _configurations(case, drafter_subject)
    alpha_each = alpha / (len(plans) * TESTS_PER_CONFIGURATION)
    longest = max(1, min(profile.max_prompt, (case.capacity or case.max_context or 64) - profile.max_new_tokens - 1))
    prompts = sample_prompts(case.vocab_size, longest=longest, seed=seed)
    # derandomized (seed 0): generation seeds 0, 1, ...; a --seed moves them all (runs with other seeds)
    first_seed = 0 if seed == 0 else int(np.random.default_rng([seed, 29]).integers(0, 2**40))
    for name, scheme, drafts in plans:
        config = new_config(name, scheme=scheme, drafts=drafts, alpha=alpha_each)
        suite = (
            SuiteSamplingDrafter(make_reference(), sampled=drafts == "suite-sampled", params=params)
            if drafts != "own"
            else None
        )
        generate = _generator(case, target, drafter_subject, scheme, suite)
        run_config(
            config,
            generate,
            make_reference=make_reference,
            suite_drafter=suite,
            prompts=prompts,
            params=params,
            max_new_tokens=profile.max_new_tokens,
            budget=profile.sampling_generations,
            seeded=seeded,
            # the chain on the first configuration and on a drafter not the suite's (its own seeding)
            chain=not search.configs or drafts == "own",
            first_seed=first_seed,
        )
        search.configs.append(config)
        if any(timed_out(r.error) for r in config.runs):
            break  # a hung engine: the checks fail on its timeout, not after one more per configuration
        if scheme is not None or config is search.configs[0]:
            _greedy_limit_runs(search, generate, prompts, params, profile.max_new_tokens, suite, name)
    return search


def _configurations(case: Any, drafter_subject: Any) -> list[tuple[str, str | None, str]]:
    """(name, scheme, drafts) of each configuration the case is searched in."""
    from specproof.contract.sampling import SAMPLING_SCHEMES

    out: list[tuple[str, str | None, str]]
    if case.kind == "builtin":
        out = [(f"{s}/suite-drafts", s, "suite") for s in SAMPLING_SCHEMES]
        # sampled drafts test acceptance against q; sample-and-match never reads q
        out.append(("rejection/suite-sampled-drafts", "rejection", "suite-sampled"))
        if drafter_subject is not None and callable(getattr(drafter_subject.make(), "propose_sampled", None)):
            out.append(("rejection/own-drafts", "rejection", "own"))
        return out
    if not case.takes_drafter:
        return [("own-drafts", None, "own")]
    out = [("suite-drafts", None, "suite")]
    # the rule it samples by: ``sampling_scheme`` (a plug-in), else ``scheme`` (a wire engine's default)
    scheme = getattr(case.engine, "sampling_scheme", None) or getattr(case.engine, "scheme", None)
    if scheme in SAMPLING_SCHEMES:  # the draft event under a declared q depends on the scheme
        out.append(("suite-sampled-drafts", scheme, "suite-sampled"))
    return out


def _generator(
    case: Any, target: Any, drafter_subject: Any, scheme: str | None, suite: SuiteSamplingDrafter | None
) -> Generate:
    """``generate(prompt, n, params, eos)`` for one configuration of the case."""
    if case.kind == "builtin":
        drafter = suite if suite is not None else drafter_subject.make()
        decoder = SpecDecoder(
            target.make(),
            drafter,
            k=case.k or 4,
            rollback=case.rollback,
            scheme=scheme,  # type: ignore[arg-type]
        )
        return lambda prompt, n, params, eos: decoder.generate(prompt, n, sampling=params, eos_token_id=eos)
    engine = case.make_engine() if case.make_engine is not None else case.engine
    if suite is not None:
        engine.drafter = suite
    return lambda prompt, n, params, eos: (
        engine.generate(prompt, n, sampling=params)
        if eos is None
        else engine.generate(prompt, n, sampling=params, eos_token_id=eos)
    )


def _greedy_limit_runs(
    search: SampledSearch,
    generate: Generate,
    prompts: list[list[int]],
    params: SamplingParams,
    max_new_tokens: int,
    suite: SuiteSamplingDrafter | None,
    name: str,
) -> None:
    """Generations at ``temperature=0`` and at ``top_k=1`` (both greedy by the contract's p)."""
    limits = {
        "temperature=0": SamplingParams(temperature=0.0),
        f"top_k=1 at temperature={params.temperature:g}": attrs.evolve(params, top_k=1, top_p=1.0, min_p=0.0),
    }
    config = SampledConfig(name=name, scheme=None, drafts="suite" if suite else "own", tests={})
    if suite is not None and callable(suite.propose_sampled):
        return  # the greedy limit is run on the deterministic-drafts configurations
    for label, limit in limits.items():
        for i, prompt in enumerate(prompts[1:2]):  # one prompt of 3 tokens per limit and scheme
            run = _one(config, generate, suite, prompt, 1000 + i, limit, max_new_tokens)
            search.greedy_runs.append((f"{name}, {label}", run))
