"""Sampled token trees beside sampled chains at T = 0.7 (docs/bench.md, "Trees", "Sampled"): the ``trees.sampled``
field of ``specproof bench --trees``.

The trees are the drafters' sampled ones (``TopKTreeDrafter.propose_tree_sampled``: children drawn without
replacement from the drafter's ``q`` at ``temperature=0.7``, each node's row declared), the chain the
drafter's ``propose_sampled`` (k = ``TREE_DEPTH``), verified by the engine's own sampled tree rule
(``specproof.engine.sampling.sampled_tree_accept``, recursive rejection over siblings; on a chain it is
rejection sampling). Two figures, as the greedy ones:

- **real contexts** (counted; the same on every machine for a given seed): at every real-context position,
  one sampled tree (generator ``[SEED, text, seed]``, made afresh for each cell), verified by one
  ``forward_tree`` from the position's snapshot: tokens per round (the mean of ``accepted + 1``) beside the
  limit ``depth + 1``, nodes per round, and acceptance by depth (of the rounds whose path reached depth
  ``d - 1``, the share that kept a node at depth ``d``);
- **decoding** (timed, reported only): ``config.tree_tokens`` sampled tokens after each workload's prompt
  (seed ``SEED``) by ``TreeSpecDecoder`` (the chain: ``SpecDecoder``, rejection), tokens per round and the
  CPU time against plain sampling (the tree decoder with no draft: one target forward per token). Sampled
  outputs differ token by token from plain sampling's (another random stream), so no cell claims
  ``lossless``: ``tree.sampled-distribution`` certifies the distribution.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import numpy as np

from specproof.bench._real import RealContextText
from specproof.contract import Target
from specproof.contract.sampled_tree import SampledTreeDraft
from specproof.contract.sampling import SamplingParams
from specproof.contract.tree import MAX_TREE_NODES, TreeDraft, chain_tree
from specproof.engine import SpecDecoder, TreeSpecDecoder
from specproof.engine.sampling import sampled_tree_accept, target_distribution

__all__ = ["SAMPLED_TREE_TEMPERATURE", "SEED", "sampled_decode_cells", "sampled_real_cells"]

SAMPLED_TREE_TEMPERATURE: Final = 0.7
SEED: Final = 37  # the first entropy word of every generator here (issue 37)
CHAIN: Final = "chain"

MakeDrafter = Callable[[str, str], Any]  # (drafter spec, variant) -> a chain drafter or a TopKTreeDrafter


def _sampled_proposal(
    drafter: Any, variant: str, context: list[int], depth: int, params: SamplingParams, rng: np.random.Generator
) -> tuple[TreeDraft, np.ndarray]:
    """The variant's sampled tree (the chain: its sampled draft as a one-child-per-node tree) and its q rows."""
    if variant == CHAIN:
        got = drafter.propose_sampled(context, depth, sampling=params, rng=rng)
        tokens = [int(t) for t in got.tokens][:depth]
        return chain_tree(tokens), np.asarray(got.q, dtype=np.float64)[: len(tokens)]
    drawn: SampledTreeDraft = drafter.propose_tree_sampled(
        context, max_nodes=MAX_TREE_NODES, max_depth=depth, sampling=params, rng=rng
    )
    return drawn.tree, np.asarray(drawn.q, dtype=np.float64)


def _verify(target: Target, pending: int, tree: TreeDraft, q: np.ndarray, params: SamplingParams, rng: Any) -> int:
    """How many draft tokens the sampled tree rule keeps, from the target's current state (left as it was)."""
    fed_parents = [-1, *(p + 1 if p >= 0 else 0 for p in tree.parents)]
    logits, _ = target.forward_tree([pending, *tree.tokens], fed_parents)  # type: ignore[attr-defined]
    p = np.stack([target_distribution(row, params) for row in np.asarray(logits, dtype=np.float64)])
    path, _ = sampled_tree_accept(tree, q, p, rng)
    return len(path)


def _real_cell(
    spec: str, variant: str, make: MakeDrafter, target: Target, texts: Sequence[RealContextText], depth: int
) -> dict[str, Any]:
    params = SamplingParams(temperature=SAMPLED_TREE_TEMPERATURE)
    drafter = make(spec, variant)
    reached = [0] * (depth + 1)  # reached[d]: rounds whose kept path has at least d nodes
    rounds = accepted = nodes = deepest = 0
    for index, text in enumerate(texts):
        rng = np.random.default_rng([SEED, index, 0])
        drafter.reset()
        target.reset()
        fed = 0
        for pos in text.positions:
            if pos - 1 > fed:  # the target holds text[:pos-1]; the prefix's last token is the verify's root
                target.forward(list(text.tokens[fed : pos - 1]))
                fed = pos - 1
            tree, q = _sampled_proposal(drafter, variant, list(text.tokens[:pos]), depth, params, rng)
            kept = _verify(target, int(text.tokens[pos - 1]), tree, q, params, rng)
            rounds += 1
            accepted += kept
            nodes += len(tree)
            deepest = max(deepest, tree.depth)
            for d in range(kept + 1):
                reached[d] += 1
    by_depth = [reached[d] / reached[d - 1] if reached[d - 1] else 0.0 for d in range(1, deepest + 1)]
    return {
        "drafter": spec,
        "shape": variant,
        "temperature": SAMPLED_TREE_TEMPERATURE,
        "positions": rounds,
        "tokens_per_round": (accepted + rounds) / rounds if rounds else 0.0,
        "nodes_per_round": nodes / rounds if rounds else 0.0,
        "acceptance_by_depth": by_depth,
        "depth": deepest,
        "limit": deepest + 1,
    }


def sampled_real_cells(
    drafters: Sequence[str],
    variants: Sequence[str],
    make: MakeDrafter,
    target: Target,
    texts: Sequence[RealContextText],
    *,
    depth: int,
    tick: Callable[[str], None],
) -> dict[str, Any]:
    """The counted figure: every drafter's variants at every real-context position, one sampled round each."""
    cells: list[dict[str, Any]] = []
    for spec in drafters:
        cells.extend(_real_cell(spec, variant, make, target, texts, depth) for variant in variants)
        tick(f"trees: sampled real contexts, {spec}")
    return {
        "status": "ok",
        "method": f"at each real-context position one tree drawn at temperature {SAMPLED_TREE_TEMPERATURE} "
        "(the chain: k tokens), verified by one forward_tree and the engine's sampled tree rule",
        "positions": sum(len(t.positions) for t in texts),
        "cells": cells,
    }


def _timed(decoder: Any, prompt: list[int], tokens: int, params: SamplingParams) -> tuple[Any, float]:
    t0 = time.process_time()
    generation = decoder.generate(prompt, tokens, sampling=params)
    return generation, time.process_time() - t0


def sampled_decode_cells(
    drafters: Sequence[str],
    variants: Sequence[str],
    make: MakeDrafter,
    target: Target,
    prompts: Sequence[tuple[str, list[int]]],
    *,
    tokens: int,
    depth: int,
    tick: Callable[[str], None],
) -> dict[str, Any]:
    """The timed figure: sampled decoding with every variant against plain sampling, by process CPU time."""
    params = SamplingParams(temperature=SAMPLED_TREE_TEMPERATURE, seed=SEED)
    plain = TreeSpecDecoder(target, _NoDraft(target.vocab_size), max_nodes=0, max_depth=0)
    plain_cpu = sum(_timed(plain, prompt, tokens, params)[1] for _, prompt in prompts)
    cells = []
    for spec in drafters:
        for variant in variants:
            emitted = rounds = 0
            cpu = 0.0
            for _, prompt in prompts:
                drafter = make(spec, variant)
                decoder: Any
                if variant == CHAIN:
                    decoder = SpecDecoder(target, drafter, k=depth, rollback="checkpoint")
                else:
                    decoder = TreeSpecDecoder(target, drafter, max_nodes=MAX_TREE_NODES, max_depth=depth)
                generation, spent = _timed(decoder, prompt, tokens, params)
                cpu += spent
                emitted += generation.stats.emitted
                rounds += generation.stats.rounds
            cells.append(
                {
                    "drafter": spec,
                    "shape": variant,
                    "temperature": SAMPLED_TREE_TEMPERATURE,
                    "tokens_per_round": emitted / rounds if rounds else 0.0,
                    "cpu_s": cpu,
                    "cpu_speedup": plain_cpu / cpu if cpu else 0.0,
                }
            )
        tick(f"trees: sampled decoding, {spec}")
    return {
        "status": "ok",
        "method": f"{tokens} tokens sampled at temperature {SAMPLED_TREE_TEMPERATURE} (seed {SEED}) after each "
        "workload's prompt, CPU time of the process against plain sampling (the tree decoder with no draft); "
        "the chain is SpecDecoder (rejection, checkpoint), the trees TreeSpecDecoder (checkpoint)",
        "tokens": tokens,
        "plain_cpu_s": plain_cpu,
        "cells": cells,
    }


class _NoDraft:
    """Plain sampling through the tree decoder: never a draft (every round one target forward, one token)."""

    name = "no draft"

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def propose_tree(self, context: Sequence[int], *, max_nodes: int, max_depth: int) -> TreeDraft:
        return TreeDraft((), ())
