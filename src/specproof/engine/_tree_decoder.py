"""The greedy tree speculative decoder: draft a tree, verify it in one target call, accept a root path,
commit its state (docs/contract.md, "Trees").

A tree drafter has ``propose_tree(context, *, max_nodes, max_depth)`` returning a ``TreeDraft`` (or a
``(tokens, parents)`` pair); a tree target has ``forward_tree(tokens, parents) -> (logits, checkpoints)``
and leaves its own state as it was. Each round feeds the pending token as the one root of the verified
tree, the draft's roots as its children.

``generate(..., sampling=SamplingParams(...))`` samples with recursive rejection sampling over siblings
(``_tree_sampling``, docs/contract.md "Sampled trees"); a drafter with ``propose_tree_sampled`` declares each
node's ``q``, any other drafter's tree is deterministic (one-hot ``q``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import attrs
import numpy as np

from specproof.contract import Generation, Stats, Step, StopReason, Target
from specproof.contract.errors import DrafterContractError, InvalidSettingError, SpecproofError
from specproof.contract.sampled_tree import SampledTreeDraft, one_hot_rows
from specproof.contract.sampling import SamplingParams
from specproof.contract.tree import TreeDraft, TreeVerdict, greedy_tree_accept
from specproof.contract.validation import int_at_least
from specproof.engine._sampling import target_distribution
from specproof.engine._tree_sampling import sampled_tree_accept
from specproof.engine.conventions import (
    check_eos_token,
    check_logits,
    check_prompt,
    check_sampling_params,
    component_name,
)

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
    ``generate(..., sampling=...)`` samples (docs/contract.md, "Sampled trees"), one seed one output.
    """

    seeded = True  # docs/contract.md, "Sampling": one seed gives one output
    _sampling: SamplingParams | None = None  # the current call's sampling parameters (None: greedy)
    _rng: np.random.Generator | None = None  # the current call's generator, seeded by its seed

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

    def generate(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        *,
        eos_token_id: int | None = None,
        sampling: SamplingParams | None = None,
    ) -> Generation:
        check_sampling_params(sampling)
        self._sampling = sampling
        self._rng = np.random.default_rng(sampling.seed) if sampling is not None else None
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

    def round(
        self,
        context: Sequence[int],
        max_new_tokens: int,
        *,
        eos_token_id: int | None = None,
        sampling: SamplingParams | None = None,
    ) -> TreeRound:
        """One tree round on a target that holds ``context[:-1]`` (its pending token ``context[-1]``), as
        ``generate`` runs it: the rollback machine interleaves such rounds with its own snapshots and turns."""
        target = self.target
        ctx = check_prompt(context, vocab_size=target.vocab_size, max_context=target.max_context)
        remaining = int_at_least(max_new_tokens, name="max_new_tokens", minimum=1)
        check_eos_token(eos_token_id, vocab_size=target.vocab_size)
        if target.processed != len(ctx) - 1:
            raise InvalidSettingError(
                f"TreeSpecDecoder.round: the target holds {target.processed} tokens, the context {len(ctx)} "
                "(it must hold all but the pending token)"
            )
        if target.max_context - target.processed < 1:
            raise InvalidSettingError("TreeSpecDecoder.round: the context is full")
        self._sampling = sampling
        self._rng = np.random.default_rng(sampling.seed) if sampling is not None else None
        depth = min(self.max_depth, remaining - 1, target.max_context - target.processed - 1)
        return self._round(ctx, depth, remaining, eos_token_id, component_name(target), 0)

    def _propose(self, ctx: list[int], depth: int, index: int) -> tuple[TreeDraft, np.ndarray]:
        """The drafter's checked tree for this round and each node's ``q`` (one-hot unless it declares one)."""
        vocab = self.target.vocab_size
        if depth <= 0 or self.max_nodes <= 0:
            return TreeDraft((), ()), np.zeros((0, vocab))
        max_nodes, depth = self._budget(depth)
        who = f"drafter {component_name(self.drafter)} in round {index}"
        sampled = getattr(self.drafter, "propose_tree_sampled", None)
        if self._sampling is not None and callable(sampled):
            raw = sampled(tuple(ctx), max_nodes=max_nodes, max_depth=depth, sampling=self._sampling, rng=self._rng)
            if not isinstance(raw, SampledTreeDraft):
                raise DrafterContractError(
                    f"{who} returned {type(raw).__name__} from propose_tree_sampled, not a "
                    "SampledTreeDraft (tree.well-formed)"
                )
            tree = _as_tree(raw.tree, vocab_size=vocab, max_nodes=max_nodes, max_depth=depth, who=who)
            return tree, SampledTreeDraft(tree, raw.q).checked(vocab, who=who)
        raw = self.drafter.propose_tree(tuple(ctx), max_nodes=max_nodes, max_depth=depth)  # type: ignore[attr-defined]
        tree = _as_tree(raw, vocab_size=vocab, max_nodes=max_nodes, max_depth=depth, who=who)
        return tree, one_hot_rows(tree, vocab)

    def _round(self, ctx: list[int], depth: int, remaining: int, eos: int | None, name: str, index: int) -> TreeRound:
        target = self.target
        base = target.processed
        before = target.snapshot()
        tree, q = self._propose(ctx, depth, index)
        # the verified tree: the pending token is its one root, the draft's roots its children
        fed_tokens = [ctx[-1], *tree.tokens]
        fed_parents = [-1, *(p + 1 if p >= 0 else 0 for p in tree.parents)]
        logits, checkpoints = target.forward_tree(fed_tokens, fed_parents)  # type: ignore[attr-defined]
        logits = check_logits(
            logits, rows=len(fed_tokens), vocab_size=target.vocab_size, target=name, round_index=index
        )
        verdict = self._accept(tree, logits) if self._sampling is None else self._accept_sampled(tree, q, logits)
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
        """The nodes and depth a round's tree may have (the zoo overrides it to plant a budget bug): a target that
        verifies at most ``max_tree_nodes`` nodes per ``forward_tree`` (a Core ML tree function's fixed size) takes
        the pending token and ``max_tree_nodes - 1`` draft nodes."""
        cap = getattr(self.target, "max_tree_nodes", None)
        return (self.max_nodes if cap is None else max(0, min(self.max_nodes, int(cap) - 1))), depth

    def _accept(self, tree: TreeDraft, logits: np.ndarray) -> TreeVerdict:
        """The acceptance rule (the zoo overrides it to plant acceptance bugs)."""
        return greedy_tree_accept(tree, logits)

    def _accept_sampled(self, tree: TreeDraft, q: np.ndarray, logits: np.ndarray) -> TreeVerdict:
        """The sampled rule (the zoo overrides ``_sampled_path`` to plant sampling bugs): ``argmax`` still
        records the target's greedy tokens."""
        assert self._sampling is not None and self._rng is not None
        p = np.stack([target_distribution(row, self._sampling) for row in logits])
        path, token = self._sampled_path(tree, q, p, self._rng)
        argmax = tuple(int(i) for i in np.argmax(logits, axis=1))
        return TreeVerdict(path=path, accepted=(*(tree.tokens[i] for i in path), token), argmax=argmax)

    def _sampled_path(
        self, tree: TreeDraft, q: np.ndarray, p: np.ndarray, rng: np.random.Generator
    ) -> tuple[tuple[int, ...], int]:
        return sampled_tree_accept(tree, q, p, rng)

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
