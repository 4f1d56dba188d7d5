"""The sampled tree search of a tree engine: seeded sampled generations with the suite's tree drafts, each
emitted token scored against the oracle's ``p`` (docs/contract.md, "Sampled trees"). A ``DraftSource`` names
who drafts and which events are scored: ``SUITE_TREES`` (below, the default) or a real sampled tree drafter
(``_tree_drafter_runs``).

The suite drafts with ``SuiteTreeSampler``: deterministic trees (a function of the context, so each node's
``q`` is one-hot) read off the oracle model: two or three siblings of mixed rank (the top token first or
not, a duplicate sibling), a subtree under a first or a later sibling, up to three levels. Under any lossless
tree rule the token at a position where the emitted path sits at a tree node is drawn from ``p`` given the
past, so two events there have known probabilities: "the token is the first child's" (``p(first)``, scored
where the node's children carry two or more distinct tokens) and "the token is some child's" (``p`` of the
children's distinct tokens). They are ``_sequential`` event tests
(Freedman); every emitted token also goes to the all-token PIT test (``_pit``, DKW-Massart). A scheme that
lets a later sibling override a kept one moves mass from the first child to later ones; one that does not
update the residual after a rejection puts too much on the children (and the first).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from specproof.conformance._pit import PitTest, pit_values
from specproof.conformance._sampled_runs import sample_prompts
from specproof.conformance._sequential import EventTest
from specproof.conformance._waiting import waiting
from specproof.conformance.checks.generation import token_id_problem
from specproof.contract import Generation
from specproof.contract.sampling import SamplingParams, processed_distribution
from specproof.contract.tree import TreeDraft

__all__ = [
    "SUITE_TREES",
    "TREE_EVENTS",
    "DraftSource",
    "SuiteTreeSampler",
    "TreeSampledSearch",
    "run_tree_sampled_search",
]

TREE_EVENTS: dict[str, str] = {
    "first": "where the emitted path is at a node of the suite's tree with two or more distinct child tokens, "
    "the token is its first child's (probability p(first child))",
    "children": "where the emitted path is at a node of the suite's tree, the token is one of its children's "
    "(probability p of their distinct tokens)",
}
MAX_NODES = 10
MAX_DEPTH = 3
# (ranks of the roots, index of the root that gets children, ranks of its children): mixed ranks, a subtree
# under a later sibling, a duplicate root (rank 0 twice: the twin's residual mass is 0)
_SHAPES: tuple[tuple[tuple[int, ...], int, tuple[int, ...]], ...] = (
    ((0, 1), 0, (0, 1)),
    ((1, 0, 2), 1, (0,)),
    ((0, 0, 1), 1, (1, 0)),
    ((2, 1), 0, (0, 2)),
)


class SuiteTreeSampler:
    """Deterministic trees read off the oracle model; logs each call's ``(context length, tree)``."""

    name = "specproof.SuiteTreeSampler"

    def __init__(self, model: Any) -> None:
        self.model = model
        self.calls: list[tuple[int, TreeDraft]] = []
        self._fed: list[int] = []  # what the model holds: it catches up on a context that extends it
        self._last: np.ndarray | None = None  # its row after ``_fed``

    def reset(self) -> None:
        self.calls = []

    def _row_after(self, context: Sequence[int]) -> np.ndarray:
        n = len(self._fed)
        if len(context) < n or list(context[:n]) != self._fed or (len(context) == n and self._last is None):
            self.model.reset()
            self._fed, n = [], 0
        if len(context) > n:
            self._last = np.asarray(self.model.forward(list(context[n:])), dtype=np.float64)[-1]
            self._fed = [int(t) for t in context]
        assert self._last is not None
        return self._last

    def _rows_below(self, path: Sequence[int]) -> list[np.ndarray]:
        """The rows after the context followed by each prefix of ``path`` (the model left as it was)."""
        snap = self.model.snapshot()
        try:
            return [np.asarray(self.model.forward([int(t)]), dtype=np.float64)[-1] for t in path]
        finally:
            self.model.restore(snap)

    def propose_tree(self, context: Sequence[int], *, max_nodes: int, max_depth: int) -> TreeDraft:
        n = len(context)
        roots, under, kids = _SHAPES[(n * 31 + int(context[-1]) * 7) % len(_SHAPES)]
        tokens: list[int] = []
        parents: list[int] = []
        if max_depth >= 1 and max_nodes >= 1:
            ranked = _ranked(self._row_after(context))
            for rank in roots[:max_nodes]:
                tokens.append(ranked[rank])
                parents.append(-1)
            if max_depth >= 2 and under < len(tokens) and len(tokens) < max_nodes:
                kid_row = self._rows_below([tokens[under]])[0]
                kid_ranked = _ranked(kid_row)
                for rank in kids[: max_nodes - len(tokens)]:
                    tokens.append(kid_ranked[rank])
                    parents.append(under)
                first_kid = len(roots)  # a grandchild under the first child: a third level
                if max_depth >= 3 and first_kid < len(tokens) < max_nodes:
                    grand_row = self._rows_below([tokens[under], tokens[first_kid]])[1]
                    tokens.append(_ranked(grand_row)[0])
                    parents.append(first_kid)
        tree = TreeDraft(tuple(tokens), tuple(parents))
        self.calls.append((n, tree))
        return tree


def _ranked(row: np.ndarray) -> list[int]:
    """Token ids by logit, the lower id first among equals."""
    return [int(t) for t in np.lexsort((np.arange(row.shape[0]), -row))]


@attrs.define
class TreeSampledRun:
    prompt: tuple[int, ...]
    seed: int
    generation: Generation | None
    error: str | None = None


@attrs.define
class TreeSampledSearch:
    """Every generation of the search and the tests they fed; ``why_not``: why none ran."""

    params: SamplingParams
    alpha: float
    configuration: str = "rejection/suite-tree-drafts"
    runs: list[TreeSampledRun] = attrs.Factory(list)
    tests: dict[str, EventTest] = attrs.Factory(dict)
    pit: PitTest | None = None
    why_not: str | None = None

    @property
    def rejected(self) -> bool:
        return any(t.rejected for t in self.tests.values()) or (self.pit is not None and self.pit.rejected)

    @property
    def tokens(self) -> int:
        return sum(len(r.generation.tokens) for r in self.runs if r.generation is not None)


@attrs.frozen
class DraftSource:
    """Who drafts a search's trees and what it scores: ``make(oracle factory)`` gives the drafter (its
    ``calls`` logged), ``events`` name the event tests, ``score(search, p, prompt, tokens, calls)`` feeds them
    from one generation (``p``: the oracle's rows for the emitted tokens, the PIT is fed apart)."""

    configuration: str
    events: Mapping[str, str]
    make: Callable[[Callable[[], Any]], Any]
    score: Callable[[TreeSampledSearch, np.ndarray, Sequence[int], list[int], Sequence[Any]], None]


def run_tree_sampled_search(
    make_decoder: Callable[[Any, Any, int, int], Any],
    make_reference: Callable[[], Any],
    *,
    params: SamplingParams,
    generations: int,
    max_new_tokens: int,
    longest_prompt: int,
    seed: int,
    alpha: float,
    source: DraftSource | None = None,
) -> TreeSampledSearch:
    """Draw ``generations`` seeded sampled generations (fewer only at the first rejection or failure), the
    trees from ``source`` (the suite's deterministic trees by default)."""
    source = SUITE_TREES if source is None else source
    search = TreeSampledSearch(params=params, alpha=alpha, configuration=source.configuration)
    each = alpha / (len(source.events) + 1)  # the events and the PIT: the bound split evenly over them
    search.tests = {e: EventTest(name=f"tree: {e}", summary=s, alpha=each) for e, s in source.events.items()}
    search.pit = PitTest(name="tree: pit", alpha=each)
    drafter = source.make(make_reference)
    oracle = make_reference()
    vocab = int(oracle.vocab_size)
    decoder = make_decoder(None, drafter, MAX_NODES, MAX_DEPTH)
    refused = getattr(decoder, "no_sampling_reason", None)  # a wire engine without sampled_trees says why
    if isinstance(refused, str):
        search.why_not = refused
        return search
    try:
        takes = "sampling" in inspect.signature(decoder.generate).parameters
    except (TypeError, ValueError, AttributeError):
        takes = False
    if not takes:
        search.why_not = "the engine's tree decoder does not sample: its generate takes no sampling= (Sampled trees)"
        return search
    prompts = sample_prompts(vocab, longest=longest_prompt, seed=seed)
    first_seed = 0 if seed == 0 else int(np.random.default_rng([seed, 37]).integers(0, 2**40))
    for i in range(generations):
        prompt, run_seed = prompts[i % len(prompts)], first_seed + i
        error: str | None = None
        try:
            with waiting(f"a sampled tree generation (seed {run_seed})"):
                gen = decoder.generate(list(prompt), max_new_tokens, sampling=params.with_seed(run_seed))
            if not isinstance(gen, Generation):
                gen, error = None, f"generate returned {type(gen).__name__}, not a specproof.engine.Generation"
            else:
                bad = token_id_problem(gen.tokens, vocab)
                if bad is not None:
                    error = f"an emitted id is not a token: {bad[2]}"
        except Exception as exc:  # a generation that raised fails the check, with the cause
            gen, error = None, f"{type(exc).__name__}: {exc}"
        search.runs.append(TreeSampledRun(prompt=tuple(prompt), seed=run_seed, generation=gen, error=error))
        if error is not None or gen is None:
            break
        _score(search, oracle, prompt, list(gen.tokens), getattr(drafter, "calls", ()), run_seed, source)
        if search.rejected:
            break
    return search


def _score(
    search: TreeSampledSearch,
    oracle: Any,
    prompt: Sequence[int],
    tokens: list[int],
    calls: Sequence[Any],
    seed: int,
    source: DraftSource,
) -> None:
    """Score one generation: its tokens' PIT, and the source's events."""
    if not tokens:
        return
    oracle.reset()
    rows = np.asarray(oracle.forward([*prompt, *tokens[:-1]]), dtype=np.float64)[len(prompt) - 1 :]
    p = processed_distribution(rows, search.params)
    assert search.pit is not None
    search.pit.add(pit_values(p, tokens, seed=seed))
    source.score(search, p, prompt, tokens, calls)


def _score_suite_trees(
    search: TreeSampledSearch,
    p: np.ndarray,
    prompt: Sequence[int],
    tokens: list[int],
    calls: Sequence[tuple[int, TreeDraft]],
) -> None:
    """The two events at each position where the emitted path sits at a node of a tree the suite drafted."""
    sequence = [*prompt, *tokens]
    for start, tree in calls:
        node, position = -1, start
        while position < len(sequence):
            kids = tree.children(node)
            if not kids:
                break
            row, token = p[position - len(prompt)], sequence[position]
            first = tree.tokens[kids[0]]
            distinct = {tree.tokens[k] for k in kids}
            if len(distinct) > 1:  # a lone child's event is the children event: scored once, there
                search.tests["first"].add(token == first, row[first])
            search.tests["children"].add(token in distinct, float(sum(row[t] for t in distinct)))
            node = next((k for k in kids if tree.tokens[k] == token), -2)
            if node == -2:  # the token is no child's: the round ended at this node
                break
            position += 1


SUITE_TREES = DraftSource(
    configuration="rejection/suite-tree-drafts",
    events=TREE_EVENTS,
    make=lambda make_reference: SuiteTreeSampler(make_reference()),
    score=_score_suite_trees,
)
"""The default source: the suite's deterministic trees (``SuiteTreeSampler``), scored on ``TREE_EVENTS``."""
