"""The tree checks (docs/contract.md, "Trees"): a tree engine judged against the suite's own oracles —
plain greedy decoding, and a fresh model fed a root path token by token — never against itself.

Each check returns ``(violations, exercised, note)``: ``exercised`` counts what it compared, and a
check that compared nothing says why in ``note`` (a SKIP, never a PASS).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from specproof.contract import Violation
from specproof.contract.compare import states_differ
from specproof.contract.errors import DrafterContractError
from specproof.contract.tree import MAX_TREE_DEPTH, MAX_TREE_NODES, TreeDraft
from specproof.strategies import ScriptedTreeDrafter, TreePlan

__all__ = [
    "TreeCase",
    "TreeRun",
    "TreeSubject",
    "check_committed_state",
    "check_greedy_lossless",
    "check_per_node_state",
    "check_round_bounds",
    "check_well_formed",
    "run_tree_case",
]

Result = tuple[list[Violation], int, str]


@attrs.frozen(kw_only=True)
class TreeSubject:
    """A tree engine under test and the suite's oracles.

    ``make_decoder(target, drafter, max_nodes, max_depth)``: a tree decoder over ``target`` (None: the
    engine's own); ``make_target``: a fresh tree target, the engine's own model (None: not white-box);
    ``make_reference``: a fresh model
    the oracle feeds plain one-token forwards; ``greedy(prompt, n, eos)``: plain greedy's tokens; ``atol``: how
    far the engine's state may be from the oracle's (0: bit for bit; an engine in another language declares
    its own, docs/protocol.md); ``no_state``: why the engine's committed state cannot be read (None: it can);
    ``make_probe``: a fresh tree target for ``tree.per-node-state`` only, where the engine's decoder verifies
    on its own model and takes none (a wire engine's ``tree_probe()``; None: ``make_target``).
    """

    make_decoder: Callable[[Any, Any, int, int], Any]
    make_target: Callable[[], Any] | None
    make_reference: Callable[[], Any]
    greedy: Callable[[Sequence[int], int, int | None], list[int]]
    vocab_size: int
    atol: float = 0.0
    no_state: str | None = None
    make_probe: Callable[[], Any] | None = None


@attrs.frozen(kw_only=True)
class TreeCase:
    """One drawn case: a prompt, a plan for every round's tree, the budget, an EOS (or None)."""

    prompt: tuple[int, ...]
    plan: TreePlan
    max_new_tokens: int
    max_nodes: int = 8
    max_depth: int = 4
    eos: int | None = None
    # an arbitrary tree (parents, tokens) after the prompt, for tree.per-node-state
    probe_parents: tuple[int, ...] = (-1,)
    probe_tokens: tuple[int, ...] = (0,)


@attrs.define
class TreeRun:
    """What one case produced: the tree engine's tokens, a chain's, plain greedy's, each round's
    record, and the committed state the engine held when each round began (``(processed, arrays)``)."""

    tokens: list[int]
    chain_tokens: list[int]
    greedy: list[int]
    rounds: tuple[Any, ...]
    committed: list[tuple[int, dict[str, np.ndarray]]]
    trees: list[TreeDraft]
    error: str | None = None


class _CommittedProbe:
    """The target as the decoder sees it, noting the committed state at the start of each tree verify."""

    def __init__(self, target: Any, log: list[tuple[int, dict[str, np.ndarray]]]) -> None:
        self._target = target
        self._log = log

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)

    def forward_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> Any:
        self._log.append((self._target.processed, self._target.state_arrays()))
        return self._target.forward_tree(tokens, parents)


def run_tree_case(subject: TreeSubject, case: TreeCase) -> TreeRun:
    """Run ``case`` on the tree engine with the plan's trees and with a chain (width 1), beside plain greedy."""
    oracle = subject.greedy(case.prompt, case.max_new_tokens, case.eos)
    reference = (*case.prompt, *oracle)
    run = TreeRun(tokens=[], chain_tokens=[], greedy=list(oracle), rounds=(), committed=[], trees=[])
    drafter = ScriptedTreeDrafter(case.plan, reference, vocab_size=subject.vocab_size)
    chain_plan = attrs.evolve(case.plan, width=1, winner_slot=0, shallow_twin=False)
    chain_drafter = ScriptedTreeDrafter(chain_plan, reference, vocab_size=subject.vocab_size)
    try:
        probe = _CommittedProbe(subject.make_target(), run.committed) if subject.make_target is not None else None
        decoder = subject.make_decoder(probe, drafter, case.max_nodes, case.max_depth)
        probe = probe if probe is not None else _CommittedProbe(decoder.target, run.committed)
        decoder.target = probe
        run.tokens = list(decoder.generate(case.prompt, case.max_new_tokens, eos_token_id=case.eos).tokens)
        run.rounds = tuple(decoder.last_rounds)
        run.committed.append((probe.processed, probe.state_arrays()))  # the state the last round committed
        run.trees = list(drafter.trees)
        chain_target = subject.make_target() if subject.make_target is not None else None
        chain = subject.make_decoder(chain_target, chain_drafter, case.max_nodes, case.max_depth)
        run.chain_tokens = list(chain.generate(case.prompt, case.max_new_tokens, eos_token_id=case.eos).tokens)
    except Exception as exc:  # the engine's failure is a finding, reported by every check
        run.error = f"{type(exc).__name__}: {exc}"
    return run


def _violation(invariant: str, explanation: str, **fields: Any) -> Violation:
    return Violation(invariant=invariant, explanation=explanation, **fields)


def _error(invariant: str, run: TreeRun, case: TreeCase) -> list[Violation]:
    return [_violation(invariant, f"the tree engine failed: {run.error}", example=_example(case))]


def _example(case: TreeCase) -> dict[str, object]:
    return {
        "prompt": list(case.prompt),
        "plan": attrs.asdict(case.plan),
        "max_new_tokens": case.max_new_tokens,
        "eos": case.eos,
        "probe_tree": {"parents": list(case.probe_parents), "tokens": list(case.probe_tokens)},
    }


def check_greedy_lossless(subject: TreeSubject, case: TreeCase, run: TreeRun) -> Result:
    """tree.greedy-lossless: the tree engine's output equals plain greedy's and a chain's."""
    if run.error:
        return _error("tree.greedy-lossless", run, case), 1, ""
    out: list[Violation] = []
    for what, got in (("a tree", run.tokens), ("a chain", run.chain_tokens)):
        if got != run.greedy:
            first = next((i for i, (a, b) in enumerate(zip(got, run.greedy, strict=False)) if a != b), None)
            out.append(
                _violation(
                    "tree.greedy-lossless",
                    f"decoding with {what} differs from plain greedy (first difference at token {first})",
                    expected=run.greedy,
                    actual=got,
                    example=_example(case),
                )
            )
    return out, 2, ""


def check_round_bounds(subject: TreeSubject, case: TreeCase, run: TreeRun) -> Result:
    """tree.round-bounds: 1 <= emitted <= depth + 1, and the accepted tokens are one root path plus a bonus."""
    if run.error:
        return _error("tree.round-bounds", run, case), 1, ""
    out: list[Violation] = []
    for index, r in enumerate(run.rounds):
        tree, path = r.tree, tuple(r.path)
        if not 1 <= len(r.emitted) <= tree.depth + 1:
            out.append(
                _violation(
                    "tree.round-bounds",
                    f"emitted {len(r.emitted)} tokens from a tree of depth {tree.depth}",
                    round=index,
                    expected=f"1..{tree.depth + 1}",
                    actual=len(r.emitted),
                    example=_example(case),
                )
            )
        is_path = all(0 <= n < len(tree) for n in path) and all(
            tree.parents[n] == (path[i - 1] if i else -1) for i, n in enumerate(path)
        )
        if (
            not is_path
            or tuple(r.accepted[:-1]) != tuple(tree.tokens[n] for n in path)
            or len(r.accepted) != len(path) + 1
        ):
            out.append(
                _violation(
                    "tree.round-bounds",
                    "the accepted tokens are not one root path of the tree plus a bonus token",
                    round=index,
                    expected=list(path),
                    actual=list(r.accepted),
                    example=_example(case),
                )
            )
    if not run.rounds:
        return out, 0, "the engine ran no tree round"
    return out, len(run.rounds), ""


def check_committed_state(subject: TreeSubject, case: TreeCase, run: TreeRun) -> Result:
    """tree.committed-state: the state held when each round begins equals a fresh model's fed that context."""
    if run.error:
        return _error("tree.committed-state", run, case), 1, ""
    if subject.no_state is not None:
        return [], 0, subject.no_state
    out: list[Violation] = []
    context = [*case.prompt, *run.tokens]
    for index, (processed, arrays) in enumerate(run.committed):
        ref = subject.make_reference()
        ref.forward(context[:processed])
        bad = states_differ(ref.state_arrays(), arrays, atol=subject.atol)
        if bad is not None:
            out.append(
                _violation(
                    "tree.committed-state",
                    f"the state committed before round {index} is not the accepted path's: {bad}",
                    round=index,
                    example=_example(case),
                )
            )
    if not run.committed:
        return out, 0, "the engine ran no tree round"
    return out, len(run.committed), ""


def check_well_formed(subject: TreeSubject, case: TreeCase, run: TreeRun) -> Result:
    """tree.well-formed: every tree verified had parents before children and fit its round's limits: at most
    ``max_nodes`` nodes and a depth of at most ``max_depth`` and the tokens still wanted less one (the bonus)."""
    if run.error:
        return _error("tree.well-formed", run, case), 1, ""
    out: list[Violation] = []
    emitted = 0
    for index, r in enumerate(run.rounds):
        tree = r.tree
        depth_limit = min(case.max_depth, MAX_TREE_DEPTH, case.max_new_tokens - emitted - 1)
        try:
            TreeDraft(tree.tokens, tree.parents).check(subject.vocab_size)
            if len(tree) > min(case.max_nodes, MAX_TREE_NODES) or tree.depth > depth_limit:
                raise DrafterContractError(
                    f"a tree of {len(tree)} nodes and depth {tree.depth} in a round that allows "
                    f"{case.max_nodes} nodes and depth {depth_limit}"
                )
        except DrafterContractError as exc:
            out.append(_violation("tree.well-formed", str(exc), round=index, example=_example(case)))
        emitted += len(r.emitted)
    if not run.rounds:
        return out, 0, "the engine ran no tree round"
    return out, len(run.rounds), ""


def check_per_node_state(subject: TreeSubject, case: TreeCase, run: TreeRun | None = None) -> Result:
    """tree.per-node-state (white-box): each node's logits row and the state its checkpoint restores equal
    a fresh model's fed the prompt and then the node's root path token by token (``run`` is not needed)."""
    make = subject.make_probe or subject.make_target
    if make is None:
        return [], 0, "the engine exposes no tree target (`tree_target()`) to read per-node state from"
    context, parents, tokens = list(case.prompt), case.probe_parents, case.probe_tokens
    out: list[Violation] = []
    target = make()
    target.forward(list(context))
    logits, checkpoints = target.forward_tree(list(tokens), list(parents))
    for node in range(len(tokens)):
        path = []
        walk = node
        while walk >= 0:
            path.append(walk)
            walk = parents[walk]
        ref = subject.make_reference()
        ref.forward(list(context))
        row = None
        for n in reversed(path):
            row = ref.forward([tokens[n]])[0]
        if row is None or not np.allclose(np.asarray(logits[node]), row, rtol=0.0, atol=subject.atol):
            out.append(
                _violation(
                    "tree.per-node-state", f"node {node}'s logits row is not its root path's", example=_example(case)
                )
            )
        target.restore(checkpoints[node])
        bad = states_differ(ref.state_arrays(), target.state_arrays(), atol=subject.atol)
        if bad is not None:
            out.append(
                _violation(
                    "tree.per-node-state",
                    f"node {node}'s state is not its root path's: {bad}",
                    example=_example(case),
                )
            )
    if not tokens:
        return out, 0, "the tree had no node"
    return out, len(tokens), ""
