"""Token trees beside chains (docs/bench.md, "Trees"): what a tree buys per round, and what it costs here.

Off by default (``config.trees``; ``specproof bench --trees``): the default bench gate does not pay for it.
For each of ``config.tree_drafters`` (the EAGLE-3 head and the draft model) and each variant, the chain
(``propose(context, k)``, k = ``TREE_DEPTH``) and the trees of ``config.tree_shapes`` (``TopKTreeDrafter``,
depth at most ``TREE_DEPTH``):

- **real contexts** (teacher-forced, greedy, counted): at every real-context position (``_real``'s held-out
  texts), the accepted root path against the target's greedy continuation, the greedy tree rule; tokens
  per round is the mean of ``accepted + 1``, beside the physical limit ``depth + 1`` and the mean nodes
  verified per round;
- **decoding** (timed, reported only): ``config.tree_tokens`` new tokens after each workload's prompt by
  ``TreeSpecDecoder`` (the chain: ``SpecDecoder``, and the chain declared as a tree, ``1x1x1x1``, which
  isolates the tree verify's cost), against plain greedy, by the process' CPU time; tokens per round,
  ``lossless`` (the tokens equal plain greedy's).

The reference target verifies a tree node by node (``forward_tree``: each node one one-token forward, the
correctness reference, not a kernel), so a tree of N nodes costs about N token-forwards where a chain of k
costs one k + 1-token forward: the CPU speedup here shows the fixture's cost model, not a device's, where
a tree verify is one forward with a tree mask. ``sampled``: the same drafters and variants sampled at
T = 0.7 (``_tree_sampled``: the drafters' sampled trees, the engine's sampled tree rule).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from specproof.bench._config import BenchConfig
from specproof.bench._protocol import BenchRun
from specproof.bench._real import RealContextText, greedy_continuations, real_context_texts
from specproof.bench._tree_sampled import SAMPLED_TREE_TEMPERATURE, sampled_decode_cells, sampled_real_cells
from specproof.bench._workloads import encode_text
from specproof.contract import Target
from specproof.contract.errors import InvalidSettingError
from specproof.contract.tree import MAX_TREE_NODES, TreeDraft, chain_tree
from specproof.engine import SpecDecoder, TreeSpecDecoder, greedy_decode
from specproof.engine.drafters.trees import TopKTreeDrafter
from specproof.plugins import drafter_factory

__all__ = ["TREE_DEPTH", "TreeFigures", "tree_accepted"]

TREE_DEPTH: Final = 4
"""The chain's k and the deepest tree: every variant's physical limit is at most ``TREE_DEPTH + 1``."""
CHAIN: Final = "chain"
CHAIN_AS_TREE: Final = "1x1x1x1"


def tree_accepted(tree: TreeDraft, greedy: Sequence[int]) -> int:
    """The greedy tree rule against a known greedy continuation: the deepest node whose root path is a prefix
    of ``greedy`` (each node equal to greedy's token at its depth, its parent matched)."""
    matched = [False] * len(tree)
    best = 0
    for i, (token, parent) in enumerate(zip(tree.tokens, tree.parents, strict=True)):
        depth = tree.depths[i]
        if (parent < 0 or matched[parent]) and depth <= len(greedy) and token == greedy[depth - 1]:
            matched[i] = True
            best = max(best, depth)
    return best


@attrs.frozen
class TreeFigures:
    """The result's ``trees`` (absent unless ``config.trees``)."""

    def steps(self, config: BenchConfig) -> int:
        return 4 * len(config.tree_drafters) if config.trees else 0

    def measure(self, run: BenchRun) -> Mapping[str, Any]:
        config = run.config
        if not config.trees:
            return {}
        target = run.pair(config.target)[0]
        if not callable(getattr(target, "forward_tree", None)):
            reason = f"the bench target {config.target!r} has no forward_tree (trees verify on the reference family)"
            return {"trees": {"status": "skip", "reason": reason}}
        out: dict[str, Any] = {
            "status": "ok",
            "target": config.target,
            "depth": TREE_DEPTH,
            "shapes": list(config.tree_shapes),
            "drafters": list(config.tree_drafters),
        }
        texts = _texts(config)
        out["real_contexts"] = _real_cells(run, target, texts)
        out["decoding"] = _decode_cells(run)
        out["sampled"] = _sampled_cells(run, target, texts)
        return {"trees": out}


def _variants(config: BenchConfig, *, chain_as_tree: bool) -> list[str]:
    return [CHAIN, *([CHAIN_AS_TREE] if chain_as_tree else []), *config.tree_shapes]


def _propose(drafter: Any, variant: str, context: list[int]) -> TreeDraft:
    if variant == CHAIN:
        return chain_tree([int(t) for t in drafter.propose(context, TREE_DEPTH)][:TREE_DEPTH])
    tree: TreeDraft = drafter.propose_tree(context, max_nodes=MAX_TREE_NODES, max_depth=TREE_DEPTH)
    return tree


def _make(spec: str, variant: str) -> Any:
    chain = drafter_factory(spec)()
    return chain if variant == CHAIN else TopKTreeDrafter(chain, variant)  # type: ignore[arg-type]


def _texts(config: BenchConfig) -> list[RealContextText] | str:
    """The real-context texts, or why there are none."""
    if not config.real_files:
        return "no real-context files asked for (real_files is 0)"
    try:
        return real_context_texts(
            files=config.real_files,
            text_tokens=config.real_tokens,
            stride=config.real_stride,
            min_prefix=config.real_min_prefix,
        )
    except InvalidSettingError as exc:
        return str(exc)


def _sampled_cells(run: BenchRun, target: Target, texts: list[RealContextText] | str) -> dict[str, Any]:
    """``trees.sampled``: the sampled figures (``_tree_sampled``) of the same drafters and variants."""
    config = run.config
    variants = _variants(config, chain_as_tree=False)
    if isinstance(texts, str):
        real: dict[str, Any] = {"status": "skip", "reason": texts}
    else:
        real = sampled_real_cells(config.tree_drafters, variants, _make, target, texts, depth=TREE_DEPTH, tick=run.tick)
    spec_target = run.pair(config.target)[1]
    prompts = [(w.name, encode_text(spec_target, w.text)) for w in run.workloads]
    decoding = sampled_decode_cells(
        config.tree_drafters,
        variants,
        _make,
        spec_target,
        prompts,
        tokens=config.tree_tokens,
        depth=TREE_DEPTH,
        tick=run.tick,
    )
    return {"status": "ok", "temperature": SAMPLED_TREE_TEMPERATURE, "real_contexts": real, "decoding": decoding}


def _real_cells(run: BenchRun, target: Target, texts: list[RealContextText] | str) -> dict[str, Any]:
    config = run.config
    if isinstance(texts, str):
        return {"status": "skip", "reason": texts}
    conts = [greedy_continuations(target, text, TREE_DEPTH) for text in texts]
    cells = []
    for spec in config.tree_drafters:
        for variant in _variants(config, chain_as_tree=False):
            cells.append(_real_cell(spec, variant, texts, conts))
        run.tick(f"trees: real contexts, {spec}")
    return {
        "status": "ok",
        "method": "teacher-forced: at each real-context position the target's greedy continuation against each "
        "variant's tree (the chain: k tokens), the deepest matching root path accepted",
        "positions": sum(len(t.positions) for t in texts),
        "cells": cells,
    }


def _real_cell(
    spec: str, variant: str, texts: Sequence[RealContextText], conts: Sequence[Sequence[Sequence[int]]]
) -> dict[str, Any]:
    drafter = _make(spec, variant)
    rounds = accepted = nodes = 0
    depth = 0
    for text, cont in zip(texts, conts, strict=True):
        drafter.reset()
        for p, greedy in zip(text.positions, cont, strict=True):
            tree = _propose(drafter, variant, list(text.tokens[:p]))
            accepted += tree_accepted(tree, greedy)
            nodes += len(tree)
            depth = max(depth, tree.depth)
            rounds += 1
    return {
        "drafter": spec,
        "shape": variant,
        "positions": rounds,
        "tokens_per_round": (accepted + rounds) / rounds if rounds else 0.0,
        "nodes_per_round": nodes / rounds if rounds else 0.0,
        "depth": depth,
        "limit": depth + 1,
    }


def _decode_cells(run: BenchRun) -> dict[str, Any]:
    config = run.config
    greedy_target, spec_target = run.pair(config.target)  # every decoder resets its target first
    prompts = [(w.name, encode_text(greedy_target, w.text)) for w in run.workloads]
    plain = {}
    for name, prompt in prompts:
        t0 = time.process_time()
        tokens = greedy_decode(greedy_target, prompt, config.tree_tokens).tokens
        plain[name] = (list(tokens), time.process_time() - t0)
    cells = []
    for spec in config.tree_drafters:
        for variant in _variants(config, chain_as_tree=True):
            cells.append(_decode_cell(spec, variant, spec_target, prompts, plain, config.tree_tokens))
        run.tick(f"trees: decoding, {spec}")
    greedy_cpu = sum(s for _, s in plain.values())
    return {
        "status": "ok",
        "method": f"{config.tree_tokens} new tokens after each workload's prompt, CPU time of the process against "
        "plain greedy (prefill included on both sides); the chain is SpecDecoder (checkpoint), the trees "
        "TreeSpecDecoder (checkpoint)",
        "tokens": config.tree_tokens,
        "greedy_cpu_s": greedy_cpu,
        "cells": cells,
    }


def _decode_cell(
    spec: str,
    variant: str,
    target: Target,
    prompts: Sequence[tuple[str, list[int]]],
    plain: Mapping[str, tuple[list[int], float]],
    tokens: int,
) -> dict[str, Any]:
    emitted = rounds = 0
    cpu = greedy_cpu = 0.0
    lossless = True
    for name, prompt in prompts:
        drafter = _make(spec, variant)
        decoder: Any
        if variant == CHAIN:
            decoder = SpecDecoder(target, drafter, k=TREE_DEPTH, rollback="checkpoint")  # type: ignore[arg-type]
        else:
            decoder = TreeSpecDecoder(target, drafter, max_nodes=MAX_TREE_NODES, max_depth=TREE_DEPTH)
        t0 = time.process_time()
        generation = decoder.generate(prompt, tokens)
        cpu += time.process_time() - t0
        want, greedy_s = plain[name]
        greedy_cpu += greedy_s
        lossless = lossless and list(generation.tokens) == want
        emitted += generation.stats.emitted
        rounds += generation.stats.rounds
    return {
        "drafter": spec,
        "shape": variant,
        "tokens_per_round": emitted / rounds if rounds else 0.0,
        "cpu_s": cpu,
        "cpu_speedup": greedy_cpu / cpu if cpu else 0.0,
        "lossless": lossless,
    }
