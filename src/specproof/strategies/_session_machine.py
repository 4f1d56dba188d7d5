"""``SessionMachine``: request sequences on one live engine, each compared with plain greedy.

Engines keep caches between ``generate`` calls: prefix caching (a prompt sharing a prefix
with the last context reuses its KV and recurrent state), multi-turn chat (the last
context plus a user turn), "regenerate" (the same prompt again) and edited prompts. A
bug there only shows after the right *sequence* of requests: a rollback across a call
boundary that reaches further back than the snapshots the engine kept restores stale conv
or recurrent state, silently. Every other check builds a fresh engine per example, so it
never sees one.

The machine holds ONE engine instance for a whole run and issues requests to it:

- ``new_prompt``: a prompt from ``contexts`` (sometimes long; sometimes sharing nothing
  with any earlier context);
- ``regenerate``: the last request's prompt again (maybe with another budget and EOS);
- ``edit``: the last context (prompt + output) cut at a drawn point — inside the prompt,
  inside the output, or right at its end — then a diverging suffix;
- ``multi_turn``: the last context plus a user turn (sometimes an earlier context plus
  a turn: a branch);
- ``earlier_prefix``: a prefix of an *earlier* context (most often exactly an earlier
  request's prompt), so the engine must reach further back than the last call's snapshots;
- ``reset``: ``engine.reset()``, where the engine has one (never straight after a cold start,
  and no ``new_prompt`` there either: a one-request session tests what a fresh engine does);
- ``relate``: a request with a drawn relation to the last one (the coverage model of requests,
  ``_request_relations``), one this example has not reached yet while there is one; ``toured()``
  is the machine whose every example starts with a tour of every relation (a regenerate and a
  user turn after ``reset()``, an equal block after a different prefix, early and late edits...):
  the session driver runs one example of it where a run left a relation unreached, so each is
  reached at quick.

Every request's relation to the one before is counted in ``observed`` (``RELATION_TAG``).

Each request draws its ``max_new_tokens`` and an EOS (none, among the greedy
continuation's tokens, or — most often — among its last ``k + 1`` tokens before the
budget, where an EOS lands inside the last accepted block). Where the engine has a
settable ``drafter`` (or the harness passes a ``set_drafter`` hook), the machine draws a
``RoundPlan`` and installs a ``ScriptedDrafter`` for the request, so the engine is driven
down every rollback path on any target. Up to two rules are switched off per run (swarm
testing on top of Hypothesis's own), so each run stresses a different mix.

Where the machine installs the drafter itself and the engine's feature layers are known (its
own drafter is a feature drafter, or ``feature_layers`` is given) with a model to compute
features on (``feature_reference_factory``, default ``reference_factory``), most requests
install it as a *feature* drafter declaring those layers (the request's ``feature_layers``):
the engine must hand it the target's features of exactly ``ctx[:-1]`` at every proposal, on
prefix hits, edits, regenerations and user turns, judged against a fresh copy of the model
fed plain forwards (``FeatureJudge``; the target's own outputs and state are judged first).

Given ``decode_features`` (``--decode-state``: the processors the engine declares) and a
``decode_reference_factory``, half the requests carry drawn ``DecodeParams`` (``processor_configs``), passed
as ``decode=`` and judged exactly against plain decoding with them (``_session_decode``); the history
records them, and without ``decode_features`` nothing more is drawn.

Every request's tokens are compared with plain greedy from the oracle, tie-aware
(``compare_lossless``), and its length and stop reason are checked. Given a
``reference_factory`` and an engine whose live ``target`` has ``state_arrays()``, the
target must also hold exactly the context after each request (a stale state that the next
tokens do not reveal — a short conv window refilled, a decaying recurrent state, a zero
budget — shows there). A failure raises a
``SessionFailure`` (``_session_runner``) whose ``example`` holds the whole request history
(``{"history": [...], "failing_request": i}``); certification reports it as a violation of
the session invariant (docs/contract.md). ``SessionHistory`` (``_session_history``) saves it
as a session history file (``specproof.formats.session``), and ``replay_session`` replays it on a fresh engine,
installing the same scripted drafts, so it fails again; ``shrink_history`` shortens it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule, run_state_machine_as_test

from specproof.strategies._contexts import contexts
from specproof.strategies._local_constants import no_local_constants
from specproof.strategies._session_relation_rules import RelationRules
from specproof.strategies._session_requests import RELATION_TAG, REUSE_UNREPORTED, _count_of, _draw_turn
from specproof.strategies._session_runner import GreedyOracle, SetDrafter

__all__ = ["RELATION_TAG", "REUSE_UNREPORTED", "SessionMachine", "run_session_machine"]

# Rules a run may switch off (swarm testing: a run with new_prompt and reset off is one long session).
_SWITCHABLE: tuple[str, ...] = (
    "branch_back",
    "relate",
    "new_prompt",
    "regenerate",
    "edit",
    "multi_turn",
    "earlier_prefix",
    "reset",
)


def _switched_on(name: str) -> Callable[[SessionMachine], bool]:
    return lambda self: name not in self.disabled


class SessionMachine(RelationRules):
    """Requests on one live engine, each compared with plain greedy (abstract: use ``configure``).

    See the module docstring for the rules. ``observed`` (per configured class) counts
    the request kinds, drafter choices and EOS placements exercised; ``SessionRequests`` issues
    the requests and ``RelationRules`` holds the ``relate`` rule and the relation coverage.
    """

    @initialize(data=st.data())
    def first_request(self, data: Any) -> None:
        """Draw which rules this run uses (swarm testing), then the session's first prompt."""
        # at most two rules off: a run left with one rule (only regenerate, only new prompts) tests little
        off = data.draw(st.sets(st.sampled_from(_SWITCHABLE), max_size=0), label="rules off")
        self.disabled = frozenset(off)
        prompt, note = self._fresh_prompt(data)
        self._request(data, "new_prompt", prompt, note)
        # a tour of every relation in every example of a machine that forces it (``toured()``: what the
        # certificate's coverage falls back on); otherwise the relate rule draws them
        if self.force_tour:
            for relation in self._missing():
                self._relate(data, relation)

    # not straight after a cold start either: sessions of a single request test nothing a fresh engine does not
    @precondition(lambda self: "new_prompt" not in self.disabled and self.since_cold >= 2)
    @rule(data=st.data())
    def new_prompt(self, data: Any) -> None:
        """A new prompt: ordinary, long, or sharing nothing with any earlier context."""
        prompt, note = self._fresh_prompt(data)
        self.since_cold = 0
        self._request(data, "new_prompt", prompt, note)

    @precondition(_switched_on("regenerate"))
    @rule(data=st.data())
    def regenerate(self, data: Any) -> None:
        """The last request's prompt again (its budget and EOS drawn afresh)."""
        self._request(data, "regenerate", list(self.last_prompt), "the previous prompt again")

    @precondition(_switched_on("edit"))
    @rule(data=st.data())
    def edit(self, data: Any) -> None:
        """The last context cut at a drawn point (in the prompt, in the output, at its end), then a new suffix."""
        base = self.contexts[-1]
        prompt_len = len(self.last_prompt)
        cap = self.prompt_limit - 1  # room for at least one suffix token
        where = data.draw(
            st.sampled_from(("inside_output", "output_end", "inside_prompt", "anywhere")), label="edit point kind"
        )
        if where == "inside_output" and len(base) > prompt_len:
            lo, hi = prompt_len, len(base) - 1
        elif where == "output_end":
            lo = hi = len(base)
        elif where == "inside_prompt":
            lo, hi = 1, max(1, prompt_len - 1)
        else:
            lo, hi = 1, len(base)
        hi = min(hi, cap)
        lo = min(lo, hi)
        cut = data.draw(st.integers(lo, hi), label="edit point")
        room = self.prompt_limit - cut
        suffix = data.draw(
            contexts(self.cfg.vocab_size, min_size=1, max_size=min(8, room), kinds=self.cfg.context_kinds),
            label="new suffix",
        )
        suffix = [int(t) for t in suffix]
        if cut < len(base) and suffix[0] == base[cut]:
            suffix[0] = (suffix[0] + 1) % self.cfg.vocab_size  # diverge right at the edit point
        prompt = [*base[:cut], *suffix]
        self._count(f"edit:{where}")
        note = f"the last context ({prompt_len} prompt + {len(base) - prompt_len} output tokens) cut at {cut} ({where})"
        self._request(data, "edit", prompt, note + f", then {_count_of(len(suffix), 'new token')}")

    # Named to sort first: Hypothesis lists rules alphabetically and its simplest program repeats
    # the first, so even the first (simplest) example of a run crosses two call boundaries.
    @precondition(lambda self: "branch_back" not in self.disabled and len(self.contexts[-1]) < self.prompt_limit)
    @rule(data=st.data())
    def branch_back(self, data: Any) -> None:
        """A user turn on the last context, then the prompt before it again: back across two call boundaries.

        What a chat user does who goes on, then returns to regenerate the earlier answer;
        the engine needs the state it had at the end of that earlier prompt, two requests back.
        """
        before = list(self.last_prompt)
        base = self.contexts[-1]
        turn = _draw_turn(data, self.cfg, room=self.prompt_limit - len(base))
        prompt = [*base, *turn]
        self._request(data, "multi_turn", prompt, f"the last context ({len(base)} tokens) + a {len(turn)}-token turn")
        self._count("branch_back")
        self._request(data, "earlier_prefix", before, "back to the prompt before that turn (two calls back)")

    def _fits_a_turn(self) -> bool:
        return any(len(c) < self.prompt_limit for c in self.contexts)

    @precondition(lambda self: "multi_turn" not in self.disabled and self._fits_a_turn())
    @rule(data=st.data())
    def multi_turn(self, data: Any) -> None:
        """A context (prompt + output) and a user turn of 1..8 tokens.

        Usually the last context; sometimes an earlier one (a branch: the user goes back and
        writes another turn there), which reaches behind the last call's snapshots.
        """
        fits = [i for i, c in enumerate(self.contexts) if len(c) < self.prompt_limit]
        last = len(self.contexts) - 1
        which = "last" if last in fits else "earlier"
        if which == "last" and len(fits) > 1:
            which = data.draw(st.sampled_from(("last", "earlier")), label="turn on which context")
        if which == "earlier":
            earlier = [i for i in fits if i != last]
            back = data.draw(st.sampled_from(earlier[::-1]), label="earlier context (latest first)")
        else:
            back = last
        base = self.contexts[back]
        turn = _draw_turn(data, self.cfg, room=self.prompt_limit - len(base))
        prompt = [*base, *turn]
        self._count(f"multi_turn:{which}")
        where = "the last context" if back == last else f"context {back} of {len(self.contexts)}"
        self._request(data, "multi_turn", prompt, f"{where} ({len(base)} tokens) + a {len(turn)}-token turn")

    @precondition(_switched_on("earlier_prefix"))
    @rule(data=st.data())
    def earlier_prefix(self, data: Any) -> None:
        """A prefix of an earlier context: a rollback past the last call's snapshots.

        Most often exactly an earlier request's prompt (a user going back to regenerate an
        older turn: the engine's snapshot from that call is the one it needs), else a drawn cut.
        """
        # the context before the last one is where a rollback crosses two call boundaries
        which = "any"
        if len(self.contexts) >= 2:
            which = data.draw(st.sampled_from(("any", "before_last")), label="which context")
        if which == "before_last":
            back = len(self.contexts) - 2
        else:
            back = data.draw(st.integers(0, len(self.contexts) - 1), label="which earlier context (0 = oldest)")
        ctx = self.contexts[back]
        where = data.draw(st.sampled_from(("its_prompt", "anywhere", "its_prompt")), label="prefix kind")
        if where == "its_prompt" and self.prompt_lengths[back] <= self.prompt_limit:
            cut = self.prompt_lengths[back]
        else:
            cut = data.draw(st.integers(1, min(len(ctx), self.prompt_limit)), label="prefix length")
        self._count(f"earlier_prefix:{where}")
        note = f"the first {cut} tokens of context {back} of {len(self.contexts)} ({len(ctx)} tokens; {where})"
        self._request(data, "earlier_prefix", ctx[:cut], note)

    # not straight after a cold start: a reset there tests nothing a fresh engine does not
    @precondition(lambda self: "reset" not in self.disabled and self.runner.can_reset and self.since_cold >= 2)
    @rule()
    def reset(self) -> None:
        """``engine.reset()``: the engine must forget its caches (the next request starts cold)."""
        self._reset()


def run_session_machine(
    *,
    engine_factory: Callable[[], Any],
    greedy: GreedyOracle,
    vocab_size: int,
    max_context: int | None = None,
    tie_tolerance: float = 0.0,
    max_prompt: int = 32,
    max_new_tokens: int = 12,
    set_drafter: SetDrafter | None = None,
    context_kinds: Iterable[str] | None = None,
    stateful_step_count: int = 10,
    reference_factory: Callable[[], Any] | None = None,
    atol: float = 0.0,
    feature_layers: Iterable[int] | None = None,
    feature_reference_factory: Callable[[], Any] | None = None,
    settings: Settings | None = None,
) -> type[SessionMachine]:
    """Configure a ``SessionMachine`` and run it (``run_state_machine_as_test``).

    Raises the shrunk failure (a ``SessionFailure`` whose example is the whole history);
    returns the configured class
    (its ``observed`` counts what was exercised). It draws inside ``no_local_constants()``: the same
    examples in every process (docs/contract.md).
    """
    machine = SessionMachine.configure(
        engine_factory=engine_factory,
        greedy=greedy,
        vocab_size=vocab_size,
        max_context=max_context,
        tie_tolerance=tie_tolerance,
        max_prompt=max_prompt,
        max_new_tokens=max_new_tokens,
        set_drafter=set_drafter,
        context_kinds=context_kinds,
        stateful_step_count=stateful_step_count,
        reference_factory=reference_factory,
        atol=atol,
        feature_layers=feature_layers,
        feature_reference_factory=feature_reference_factory,
    )
    with no_local_constants():  # the same examples in every process, whatever local code it imported
        run_state_machine_as_test(machine, settings=settings or machine.TestCase.settings)
    return machine
