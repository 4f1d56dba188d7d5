"""Tree drafters (docs/contract.md, "Trees"): shapes, budgets, the chain they extend, and lossless decoding."""

from __future__ import annotations

import itertools
from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specproof.contract.errors import InvalidSettingError
from specproof.contract.tree import TreeDraft
from specproof.engine import TreeSpecDecoder, greedy_decode
from specproof.engine.drafters import ModelDrafter, NgramDrafter
from specproof.engine.drafters.trees import NgramTreeDrafter, TopKTreeDrafter, TreeShape, parse_tree_shape
from specproof.engine.targets.reference import ReferenceConfig, ReferenceHybrid
from specproof.plugins import load_drafter

TARGET = ReferenceConfig(d_model=32, ffn_dim=64, vocab_size=64, max_context=64)
DRAFT = ReferenceConfig(d_model=16, ffn_dim=32, vocab_size=64, max_context=64, seed=7)
SHAPES = ("1x1x1", "2x2x2", "4-2-1", "dynamic:16", "dynamic:6,k=2")


def _model_tree_drafter(shape: str) -> TopKTreeDrafter:
    return TopKTreeDrafter(ModelDrafter(ReferenceHybrid(DRAFT)), shape)


@cache
def _head(kind: str) -> object:
    return load_drafter(f"{kind}:trained")


def test_shapes_parse_and_bad_ones_say_why() -> None:
    assert parse_tree_shape("2x2x2") == TreeShape(branching=(2, 2, 2))
    assert parse_tree_shape("4-2-1").nodes == 4 + 8 + 8
    assert parse_tree_shape("dynamic:16") == TreeShape(budget=16)
    assert parse_tree_shape("dynamic:16,k=2").top_k == 2
    assert str(parse_tree_shape("4-2-1")) == "4x2x1"
    for bad in ("", "2x", "dynamic", "dynamic:0", "0x2", "dynamic:65", "x" * 3):
        with pytest.raises(InvalidSettingError, match=r"tree shape|TreeShape"):
            parse_tree_shape(bad)
    with pytest.raises(InvalidSettingError, match="ModelDrafter or a HeadDrafter"):
        TopKTreeDrafter(NgramDrafter(), "2x2")  # type: ignore[arg-type]


@settings(max_examples=40, deadline=None)
@given(
    shape=st.sampled_from(SHAPES),
    context=st.lists(st.integers(0, 63), min_size=1, max_size=20),
    max_nodes=st.integers(0, 24),
    max_depth=st.integers(0, 6),
)
def test_a_model_tree_is_well_formed_within_the_budget(
    shape: str, context: list[int], max_nodes: int, max_depth: int
) -> None:
    tree = _model_tree_drafter(shape).propose_tree(context, max_nodes=max_nodes, max_depth=max_depth)
    assert isinstance(tree, TreeDraft)
    assert len(tree) <= max_nodes and tree.depth <= max_depth
    full = parse_tree_shape(shape)
    if max_nodes >= full.nodes and max_depth >= full.depth and not full.dynamic:
        assert len(tree) == full.nodes and tree.depth == full.depth
    if full.dynamic and max_depth:
        reachable = sum(full.top_k**d for d in range(1, max_depth + 1))
        assert len(tree) == min(full.budget, max_nodes, reachable)


def test_the_all_ones_shape_is_the_chain_along_a_decoding() -> None:
    """Driven as a decoder drives it (proposals, accepted prefixes, bonus tokens), the all-ones tree drafter
    proposes the chain a fresh drafter proposes, and its chain after a tree is a fresh drafter's too."""
    prompt = [5, 9, 2, 5, 9]
    continuation = greedy_decode(ReferenceHybrid(TARGET), prompt, 24).tokens
    drafter = _model_tree_drafter("1x1x1x1")
    for cut in range(len(prompt), len(prompt) + 24, 3):
        context = [*prompt, *continuation][:cut]
        fresh = ModelDrafter(ReferenceHybrid(DRAFT)).propose(context, 4)
        tree = drafter.propose_tree(context, max_nodes=8, max_depth=4)
        assert tree.is_chain and list(tree.tokens) == fresh
        assert drafter.propose(context, 4) == fresh


@pytest.mark.parametrize("kind", ["eagle", "mtp"])
def test_a_head_tree_extends_the_head_chain(kind: str) -> None:
    prompt = list(range(40, 64))
    for shape in ("1x1x1x1", "2x2x2", "dynamic:16"):
        chain = load_drafter(f"{kind}:trained").propose(prompt, 4)
        drafter = TopKTreeDrafter(load_drafter(f"{kind}:trained"), shape)  # type: ignore[arg-type]
        tree = drafter.propose_tree(prompt, max_nodes=16, max_depth=4)
        assert _first_path(tree) == chain[: len(_first_path(tree))] and _first_path(tree)
        assert drafter.propose(prompt, 4) == chain  # the tree left the head's slots as its chain needs


def _first_path(tree: TreeDraft) -> list[int]:
    """The tokens down the first child of every node: the argmax of each row, the chain."""
    out: list[int] = []
    children = tree.children(-1)
    while children:
        out.append(tree.tokens[children[0]])
        children = tree.children(children[0])
    return out


def _oracle_dynamic(context: list[int], budget: int, top_k: int, depth: int) -> set[tuple[int, ...]]:
    """EAGLE-2's tree by brute force: every path of top-k children to ``depth``, scored by a fresh draft
    model fed the context and the path, the ``budget`` best kept."""
    scored: dict[tuple[int, ...], float] = {}

    def row(path: tuple[int, ...]) -> np.ndarray:
        model = ReferenceHybrid(DRAFT)
        return np.asarray(model.forward([*context, *path])[-1], dtype=np.float64)

    frontier: list[tuple[tuple[int, ...], float]] = [((), 0.0)]
    for _ in range(depth):
        nxt = []
        for path, score in frontier:
            z = row(path)
            logp = z - z.max() - np.log(np.exp(z - z.max()).sum())
            for token in np.argsort(-z, kind="stable")[:top_k]:
                nxt.append(((*path, int(token)), score + float(logp[token])))
        scored.update(nxt)
        frontier = nxt
    best = sorted(scored.items(), key=lambda kv: -kv[1])
    assert best[budget - 1][1] != best[budget][1]  # no tie at the cut: the set is defined
    return {path for path, _ in best[:budget]}


def test_the_dynamic_tree_is_the_budget_best_scored_paths() -> None:
    context = [7, 3, 11, 3, 7]
    tree = _model_tree_drafter("dynamic:10,k=3").propose_tree(context, max_nodes=32, max_depth=3)
    got = {tuple(tree.tokens[n] for n in tree.path(i)) for i in range(len(tree))}
    assert got == _oracle_dynamic(context, 10, 3, 3)


def test_the_ngram_tree_holds_every_continuation_and_the_chain_first() -> None:
    context = [1, 2, 3, 4, 1, 2, 5, 6, 1, 2, 3, 7, 1, 2]
    tree = NgramTreeDrafter(width=4).propose_tree(context, max_nodes=16, max_depth=4)
    paths = {tuple(tree.tokens[n] for n in tree.path(i)) for i in range(len(tree))}
    assert tuple(NgramDrafter().propose(context, 4)) in paths
    assert (5, 6, 1, 2) in paths and (3, 4, 1, 2) in paths
    assert tree.tokens[:4] == (3, 7, 1, 2)  # the chain drafter's draft is the first root path
    assert NgramTreeDrafter().propose_tree([1, 2, 3], max_nodes=8, max_depth=4) == TreeDraft((), ())
    small = NgramTreeDrafter(width=4).propose_tree(context, max_nodes=5, max_depth=2)
    assert len(small) <= 5 and small.depth <= 2


@settings(max_examples=12, deadline=None)
@given(
    shape=st.sampled_from(SHAPES),
    prompt=st.lists(st.integers(0, 63), min_size=1, max_size=10),
    n=st.integers(1, 14),
    rollback=st.sampled_from(["checkpoint", "replay"]),
)
def test_decoding_with_a_model_tree_drafter_is_plain_greedy(
    shape: str, prompt: list[int], n: int, rollback: str
) -> None:
    want = greedy_decode(ReferenceHybrid(TARGET), prompt, n).tokens
    decoder = TreeSpecDecoder(
        ReferenceHybrid(TARGET),
        _model_tree_drafter(shape),
        max_nodes=16,
        max_depth=4,
        rollback=rollback,  # type: ignore[arg-type]
    )
    assert decoder.generate(prompt, n).tokens == want


@pytest.mark.slow
@pytest.mark.parametrize(("spec", "shape"), list(itertools.product(["eagle", "mtp", "model"], ["2x2x2", "dynamic:16"])))
def test_decoding_the_trained_fixture_with_each_tree_drafter_is_plain_greedy(spec: str, shape: str) -> None:
    from specproof.plugins import load_target

    prompt = list(b"def add(a, b):\n    return")
    want = greedy_decode(load_target("trained"), prompt, 24).tokens
    chain = load_drafter("model:trained-small" if spec == "model" else f"{spec}:trained")
    decoder = TreeSpecDecoder(load_target("trained"), TopKTreeDrafter(chain, shape), max_nodes=16, max_depth=4)  # type: ignore[arg-type]
    assert decoder.generate(prompt, 24).tokens == want
    ngram = TreeSpecDecoder(load_target("trained"), NgramTreeDrafter(), max_nodes=16, max_depth=4)
    assert ngram.generate(prompt, 24).tokens == want


@pytest.mark.parametrize("spec", ["model:trained-small", "eagle:trained", "eagle:trained,replay", "mtp:trained"])
def test_a_tree_along_a_decoding_is_a_fresh_drafters_tree(spec: str) -> None:
    """Called as a decoder calls it (trees and chains, contexts growing by an accepted prefix and a bonus),
    each tree equals a fresh drafter's on the same context: the rows' paths leave no trace."""
    text = list(b"def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n")
    drafter = TopKTreeDrafter(load_drafter(spec), "dynamic:12")  # type: ignore[arg-type]
    for cut in range(12, len(text), 5):
        context = text[:cut]
        tree = drafter.propose_tree(context, max_nodes=12, max_depth=4)
        fresh = TopKTreeDrafter(load_drafter(spec), "dynamic:12")  # type: ignore[arg-type]
        assert tree == fresh.propose_tree(context, max_nodes=12, max_depth=4), cut
        if cut % 2:
            assert drafter.propose(context, 3) == load_drafter(spec).propose(context, 3)
