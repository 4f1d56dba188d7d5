"""Sampled tree drafters (docs/contract.md, "Sampled trees"): ``TopKTreeDrafter.propose_tree_sampled`` draws
each node's children from the drafter's own ``q`` without replacement and declares the row each was drawn
from; with those rows the recursive rejection rule is exact, with the undiminished row it is not."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from specproof.contract.errors import InvalidSettingError
from specproof.contract.sampled_tree import SampledTreeDraft
from specproof.contract.sampling import SamplingParams, processed_distribution
from specproof.engine import TreeSpecDecoder
from specproof.engine.drafters import ModelDrafter
from specproof.engine.drafters.trees import TopKTreeDrafter
from specproof.engine.targets.reference import ReferenceConfig, ReferenceHybrid
from specproof.plugins import load_drafter, load_target

TARGET = ReferenceConfig(d_model=32, ffn_dim=64, vocab_size=64, max_context=64)
DRAFT = ReferenceConfig(d_model=16, ffn_dim=32, vocab_size=64, max_context=64, seed=7)
PARAMS = SamplingParams(temperature=0.7)
CONTEXT = [5, 9, 14, 3, 27, 11]


def _drafter(shape: str) -> TopKTreeDrafter:
    return TopKTreeDrafter(ModelDrafter(ReferenceHybrid(DRAFT)), shape)


def _q_after(path: tuple[int, ...], params: SamplingParams = PARAMS) -> np.ndarray:
    """The oracle of a node's undiminished q: a fresh draft model fed the context and the path."""
    row = np.asarray(ReferenceHybrid(DRAFT).forward([*CONTEXT, *path])[-1], dtype=np.float64)
    return processed_distribution(row[None, :], params)[0]


@cache
def _sampled(shape: str, seed: int) -> SampledTreeDraft:
    rng = np.random.default_rng(seed)
    return _drafter(shape).propose_tree_sampled(CONTEXT, max_nodes=16, max_depth=3, sampling=PARAMS, rng=rng)


@pytest.mark.parametrize("shape", ["2x2x2", "4-2-1", "dynamic:16", "dynamic:6,k=2"])
def test_each_node_declares_the_row_it_was_drawn_from(shape: str) -> None:
    for seed in range(3):
        got = _sampled(shape, seed)
        tree, q = got.tree, got.q
        tree.check(64)
        assert 0 < len(tree) <= 16 and tree.depth <= 3 and q.shape == (len(tree), 64)
        paths: list[tuple[int, ...]] = []
        for i, (token, parent) in enumerate(zip(tree.tokens, tree.parents, strict=True)):
            paths.append((*(paths[parent] if parent >= 0 else ()), token))
            earlier = [tree.tokens[j] for j in tree.children(parent) if j < i]
            assert token not in earlier  # without replacement: no twin sibling
            want = _q_after(paths[parent] if parent >= 0 else ())
            want[earlier] = 0.0
            np.testing.assert_allclose(q[i], want / want.sum(), atol=1e-12)
        if not shape.startswith("dynamic"):
            assert [len(tree.children(-1))] == [int(shape.replace("-", "x").split("x")[0])]


def test_one_seed_one_tree_and_the_drafter_left_at_the_context() -> None:
    drafter = _drafter("2x2x2")
    chain = drafter.propose(CONTEXT, 4)
    again = drafter.propose_tree_sampled(
        CONTEXT, max_nodes=16, max_depth=3, sampling=PARAMS, rng=np.random.default_rng(1)
    )
    assert again.tree == _sampled("2x2x2", 1).tree and np.array_equal(again.q, _sampled("2x2x2", 1).q)
    assert drafter.propose(CONTEXT, 4) == chain
    assert {_sampled("2x2x2", s).tree for s in range(3)} != {_sampled("2x2x2", 0).tree}  # it samples


def test_a_greedy_request_draws_the_top_k_tree() -> None:
    greedy = SamplingParams(temperature=0.0)
    for shape in ("2x2x2", "dynamic:16"):
        got = _drafter(shape).propose_tree_sampled(
            CONTEXT, max_nodes=16, max_depth=3, sampling=greedy, rng=np.random.default_rng(0)
        )
        ranked = _drafter(shape).propose_tree(CONTEXT, max_nodes=16, max_depth=3)
        assert got.tree.tokens[: len(ranked.children(-1)[:1])] == ranked.tokens[:1]  # the argmax first
        assert len(got.tree.children(-1)) == 1  # a one-hot q has one token to draw without replacement


def test_the_budget_and_an_empty_context_are_kept() -> None:
    drafter = _drafter("4-2-1")
    small = drafter.propose_tree_sampled(
        CONTEXT, max_nodes=5, max_depth=2, sampling=PARAMS, rng=np.random.default_rng(0)
    )
    assert len(small.tree) == 5 and small.tree.depth <= 2 and small.q.shape == (5, 64)
    empty = drafter.propose_tree_sampled([], max_nodes=5, max_depth=2, sampling=PARAMS, rng=np.random.default_rng(0))
    assert len(empty.tree) == 0 and empty.q.shape == (0, 64)


def test_bad_sampling_arguments_say_which() -> None:
    drafter = _drafter("2x2x2")
    with pytest.raises(InvalidSettingError, match="sampling="):
        drafter.propose_tree_sampled(CONTEXT, max_nodes=4, max_depth=2, sampling=0.7, rng=np.random.default_rng())  # type: ignore[arg-type]
    with pytest.raises(InvalidSettingError, match="rng="):
        drafter.propose_tree_sampled(CONTEXT, max_nodes=4, max_depth=2, sampling=PARAMS, rng=3)  # type: ignore[arg-type]


def _first_token_law(p: np.ndarray, q: np.ndarray, width: int, undiminished: bool) -> np.ndarray:
    """The exact law of a round's first token under recursive rejection over ``width`` root siblings drawn
    without replacement from ``q``, each declared with its shrinking row (or, broken, ``q`` itself)."""
    law = np.zeros_like(p)

    def walk(r: np.ndarray, drawn: list[int], mass: float) -> None:
        rest = q.copy()
        rest[drawn] = 0.0
        if len(drawn) == width or rest.sum() <= 0.0:
            law[:] += mass * r
            return
        rest /= rest.sum()
        declared = q if undiminished else rest
        residual = np.maximum(r - declared, 0.0)
        after = residual / residual.sum() if residual.sum() > 0 else r
        for x in np.flatnonzero(rest):
            keep = min(1.0, r[x] / declared[x])
            law[x] += mass * rest[x] * keep
            if keep < 1.0:
                walk(after, [*drawn, int(x)], mass * rest[x] * (1.0 - keep))

    walk(p, [], 1.0)
    return law


def test_the_declared_rows_make_the_sibling_rule_exact_and_the_undiminished_row_does_not() -> None:
    params = SamplingParams(temperature=0.7, top_p=0.9)
    target = ReferenceHybrid(TARGET)
    rows = np.asarray(target.forward(CONTEXT), dtype=np.float64)
    for z in rows:
        p = processed_distribution(z[None, :], params)[0]
        q = processed_distribution((0.6 * z)[None, :], params)[0]  # a flatter drafter on the same logits
        np.testing.assert_allclose(_first_token_law(p, q, 2, undiminished=False), p, atol=1e-12)
    rng = np.random.default_rng(5)
    worst = 0.0
    for _ in range(20):  # small random vocabularies, three siblings
        p, q = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))
        np.testing.assert_allclose(_first_token_law(p, q, 3, undiminished=False), p, atol=1e-12)
        worst = max(worst, 0.5 * float(np.abs(_first_token_law(p, q, 3, undiminished=True) - p).sum()))
    assert worst > 0.02


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["model:trained-small", "eagle:trained", "mtp:trained"])
def test_sampled_decoding_with_a_sampled_tree_drafter_is_seeded_and_keeps_children(spec: str) -> None:
    prompt = list(b"def add(a, b):\n    return")
    runs = []
    for _ in range(2):
        drafter = TopKTreeDrafter(load_drafter(spec), "2x2x2")  # type: ignore[arg-type]
        decoder = TreeSpecDecoder(load_target("trained"), drafter, max_nodes=16, max_depth=3)
        runs.append(decoder.generate(prompt, 24, sampling=PARAMS.with_seed(3)))
    assert runs[0].tokens == runs[1].tokens and len(runs[0].tokens) == 24
    assert runs[0].stats.accepted > 0  # a trained drafter's sampled children are kept


def test_a_head_tree_leaves_the_head_as_its_chain_needs() -> None:
    prompt = list(range(40, 64))
    chain = load_drafter("eagle:trained").propose(prompt, 4)
    drafter = TopKTreeDrafter(load_drafter("eagle:trained"), "dynamic:16")  # type: ignore[arg-type]
    got = drafter.propose_tree_sampled(prompt, max_nodes=16, max_depth=4, sampling=PARAMS, rng=np.random.default_rng(0))
    assert len(got.tree) == 16 and got.q.shape == (16, drafter.vocab_size)
    assert drafter.propose(prompt, 4) == chain
