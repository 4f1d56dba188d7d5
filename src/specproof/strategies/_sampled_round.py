"""The ``RollbackMachine``'s sampled round: one round at ``temperature > 0``, between greedy ones.

The machine cannot predict a sampled round's tokens, so it judges their shape and what must hold
whatever was drawn (docs/contract.md, "Sampling"): the round keeps a prefix of its draft and ends
with one token of the target's (or stops at ``max_new_tokens``); every token has probability > 0
under the oracle's processed distribution ``p``; a replacement differs from the draft token it
replaced. The emitted tokens then become part of the context, and the machine's invariants (the
context, the KV length, the restored state) hold after the round as after any other.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from specproof.contract.sampling import SAMPLING_SCHEMES, SamplingParams, processed_distribution

__all__ = ["SampledRounds", "sampling_params"]


def sampling_params() -> st.SearchStrategy[SamplingParams]:
    """Sampling parameters a round is drawn at: temperature 0.7-2.5, top-k off or 2-8, top-p off or
    0.7-0.99, a seed; shrinks toward temperature 0.7 with no filter and seed 0."""
    return st.builds(
        SamplingParams,
        temperature=st.floats(0.7, 2.5),
        top_k=st.one_of(st.just(0), st.integers(2, 8)),
        top_p=st.one_of(st.just(1.0), st.floats(0.7, 0.99)),
        seed=st.integers(0, 2**32 - 1),
    )


def takes_sampling(session: Any) -> bool:
    """The session's ``generate`` takes ``sampling=`` (a custom decoder may not sample)."""
    try:
        return "sampling" in inspect.signature(session.generate).parameters
    except (TypeError, ValueError):
        return False


class SampledRounds:
    """The sampled-round rule, mixed in front of ``RollbackMachine`` by ``configure(sampled_rounds=True)``
    (it uses the machine's judging half). Without it the machine's rules, and so its examples, are
    the greedy machine's exactly."""

    sampled_scheme: str | None = None  # the scheme this conversation samples by (drawn at its first sampled round)

    def _conversation_started(self, data: Any) -> None:
        """A new conversation draws its scheme at its first sampled round (nothing is drawn here, so the
        conversations themselves are drawn as in the greedy machine)."""
        self.sampled_scheme = None

    @precondition(lambda self: self.session is not None and len(self.ctx) <= self.max_context)
    @rule(data=st.data())
    def sampled_round(self, data: Any) -> None:
        """One scripted round at drawn sampling parameters; its tokens join the context."""
        me: Any = self
        if not takes_sampling(me.session):
            return
        from specproof.strategies._rounds import PlannedRound, RoundPlan, ScriptedDrafter

        decoder = me.decoder
        if self.sampled_scheme is None and hasattr(decoder, "scheme"):  # the decoder has a choice: draw it
            self.sampled_scheme = decoder.scheme = data.draw(st.sampled_from(SAMPLING_SCHEMES), label="sampling scheme")
        params = data.draw(sampling_params(), label="sampling")
        # the draft is plain greedy's continuation: at temperature > 0 its tokens are kept or rejected
        # at random, so every path is reached and a rejected token has mass a wrong residual can redraw
        length = data.draw(st.integers(1, max(me.k, 1)), label="draft length") if me.k else 0
        planned = PlannedRound(draft_length=length, correct=length)
        budget, _ = me._draw_budget_and_eos(data, eos=False)

        upcoming = me._greedy(me.k + 1)
        script = ScriptedDrafter(me.ctx, upcoming, RoundPlan((planned,)), vocab_size=me.vocab_size)
        me.drafter.script = script
        me.last_step = f"sampled_round(planned={planned}, max_new_tokens={budget}, sampling={params.describe()})"
        try:
            gen = me.session.generate(budget, max_rounds=1, sampling=params)
        finally:
            me.drafter.script = None
        me.rounds += 1
        draft = list(script.calls[-1][3]) if script.calls else []
        got = [int(t) for t in gen.tokens]
        me.last_step += f"; draft={draft}, emitted={got}"
        self._judge_sampled(draft, got, budget, params)
        me.ctx.extend(got)
        event("RollbackMachine round: sampled")
        type(me).observed_paths["round:sampled"] += 1

    def _judge_sampled(self, draft: list[int], got: list[int], budget: int, params: SamplingParams) -> None:
        me: Any = self
        room = me.max_context - (len(me.ctx) - 1)
        if room < 1:
            if got:
                me._fail("stop", f"the round emitted {got} with no room left in the context")
            return
        if not 1 <= len(got) <= min(len(draft) + 1, budget):
            me._fail("sampled", f"the round emitted {len(got)} tokens for a draft of {len(draft)} (budget {budget})")
        cut = len(got) == budget  # max_new_tokens may end the round on a kept draft token
        if got[:-1] != draft[: len(got) - 1]:
            me._fail("sampled", f"the round emitted {got}, which does not keep a prefix of its draft {draft}")
        j = len(got) - 1
        if j < len(draft) and got[j] == draft[j] and not cut:
            me._fail(
                "sampled",
                f"the round ended with {got[j]}, the draft token it rejected (draft[{j}]): a replacement is drawn "
                "from max(0, p - q), which excludes it",
            )
        me._feed_reference(me.ctx[:-1])  # the machine's reference, fed on incrementally (it stays in step)
        rows = np.asarray(me.reference.forward([me.ctx[-1], *got[:-1]]), dtype=np.float64)
        me._ref_fed = [*me.ctx, *got[:-1]]
        for i, token in enumerate(got):
            if processed_distribution(rows[i], params)[token] <= 0.0:
                me._fail(
                    "sampled",
                    f"token {i} of the round ({token}) has probability 0 under p at {params.describe()}: "
                    "plain sampling never emits it",
                )
