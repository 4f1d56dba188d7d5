"""The ``tree-cases`` driver: each tree invariant's Hypothesis search over tree cases (docs/contract.md,
"Trees").

It applies to every engine case that verifies trees: the built-in stack on the reference hybrid (the
greedy ``TreeSpecDecoder`` with the case's rollback) and a plug-in engine with ``tree_decoder(drafter,
*, max_nodes, max_depth, target=None)`` (and, for the white-box check, ``tree_target()``); any other
case is skipped, saying why. Each example draws a ``TreeCase``: a prompt, a ``TreePlan`` for every
round's tree (shrinking to one node), a budget, an EOS from plain greedy's output (so EOS lands on
non-first branches too) and an arbitrary probe tree for ``tree.per-node-state``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import hypothesis
from hypothesis import strategies as st

from specproof.conformance._engine_runs import case_greedy
from specproof.conformance._records import Capabilities
from specproof.conformance.checks.tree import TreeCase, TreeSubject
from specproof.conformance.drivers._protocol import CheckItem, Driver, NotApplicable, require
from specproof.contract import ViolationError
from specproof.engine import TreeSpecDecoder
from specproof.strategies import tree_parents, tree_plans

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._results import CheckResult
    from specproof.conformance._subjects import EngineCase

__all__ = ["TreeDriver", "tree_subject_of"]

MAX_NEW_TOKENS = 12
MAX_PROMPT = 12
MAX_NODES = 10
MAX_DEPTH = 4


def tree_subject_of(engine: Any, *, greedy: Any, make_reference: Any, vocab_size: int) -> TreeSubject | None:
    """A plug-in engine as a tree subject (None when it has no ``tree_decoder``)."""
    make = getattr(engine, "tree_decoder", None)
    if not callable(make):
        return None

    def make_decoder(target: Any, drafter: Any, max_nodes: int, max_depth: int) -> Any:
        return make(drafter, max_nodes=max_nodes, max_depth=max_depth, target=target)

    tree_target = getattr(engine, "tree_target", None)
    return TreeSubject(
        make_decoder=make_decoder,
        make_target=tree_target if callable(tree_target) else None,
        make_reference=make_reference,
        greedy=greedy,
        vocab_size=vocab_size,
        atol=float(getattr(engine, "atol", 0.0)),
        no_state=getattr(engine, "no_state_reason", None),
        make_probe=getattr(engine, "tree_probe", None),
    )


@st.composite
def tree_cases(draw: st.DrawFn, *, vocab_size: int, greedy: Any, max_prompt: int) -> TreeCase:
    prompt = tuple(draw(st.lists(st.integers(0, vocab_size - 1), min_size=1, max_size=max_prompt), label="prompt"))
    n = draw(st.integers(1, MAX_NEW_TOKENS), label="max_new_tokens")
    eos_at = draw(st.none() | st.integers(0, n - 1), label="eos position")
    eos = None
    if eos_at is not None:
        out = greedy(prompt, n, None)
        eos = out[eos_at] if eos_at < len(out) else None
    parents = draw(tree_parents(max_nodes=6), label="probe tree")
    tokens = tuple(draw(st.lists(st.integers(0, vocab_size - 1), min_size=len(parents), max_size=len(parents))))
    return TreeCase(
        prompt=prompt,
        plan=draw(tree_plans(max_width=3, max_levels=MAX_DEPTH), label="tree plan"),
        max_new_tokens=n,
        max_nodes=MAX_NODES,
        max_depth=MAX_DEPTH,
        eos=eos,
        probe_parents=parents,
        probe_tokens=tokens,
    )


class TreeDriver(Driver):
    """Tree cases on each engine case that verifies trees."""

    name = "tree-cases"
    options: ClassVar[tuple[str, ...]] = ("trees",)  # (widened: the tree-sampling driver adds one)

    def run(self, item: CheckItem, result: CheckResult) -> None:
        inv, case = item.invariant, item.engine
        assert case is not None
        subject = self._subject(case)
        has = {"tree", *(("tree_state",) if (subject.make_target or subject.make_probe) is not None else ())}
        require(
            inv,
            Capabilities(
                has=has,
                why_not={
                    "tree_state": "the engine exposes no tree target (`tree_target()`; over the wire, capability "
                    "`tree_state`) to read per-node state"
                },
            ),
        )
        strategy = tree_cases(
            vocab_size=subject.vocab_size,
            greedy=subject.greedy,
            max_prompt=min(self.plan.profile.max_prompt, MAX_PROMPT),
        )
        notes: list[str] = []

        @hypothesis.given(data=st.data())
        def search(data: st.DataObject) -> None:
            result.examples += 1
            outcome = inv.check(subject, data.draw(strategy, label="tree case"))
            result.exercised += outcome.exercised
            if outcome.note and not outcome.exercised:
                notes.append(outcome.note)
            if outcome.violations:
                raise ViolationError(outcome.violations)

        self.context.replay.settings(search, max_examples=self.plan.profile.max_examples, item=item)()
        if not result.exercised:
            result.skip(notes[0] if notes else "no tree case reached this check")

    def _subject(self, case: EngineCase) -> TreeSubject:
        """The case as a tree subject (``NotApplicable`` saying why when it does not verify trees)."""
        plan, cache = self.plan, self.context.cache
        horizon = plan.profile.max_new_tokens

        def greedy(prompt: Sequence[int], n: int, eos: int | None) -> list[int]:
            tokens, _ = case_greedy(case, plan.suite.target, list(prompt), n, eos, horizon=horizon, cache=cache)
            return list(tokens)[:n]

        if case.kind == "builtin":
            target = plan.suite.target
            model = target.make() if target is not None else None
            if not callable(getattr(model, "forward_tree", None)) or target is None:
                raise NotApplicable(
                    "the built-in tree decoder needs a target with `forward_tree` (the reference hybrid, a Core ML "
                    "bundle exported with `--tree`)"
                )
            rollback: Any = "checkpoint" if case.rollback == "checkpoint" else "replay"
            make_model = target.make

            def make_decoder(tgt: Any, drafter: Any, max_nodes: int, max_depth: int) -> Any:
                return TreeSpecDecoder(
                    tgt if tgt is not None else make_model(),
                    drafter,
                    max_nodes=max_nodes,
                    max_depth=max_depth,
                    rollback=rollback,
                )

            return TreeSubject(
                make_decoder=make_decoder,
                make_target=make_model,
                make_reference=make_model,
                greedy=greedy,
                vocab_size=case.vocab_size,
                atol=float(target.atol),  # the target's declared tolerance (0 for the reference hybrid)
            )
        if case.make_reference is None:
            raise NotApplicable("the engine gives no model to compare a tree's state with (`oracle`)")
        subject = tree_subject_of(
            case.engine, greedy=greedy, make_reference=case.make_reference, vocab_size=case.vocab_size
        )
        if subject is None:
            if isinstance(getattr(case.engine, "capabilities", None), frozenset):  # a wire engine's handshake
                raise NotApplicable("the engine does not declare the `trees` capability: it does not verify trees")
            raise NotApplicable(
                "the engine has no tree_decoder(drafter, *, max_nodes, max_depth): it does not verify trees"
            )
        return subject
