"""The greedy tree decoder equals plain greedy, with either rollback (docs/contract.md, "Trees")."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specproof.contract.errors import DrafterContractError, InvalidSettingError
from specproof.engine import TreeSpecDecoder, greedy_decode
from specproof.engine.targets.reference import ReferenceConfig, ReferenceHybrid
from specproof.strategies import ScriptedTreeDrafter, TreePlan, tree_plans

CONFIG = ReferenceConfig(d_model=32, ffn_dim=64, vocab_size=64, max_context=48)


@given(
    plan=tree_plans(),
    prompt=st.lists(st.integers(0, 63), min_size=1, max_size=12),
    n=st.integers(1, 12),
    rollback=st.sampled_from(["checkpoint", "replay"]),
    eos_at=st.none() | st.integers(0, 11),
)
def test_tree_decoding_is_plain_greedy(
    plan: TreePlan, prompt: list[int], n: int, rollback: str, eos_at: int | None
) -> None:
    oracle = greedy_decode(ReferenceHybrid(CONFIG), prompt, n).tokens
    eos = oracle[eos_at] if eos_at is not None and eos_at < len(oracle) else None
    want = greedy_decode(ReferenceHybrid(CONFIG), prompt, n, eos_token_id=eos)
    drafter = ScriptedTreeDrafter(plan, [*prompt, *oracle], vocab_size=64)
    decoder = TreeSpecDecoder(ReferenceHybrid(CONFIG), drafter, max_nodes=10, max_depth=4, rollback=rollback)  # type: ignore[arg-type]
    got = decoder.generate(prompt, n, eos_token_id=eos)
    assert got.tokens == want.tokens and got.stop_reason == want.stop_reason
    state = decoder.target.state_arrays()
    ref = ReferenceHybrid(CONFIG)
    ref.forward([*prompt, *got.tokens][:-1])
    for name, value in ref.state_arrays().items():
        assert (state[name] == value).all(), name
    for r in decoder.last_rounds:
        assert 1 <= len(r.emitted) <= r.tree.depth + 1
    assert got.stats.verify_forwards == got.stats.rounds


def test_a_winner_that_is_not_the_first_sibling_is_accepted() -> None:
    prompt = [3, 1, 4, 1, 5]
    oracle = greedy_decode(ReferenceHybrid(CONFIG), prompt, 8).tokens
    plan = TreePlan(width=3, levels=3, winner_slot=2, match_levels=3, decoy_children=True)
    decoder = TreeSpecDecoder(
        ReferenceHybrid(CONFIG), ScriptedTreeDrafter(plan, [*prompt, *oracle], vocab_size=64), max_nodes=16
    )
    assert decoder.generate(prompt, 8).tokens == oracle
    first = decoder.last_rounds[0]
    assert len(first.path) == 3 and first.path[0] == 2  # the third root won


def test_options_and_components_are_checked() -> None:
    drafter = ScriptedTreeDrafter(TreePlan(), [1], vocab_size=64)
    with pytest.raises(InvalidSettingError, match="rollback="):
        TreeSpecDecoder(ReferenceHybrid(CONFIG), drafter, rollback="undo")  # type: ignore[arg-type]
    with pytest.raises(InvalidSettingError, match="no forward_tree"):
        TreeSpecDecoder(object(), drafter)  # type: ignore[arg-type]
    with pytest.raises(InvalidSettingError, match="no propose_tree"):
        TreeSpecDecoder(ReferenceHybrid(CONFIG), object())


class _TooBig:
    def propose_tree(self, context: object, *, max_nodes: int, max_depth: int) -> tuple[list[int], list[int]]:
        return [1] * (max_nodes + 1), [-1] * (max_nodes + 1)


def test_a_tree_beyond_the_round_limits_is_a_drafter_error() -> None:
    decoder = TreeSpecDecoder(ReferenceHybrid(CONFIG), _TooBig(), max_nodes=3)
    with pytest.raises(DrafterContractError, match=r"4 nodes.*tree.well-formed"):
        decoder.generate([1, 2], 4)


@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
def test_trees_that_reach_max_context_stop_there_as_plain_greedy_does(rollback: str) -> None:
    prompt = [i % 64 for i in range(44)]  # 4 slots left of max_context=48
    oracle = greedy_decode(ReferenceHybrid(CONFIG), prompt, 10)
    plan = TreePlan(width=2, levels=4, winner_slot=1, match_levels=4)
    drafter = ScriptedTreeDrafter(plan, [*prompt, *oracle.tokens], vocab_size=64)
    decoder = TreeSpecDecoder(ReferenceHybrid(CONFIG), drafter, max_nodes=10, rollback=rollback)  # type: ignore[arg-type]
    got = decoder.generate(prompt, 10)
    assert got.tokens == oracle.tokens and got.stop_reason == oracle.stop_reason == "context_full"
    assert all(r.tree.depth <= 48 - r.base - 1 for r in decoder.last_rounds)


@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
def test_every_branch_rejected_at_the_root_commits_the_bonus_only(rollback: str) -> None:
    prompt = [3, 1, 4]
    oracle = greedy_decode(ReferenceHybrid(CONFIG), prompt, 6).tokens
    plan = TreePlan(width=3, levels=2, winner_slot=1, match_levels=0, decoy_children=True)
    drafter = ScriptedTreeDrafter(plan, [*prompt, *oracle], vocab_size=64)
    decoder = TreeSpecDecoder(ReferenceHybrid(CONFIG), drafter, rollback=rollback)  # type: ignore[arg-type]
    got = decoder.generate(prompt, 6)
    assert got.tokens == oracle and all(len(r.emitted) == 1 and r.path == () for r in decoder.last_rounds)
    ref = ReferenceHybrid(CONFIG)
    ref.forward([*prompt, *oracle][:-1])
    state = decoder.target.state_arrays()
    assert all((state[name] == value).all() for name, value in ref.state_arrays().items())
