"""The greedy tree speculative decoder: draft a tree, verify it in one target call, accept a root path,
commit its state (docs/contract.md, "Trees").

A tree drafter has ``propose_tree(context, *, max_nodes, max_depth)`` returning a ``TreeDraft`` (or a
``(tokens, parents)`` pair); a tree target has ``forward_tree(tokens, parents) -> (logits, checkpoints)``
and leaves its own state as it was. Each round feeds the pending token as the one root of the verified
tree, the draft's roots as its children.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import attrs
import numpy as np

from specproof.contract import Generation, Stats, Step, StopReason, Target
from specproof.contract.errors import DrafterContractError, InvalidSettingError, SpecproofError
from specproof.contract.tree import TreeDraft, TreeVerdict, greedy_tree_accept
from specproof.contract.validation import int_at_least
from specproof.engine.conventions import check_eos_token, check_logits, check_prompt, component_name

__all__ = ["TreeRound", "TreeSpecDecoder"]

Rollback = Literal["checkpoint", "replay"]


@attrs.frozen
class TreeRound:
    """One tree round as the decoder saw it: the drafted ``tree``, the accepted ``path`` (node indices,
    root first), ``accepted`` (its tokens plus the bonus) and ``emitted`` (cut at EOS / the budget)."""

    base: int
    tree: TreeDraft
    path: tuple[int, ...]
    accepted: tuple[int, ...]
    emitted: tuple[int, ...]


def _as_tree(raw: object, *, vocab_size: int, max_nodes: int, max_depth: int, who: str) -> TreeDraft:
    """The drafter's answer as a checked ``TreeDraft``, or ``DrafterContractError`` naming the breach."""
    if isinstance(raw, TreeDraft):
        tree = raw
    elif isinstance(raw, tuple) and len(raw) == 2:
        tree = TreeDraft(raw[0], raw[1])
    else:
        raise DrafterContractError(f"{who} returned {type(raw).__name__}, not a TreeDraft (tree.well-formed)")
    tree.check(vocab_size)
    if len(tree) > max_nodes or tree.depth > max_depth:
        raise DrafterContractError(
            f"{who} returned a tree of {len(tree)} nodes and depth {tree.depth}; the round allows "
            f"{max_nodes} nodes and depth {max_depth} (tree.well-formed)"
        )
    return tree


class TreeSpecDecoder:
    """Lossless greedy speculative decoding with token trees over a target with ``forward_tree``.

    ``rollback="checkpoint"`` restores the verify call's checkpoint of the last kept node (the winning
    path's state, KV rows included); ``"replay"`` restores the snapshot taken before the round and
    re-feeds the kept tokens (one replay forward per round, counted in ``replay_forwards``).
    """

    def __init__(
        self,
        target: Target,
        drafter: object,
        *,
        max_nodes: int = 8,
        max_depth: int = 4,
        rollback: Rollback = "checkpoint",
    ) -> None:
        self.max_nodes = int_at_least(max_nodes, name="max_nodes", minimum=0, where="TreeSpecDecoder")
        self.max_depth = int_at_least(max_depth, name="max_depth", minimum=0, where="TreeSpecDecoder")
        if rollback not in ("checkpoint", "replay"):
            raise InvalidSettingError(f"TreeSpecDecoder rollback={rollback!r} is not one of ('checkpoint', 'replay')")
        if not callable(getattr(target, "forward_tree", None)):
            raise InvalidSettingError(f"target {component_name(target)} has no forward_tree(tokens, parents)")
        if not callable(getattr(drafter, "propose_tree", None)):
            raise InvalidSettingError(f"drafter {component_name(drafter)} has no propose_tree(context, ...) method")
        self.target = target
        self.drafter = drafter
        self.rollback: Rollback = rollback
        self.name = f"specproof.TreeSpecDecoder(max_nodes={self.max_nodes}, max_depth={self.max_depth}, {rollback})"
        self.last_rounds: tuple[TreeRound, ...] = ()

    def __repr__(self) -> str:
        return self.name

    def generate(self, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None) -> Generation:
        target = self.target
        name = component_name(target)
        ctx = check_prompt(prompt, vocab_size=target.vocab_size, max_context=target.max_context)
        max_new_tokens = int_at_least(max_new_tokens, name="max_new_tokens", minimum=0)
        check_eos_token(eos_token_id, vocab_size=target.vocab_size)
        target.reset()
        reset = getattr(self.drafter, "reset", None)
        if callable(reset):
            reset()
        prefill = 0
        if len(ctx) > 1:
            check_logits(
                target.forward(ctx[:-1]), rows=len(ctx) - 1, vocab_size=target.vocab_size, target=name, round_index=None
            )
            prefill = 1
        out: list[int] = []
        steps: list[Step] = []
        rounds: list[TreeRound] = []
        drafted = accepted_total = replays = 0
        stop: StopReason = "max_new_tokens"
        while len(out) < max_new_tokens:
            room = target.max_context - target.processed
            if room < 1:
                stop = "context_full"
                break
            remaining = max_new_tokens - len(out)
            depth = min(self.max_depth, remaining - 1, room - 1)
            round_ = self._round(ctx, depth, remaining, eos_token_id, name, len(rounds))
            replays += self.rollback == "replay"
            drafted += len(round_.tree)
            accepted_total += len(round_.path)
            rounds.append(round_)
            steps.append(self._step(round_, target.processed))
            out.extend(round_.emitted)
            ctx.extend(round_.emitted)
            if eos_token_id is not None and round_.emitted[-1] == eos_token_id:
                stop = "eos"
                break
        self.last_rounds = tuple(rounds)
        stats = Stats(
            rounds=len(rounds),
            emitted=len(out),
            prefill_forwards=prefill,
            verify_forwards=len(rounds),
            replay_forwards=replays,
            drafted=drafted,
            accepted=accepted_total,
        )
        return Generation(tokens=out, stop_reason=stop, steps=tuple(steps), stats=stats)

    def _round(self, ctx: list[int], depth: int, remaining: int, eos: int | None, name: str, index: int) -> TreeRound:
        target = self.target
        base = target.processed
        before = target.snapshot()
        tree = TreeDraft((), ())
        if depth > 0 and self.max_nodes > 0:
            max_nodes, depth = self._budget(depth)
            raw = self.drafter.propose_tree(tuple(ctx), max_nodes=max_nodes, max_depth=depth)  # type: ignore[attr-defined]
            who = f"drafter {component_name(self.drafter)} in round {index}"
            tree = _as_tree(raw, vocab_size=target.vocab_size, max_nodes=max_nodes, max_depth=depth, who=who)
        # the verified tree: the pending token is its one root, the draft's roots its children
        fed_tokens = [ctx[-1], *tree.tokens]
        fed_parents = [-1, *(p + 1 if p >= 0 else 0 for p in tree.parents)]
        logits, checkpoints = target.forward_tree(fed_tokens, fed_parents)  # type: ignore[attr-defined]
        logits = check_logits(
            logits, rows=len(fed_tokens), vocab_size=target.vocab_size, target=name, round_index=index
        )
        verdict = self._accept(tree, logits)
        emitted = list(verdict.accepted[:remaining])
        if eos is not None and eos in emitted:
            emitted = emitted[: emitted.index(eos) + 1]
        kept_nodes = verdict.path[: len(emitted) - 1]
        self._commit(tree, kept_nodes, fed_tokens, checkpoints, before)
        if target.processed != base + len(emitted):
            raise SpecproofError(
                f"target {name} reports processed={target.processed} after tree round {index}, "
                f"expected {base + len(emitted)} (target.processed)"
            )
        return self._record(
            TreeRound(base=base, tree=tree, path=verdict.path, accepted=verdict.accepted, emitted=tuple(emitted))
        )

    def _record(self, round_: TreeRound) -> TreeRound:
        """The round's record as ``last_rounds`` reports it (the zoo overrides it to plant a reporting bug)."""
        return round_

    def _budget(self, depth: int) -> tuple[int, int]:
        """The nodes and depth a round's tree may have (the zoo overrides it to plant a budget bug)."""
        return self.max_nodes, depth

    def _accept(self, tree: TreeDraft, logits: np.ndarray) -> TreeVerdict:
        """The acceptance rule (the zoo overrides it to plant acceptance bugs)."""
        return greedy_tree_accept(tree, logits)

    def _commit(
        self,
        tree: TreeDraft,
        kept_nodes: tuple[int, ...],
        fed_tokens: list[int],
        checkpoints: list[object],
        before: object,
    ) -> None:
        """Leave the target holding the pending token and ``kept_nodes`` (a root path of ``tree``)."""
        target = self.target
        if self.rollback == "checkpoint":
            target.restore(checkpoints[kept_nodes[-1] + 1 if kept_nodes else 0])
            return
        target.restore(before)
        target.forward([fed_tokens[0], *(tree.tokens[i] for i in kept_nodes)])

    @staticmethod
    def _step(round_: TreeRound, processed: int) -> Step:
        """The round as a chain ``Step``: the accepted path is the draft, every token of it matched."""
        path_tokens = tuple(round_.tree.tokens[i] for i in round_.path)
        argmax = (*path_tokens, round_.accepted[-1])
        return Step(base=round_.base, draft=path_tokens, argmax=argmax, accepted=round_.accepted, processed=processed)
