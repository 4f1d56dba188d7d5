"""The sampled tree rule (docs/contract.md, "Sampled trees"): recursive rejection sampling over siblings emits
plain sampling's distribution, for deterministic trees (duplicate siblings included) and for siblings drawn
i.i.d. from a declared q; the tree decoder samples with both rollbacks, one seed one output."""

from __future__ import annotations

import numpy as np
import pytest

from specproof.conformance.zoo import small_reference
from specproof.contract.errors import DrafterContractError, InvalidSettingError
from specproof.contract.sampled_tree import SampledTreeDraft, one_hot_rows
from specproof.contract.sampling import SamplingParams
from specproof.contract.tree import TreeDraft
from specproof.engine import TreeSpecDecoder, greedy_decode
from specproof.engine._tree_sampling import sampled_tree_accept
from specproof.strategies import ScriptedTreeDrafter, TreePlan

P0 = np.array([0.5, 0.3, 0.15, 0.05])  # the pending token's row
P_CHILD = np.array([0.1, 0.2, 0.3, 0.4])  # every node's row


def _first_tokens(tree: TreeDraft, q_of: object, trials: int, seed: int) -> np.ndarray:
    """The empirical law of the round's first emitted token over ``trials`` rounds."""
    rng = np.random.default_rng(seed)
    counts = np.zeros(4)
    for _ in range(trials):
        t, q = q_of(rng) if callable(q_of) else (tree, q_of)
        p = np.vstack([P0, *([P_CHILD] * len(t))])
        path, token = sampled_tree_accept(t, q, p, rng)
        counts[t.tokens[path[0]] if path else token] += 1
    return counts / trials


@pytest.mark.parametrize(
    "tree",
    [
        TreeDraft((0, 1), (-1, -1)),  # the top two as siblings
        TreeDraft((1, 0, 2), (-1, -1, -1)),  # the top token second
        TreeDraft((0, 0, 3), (-1, -1, -1)),  # a duplicate sibling: its residual mass is 0
        TreeDraft((2, 1, 3, 0), (-1, 0, 0, -1)),  # a subtree under the first sibling
    ],
    ids=["top-two", "top-second", "duplicate", "subtree"],
)
def test_a_deterministic_tree_emits_p(tree: TreeDraft) -> None:
    law = _first_tokens(tree, one_hot_rows(tree, 4), 10_000, seed=1)
    assert np.abs(law - P0).max() < 0.02, law  # 4 standard errors at 10k draws


def test_siblings_drawn_iid_from_q_emit_p() -> None:
    q = np.array([0.1, 0.1, 0.4, 0.4])  # far from p: many rejections, residuals used every round

    def draw(rng: np.random.Generator) -> tuple[TreeDraft, np.ndarray]:
        tokens = tuple(int(t) for t in rng.choice(4, size=3, p=q))
        return TreeDraft(tokens, (-1, -1, -1)), np.vstack([q] * 3)

    law = _first_tokens(TreeDraft((), ()), draw, 10_000, seed=2)
    assert np.abs(law - P0).max() < 0.02, law


def test_a_stale_residual_would_not_emit_p() -> None:
    """The unit test above can fail: testing every sibling against p itself moves mass onto the siblings."""
    tree = TreeDraft((0, 1), (-1, -1))
    rng = np.random.default_rng(3)
    counts = np.zeros(4)
    for _ in range(10_000):
        kept = next((t for t in tree.tokens if rng.random() < P0[t]), None)
        counts[kept if kept is not None else rng.choice(4, p=P0)] += 1
    assert np.abs(counts / 10_000 - P0).max() > 0.1


def _decoder(rollback: str) -> tuple[TreeSpecDecoder, list[int]]:
    prompt = [5, 6, 7, 8]
    truth = [*prompt, *greedy_decode(small_reference(), prompt, 16).tokens]
    plan = TreePlan(width=3, levels=3, winner_slot=1, match_levels=2, decoy_children=True)
    drafter = ScriptedTreeDrafter(plan, truth, vocab_size=64)
    return TreeSpecDecoder(small_reference(), drafter, max_nodes=10, max_depth=4, rollback=rollback), prompt  # type: ignore[arg-type]


def test_sampled_tree_decoding_is_seeded_and_alike_under_both_rollbacks() -> None:
    params = SamplingParams(temperature=0.9, seed=11)
    runs = {}
    for rollback in ("checkpoint", "replay"):
        decoder, prompt = _decoder(rollback)
        first = decoder.generate(prompt, 16, sampling=params)
        again = decoder.generate(prompt, 16, sampling=params)
        assert first.tokens == again.tokens and len(first.tokens) == 16
        runs[rollback] = first.tokens
        # the committed state is the emitted context's: a fresh model fed it agrees
        fresh = small_reference()
        fresh.forward([*prompt, *first.tokens][:-1])
        for name, arr in fresh.state_arrays().items():
            assert np.array_equal(arr, decoder.target.state_arrays()[name]), name
    assert runs["checkpoint"] == runs["replay"]


def test_temperature_zero_sampling_is_greedy() -> None:
    decoder, prompt = _decoder("checkpoint")
    assert (
        decoder.generate(prompt, 12, sampling=SamplingParams(temperature=0.0)).tokens
        == decoder.generate(prompt, 12).tokens
    )


def test_bad_sampling_and_bad_q_are_named() -> None:
    decoder, prompt = _decoder("checkpoint")
    with pytest.raises(InvalidSettingError, match="SamplingParams"):
        decoder.generate(prompt, 4, sampling={"temperature": 1.0})  # type: ignore[arg-type]
    tree = TreeDraft((1,), (-1,))
    with pytest.raises(DrafterContractError, match=r"q\[0\] is not a distribution"):
        SampledTreeDraft(tree, np.array([[1.0, 0.0]])).checked(2, who="drafter")


def test_one_round_continues_a_held_context() -> None:
    decoder, prompt = _decoder("replay")
    target = decoder.target
    target.reset()
    target.forward(prompt[:-1])
    round_ = decoder.round(prompt, 5)
    assert 1 <= len(round_.emitted) <= 5 and target.processed == len(prompt) - 1 + len(round_.emitted)
    with pytest.raises(InvalidSettingError, match="holds"):
        decoder.round(prompt, 5)


class _IidRoots:
    """Two roots drawn i.i.d. from a uniform q with the request's generator (a sampling tree drafter)."""

    def __init__(self, answer: object = None) -> None:
        self.answer = answer

    def propose_tree(self, context: object, *, max_nodes: int, max_depth: int) -> TreeDraft:
        return TreeDraft((1,), (-1,))

    def propose_tree_sampled(
        self, context: object, *, max_nodes: int, max_depth: int, sampling: SamplingParams, rng: np.random.Generator
    ) -> object:
        if self.answer is not None:
            return self.answer
        q = np.full(64, 1 / 64)
        tokens = tuple(int(t) for t in rng.choice(64, size=min(2, max_nodes), p=q))
        return SampledTreeDraft(TreeDraft(tokens, (-1,) * len(tokens)), np.vstack([q] * len(tokens)))


def test_a_drafter_that_declares_q_is_sampled_against_it() -> None:
    params = SamplingParams(temperature=1.0, seed=5)
    decoder = TreeSpecDecoder(small_reference(), _IidRoots(), max_nodes=4, max_depth=2)
    first = decoder.generate([5, 6, 7], 12, sampling=params)
    assert first.tokens == decoder.generate([5, 6, 7], 12, sampling=params).tokens and len(first.tokens) == 12
    assert all(len(r.tree) == 2 for r in decoder.last_rounds[:-1])  # the declared trees were verified
    bad = TreeSpecDecoder(small_reference(), _IidRoots(answer=TreeDraft((1,), (-1,))), max_nodes=4, max_depth=2)
    with pytest.raises(DrafterContractError, match="not a SampledTreeDraft"):
        bad.generate([5, 6, 7], 4, sampling=params)
