"""The ``RollbackMachine``'s tree round: one greedy token-tree round between the machine's other steps
(docs/contract.md, "Trees"), mixed in with ``configure(tree_rounds=True)`` (``certify --trees``).

The round drafts a drawn ``TreePlan`` over the oracle's greedy continuation and runs one
``TreeSpecDecoder.round`` on the target under test, with the conversation's rollback. The machine judges
it with its own rule (sharing no code with the decoder): the emitted tokens are plain greedy's next
``m + 1`` (``m``: the depth of the deepest node whose root path matches greedy), cut at the budget and an EOS;
then the committed state is the reference's (``kv-length``, ``state``). A snapshot taken before the round is
then restored, which must bring the target back over the tree forward and its commit (``processed``,
``restore``), and the round's tokens are handed to the session as a turn, so the conversation goes on with
chain rounds, sampled rounds, snapshots and turns interleaved with tree rounds.

When the machine also has sampled rounds, a tree round may be drawn at temperature > 0. The machine cannot
predict its tokens, so it judges what holds whatever was drawn (docs/contract.md, "Sampled trees"): the kept
tokens are one root path of the tree (the first child carrying each token: a later twin is never kept), then
one token with ``p > 0`` that no child of the path's last node carries (a rejected child leaves the residual
without its token; the suite's trees are deterministic).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from specproof.contract.sampling import SamplingParams, processed_distribution
from specproof.contract.tree import TreeDraft
from specproof.engine import TreeSpecDecoder
from specproof.strategies._sampled_round import sampling_params
from specproof.strategies._trees import ScriptedTreeDrafter, tree_plans

__all__ = ["TreeRounds", "expected_tree_emission", "with_tree_rounds"]

MAX_NODES = 8
MAX_DEPTH = 4


def expected_tree_emission(tree: TreeDraft, greedy: Sequence[int], *, budget: int, eos: int | None) -> list[int]:
    """What a lossless greedy tree round emits: greedy's next ``m + 1`` tokens (``m``: the deepest node whose
    every ancestor and itself equal greedy's tokens at their depths), cut at ``budget`` and after ``eos``."""
    depth_of: dict[int, int] = {-1: 0}
    deepest = 0
    for i, (token, parent) in enumerate(zip(tree.tokens, tree.parents, strict=True)):
        at = depth_of.get(parent)
        if at is not None and at < len(greedy) and token == greedy[at]:
            depth_of[i] = at + 1
            deepest = max(deepest, at + 1)
    out = list(greedy[: deepest + 1])[:budget]
    if eos is not None and eos in out:
        out = out[: out.index(eos) + 1]
    return out


def _has_tree_target(machine: Any) -> bool:
    return (
        machine.session is not None
        and callable(getattr(machine.target, "forward_tree", None))
        and machine.max_context - len(machine.ctx) >= 1  # room for the round and the turn that hands it over
    )


class TreeRounds:
    """The tree-round rule (see the module docstring); without it the machine's rules are unchanged."""

    @precondition(_has_tree_target)
    @rule(data=st.data())
    def tree_round(self, data: Any) -> None:
        """One greedy tree round of a drawn plan; then restore the snapshot taken before it and hand its
        tokens to the session."""
        me: Any = self
        plan = data.draw(tree_plans(max_width=3, max_levels=MAX_DEPTH), label="tree plan")
        room = me.max_context - len(me.ctx)  # the tokens the turn that hands the round over may add
        budget = data.draw(st.integers(1, max(1, min(MAX_DEPTH + 1, room))), label="max_new_tokens")
        upcoming = me._greedy(MAX_DEPTH + 1)
        params = data.draw(st.none() | sampling_params(), label="sampling") if me.cfg.sampled_rounds else None
        eos = None
        if upcoming and params is None:
            eos = data.draw(st.none() | st.sampled_from(upcoming), label="eos_token_id")
        drafter = ScriptedTreeDrafter(plan, [*me.ctx, *upcoming], vocab_size=me.vocab_size)
        decoder = TreeSpecDecoder(me.target, drafter, max_nodes=MAX_NODES, max_depth=MAX_DEPTH, rollback=me.rollback)
        before = list(me.ctx)
        snap = me.target.snapshot()
        sampled = f", sampling={params.describe()}" if params is not None else ""
        me.last_step = (
            f"tree_round(plan={plan}, max_new_tokens={budget}, eos_token_id={eos}, rollback={me.rollback}{sampled})"
        )
        try:
            got = [int(t) for t in decoder.round(before, budget, eos_token_id=eos, sampling=params).emitted]
        except Exception as err:
            err.add_note(f"raised by the tree decoder in RollbackMachine rule {me.last_step}")
            raise
        me.rounds += 1
        tree = drafter.trees[-1] if drafter.trees else TreeDraft((), ())
        if tree.depth >= len(upcoming) and tree.depth > 0:
            me._fail("stop", f"a tree of depth {tree.depth} was verified with {len(upcoming)} greedy tokens of room")
        me.last_step += f"; tree={tree}, greedy={upcoming}, emitted={got}"
        if params is not None:
            _judge_sampled_tree(me, tree, got, budget, params)
        else:
            expected = expected_tree_emission(tree, upcoming, budget=budget, eos=eos)
            if got != expected:
                me._fail("lossless", f"the tree round emitted {got}; plain greedy continues {upcoming}, so {expected}")
        me.ctx = [*before, *got]
        me._check_kv_length(me.ctx)
        me._check_state(me.ctx)  # the committed state is the accepted path's
        me.target.restore(snap)
        me.ctx = before
        me.last_step += ", then target.restore(snapshot taken before the tree round)"
        me._check_kv_length(before, "processed")
        me._check_state(before, "restore")
        me.session.extend(got)  # the session takes the round's tokens as a turn and goes on
        me.ctx = [*before, *got]
        event("RollbackMachine round: tree")
        type(me).observed_paths["round:tree"] += 1
        if params is not None:
            type(me).observed_paths["round:tree_sampled"] += 1
        if len(got) > 1:
            type(me).observed_paths["round:tree_path_kept"] += 1


def _judge_sampled_tree(me: Any, tree: TreeDraft, got: list[int], budget: int, params: SamplingParams) -> None:
    """A sampled tree round's tokens: a root path of ``tree``, then a token with ``p > 0`` no child of the
    path's last node carries (see the module docstring)."""
    if not 1 <= len(got) <= min(tree.depth + 1, budget):
        me._fail("sampled", f"the tree round emitted {len(got)} tokens from a tree of depth {tree.depth}")
    node = -1
    for i, token in enumerate(got[:-1]):
        node = next((c for c in tree.children(node) if tree.tokens[c] == token), -2)
        if node == -2:
            me._fail("sampled", f"the tree round emitted {got}: token {i} is not a child of the path before it")
    if got[-1] in {tree.tokens[c] for c in tree.children(node)}:
        me._fail(
            "sampled",
            f"the tree round ended with {got[-1]}, a token a child of its last node carries: that child was "
            "rejected, and the residual it leaves has no mass on its token",
        )
    before = me.ctx
    me._feed_reference(before[:-1])
    rows = np.asarray(me.reference.forward([before[-1], *got[:-1]]), dtype=np.float64)
    me._ref_fed = [*before, *got[:-1]]
    for i, token in enumerate(got):
        if processed_distribution(rows[i], params)[token] <= 0.0:
            me._fail("sampled", f"token {i} of the tree round ({token}) has probability 0 under p")


@functools.cache
def with_tree_rounds(cls: type) -> type:
    """``cls`` with the tree-round rule mixed in front (one class per machine class)."""
    return type(f"{cls.__name__}WithTreeRounds", (TreeRounds, cls), {"__module__": cls.__module__})
