"""How an engine case's examples are drawn and run: the random draw and the hand-picked ones.

``EngineExamples`` draws one example of an engine case (a prompt, k, a budget, an EOS
placement, a drafter: the subject's own, or a scripted round plan, now and then hostile)
and runs it (``_engine_runs``); ``explicit`` lists the hand-picked examples of the
known-hard paths, run before every search.
"""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import strategies as st

from specproof.conformance._engine_runs import EngineRun, RunCache, case_greedy, run_builtin, run_plugin
from specproof.conformance._probes import HostileDrafter
from specproof.conformance._subjects import EngineCase
from specproof.conformance.checks.features import feature_layers_of
from specproof.conformance.drivers._case_decode import draw_case_decode
from specproof.contract import DecodeParams
from specproof.strategies import PlannedRound, RoundPlan, ScriptedDrafter, contexts, round_plans

__all__ = ["EngineExamples"]


@attrs.define
class EngineExamples:
    """The examples of the engine cases of one plan, run through one certification's cache."""

    plan: Any  # the Plan
    cache: RunCache

    def greedy(self, case: EngineCase, prompt: list[int], n: int, eos: int | None) -> tuple[list[int], Any]:
        """Plain greedy for this case (memoized in the cache: one continuation per prompt)."""
        return case_greedy(
            case, self.plan.suite.target, prompt, n, eos, horizon=self.plan.profile.max_new_tokens, cache=self.cache
        )

    def draw(self, data: st.DataObject, case: EngineCase) -> EngineRun:
        """Draw one example of an engine case and run it (runs are cached by their inputs)."""
        profile, suite = self.plan.profile, self.plan.suite
        cap: int | None
        if case.kind == "builtin":
            assert suite.target is not None
            vocab, cap = suite.target.vocab_size, suite.target.max_context
            k = data.draw(st.integers(0, 8), label="k")
        else:
            vocab, cap = case.vocab_size, case.capacity
            k = case.k if case.k is not None else 4
        # max_new_tokens = 0 is a valid request (docs/contract.md, the decode convention): drawn too
        n = data.draw(st.integers(0, profile.max_new_tokens), label="max_new_tokens")
        if case.kind == "builtin" and case.capacity is not None:
            cap = case.capacity
        max_prompt = max(1, min(profile.max_prompt, cap - 1)) if cap is not None else profile.max_prompt
        # a prompt ending near the tested capacity (none when the engine declares no max_context)
        near_end = cap is not None and (
            cap <= 4 * profile.max_prompt or data.draw(st.integers(0, 23), label="near max_context") == 0
        )
        if near_end and cap is not None and data.draw(st.booleans(), label="prompt ends near max_context"):
            room = data.draw(st.integers(1, max(1, min(10, cap - 1))), label="free context slots")
            unit = data.draw(contexts(vocab, min_size=1, max_size=6), label="prompt unit")
            prompt = [unit[i % len(unit)] for i in range(max(1, cap - room))]
        else:
            prompt = data.draw(contexts(vocab, min_size=1, max_size=max_prompt), label="prompt")
        continuation, _ = self.greedy(case, prompt, n, None)
        eos_kind = data.draw(st.sampled_from(["none", "last block", "anywhere"]), label="eos placement")
        eos: int | None = None
        if eos_kind == "last block" and continuation:
            # EOS among the last k+1 greedy tokens before the budget: inside the last accepted block
            eos = data.draw(st.sampled_from(continuation[-(k + 1) :]), label="eos_token_id")
        elif eos_kind == "anywhere" and continuation:
            eos = data.draw(st.sampled_from(continuation), label="eos_token_id")
        scripted_ok = vocab >= 2 and (case.kind == "builtin" or case.takes_drafter)
        kind = data.draw(st.sampled_from(["scripted", "subject"]), label="drafter") if scripted_ok else "subject"
        plan = data.draw(round_plans(k=k, max_rounds=8), label="round plan") if kind == "scripted" else None
        hostile: tuple[str, int, int] | None = None
        if plan is not None and case.kind == "plugin":
            # the hostile-drafter rule: now and then a draft longer than k or out of range
            mode = data.draw(st.sampled_from([None] * 6 + list(HostileDrafter.MODES)), label="hostile drafts")
            if mode is not None:
                extra = data.draw(st.integers(1, 3), label="hostile extra tokens")
                hostile = (mode, extra, data.draw(st.integers(0, 3), label="hostile from call"))
        decode = draw_case_decode(data, case, vocab) if self.plan.decode_state else None
        return self.execute(case, prompt=prompt, k=k, n=n, eos=eos, plan=plan, hostile=hostile, decode=decode)

    def execute(
        self,
        case: EngineCase,
        *,
        prompt: list[int],
        k: int,
        n: int,
        eos: int | None,
        plan: RoundPlan | None,
        hostile: tuple[str, int, int] | None = None,
        decode: DecodeParams | None = None,
    ) -> EngineRun:
        suite, horizon = self.plan.suite, self.plan.profile.max_new_tokens
        drafter: Any = None
        script = None
        if plan is not None:
            continuation, _ = self.greedy(case, prompt, n, None)
            drafter = ScriptedDrafter(prompt, continuation, plan, vocab_size=case.vocab_size or 2)
            script = plan.describe()
            if hostile is not None:
                mode, extra, start = hostile
                longer, _ = self.greedy(case, prompt, n + k + extra, None)
                drafter = HostileDrafter(
                    drafter, prompt, longer, mode=mode, extra=extra, start=start, vocab_size=case.vocab_size or 2
                )
                script += f" hostile={mode}+{extra} from call {start}"
        if case.kind == "builtin":
            t, d = suite.target, suite.drafter
            assert t is not None and d is not None
            subject = d.make()
            # a feature drafter's layers: the engine hands features to it, or to the scripted drafter in its place
            layers = feature_layers_of(subject)
            if layers is not None and not set(layers) <= set(getattr(t.prototype, "feature_layers", ())):
                layers = None
            return run_builtin(
                make_target=t.make,
                drafter=drafter if drafter is not None else subject,
                feature_layers=layers,
                drafter_kind=f"scripted:{d.name}" if drafter is not None else f"subject:{d.name}",
                prompt=prompt,
                k=k,
                rollback=case.rollback or "replay",
                max_new_tokens=n,
                eos=eos,
                atol=case.atol,
                tie_tolerance=case.tie_tolerance,
                cache_key=("target", t.spec, d.spec),
                # plain greedy depends on the target alone: the key `greedy` (case_greedy) uses, one continuation
                greedy_key=("target", t.spec),
                horizon=horizon,
                cache=self.cache,
                capabilities=case.exposes(),
                script=script,
                decode=decode,
            )
        return run_plugin(
            case,
            prompt=prompt,
            max_new_tokens=n,
            eos=eos,
            drafter=drafter,
            drafter_kind="scripted" if drafter is not None else "engine's own",
            atol=case.atol,
            tie_tolerance=case.tie_tolerance,
            horizon=horizon,
            cache=self.cache,
            script=script,
            decode=decode,
        )

    def explicit(self, case: EngineCase) -> list[dict[str, Any]]:
        """Hand-picked examples for the known-hard paths, run before the search on every profile."""
        suite = self.plan.suite
        vocab = case.vocab_size or (suite.target.vocab_size if suite.target else 0)
        if vocab < 2 or not (case.kind == "builtin" or case.takes_drafter):
            return []
        k = case.k if case.kind == "plugin" and case.k is not None else 3
        if k < 2:
            return []
        full, empty = PlannedRound(draft_length=k, correct=k), PlannedRound(draft_length=0, correct=0)
        partial, zero = PlannedRound(draft_length=k, correct=1), PlannedRound(draft_length=k, correct=0)
        prompt = [i % vocab for i in (1, 2, 3, 1, 2)]
        out = [
            # a full accept, then an empty draft right after it (stale state after a zero-draft step)
            {"prompt": prompt, "k": k, "n": 4 * (k + 1), "plan": RoundPlan((full, empty, partial, zero)), "eos": None},
            # a partial accept and a rejection at 0 (rollback into the middle of a draft, and to the base)
            {"prompt": prompt, "k": k, "n": 3 * (k + 1), "plan": RoundPlan((partial, zero, full)), "eos": None},
        ]
        cap = case.capacity or (suite.target.max_context if suite.target else None)
        # At quick, the built-in decoder meets max_context in the rollback machine (a third of its
        # conversations end there); a long prefill per case is what the developer loop cannot afford.
        builtin_at_quick = case.kind == "builtin" and self.plan.profile.name == "quick"
        if cap is not None and cap > k + 3 and not builtin_at_quick:
            # a prompt that ends within k + 1 of max_context: the round bound is clamped by the context
            out.append(
                {
                    "prompt": [prompt[i % len(prompt)] for i in range(cap - 2)],
                    "k": k,
                    "n": 4,
                    "plan": RoundPlan((full, partial)),
                    "eos": None,
                }
            )
        continuation, _ = self.greedy(case, prompt, 2 * (k + 1), None)
        if len(continuation) > k:
            # EOS inside the last fully accepted block, before the length cap
            eos = continuation[-k]
            if eos not in continuation[:-k]:
                out.append({"prompt": prompt, "k": k, "n": 2 * (k + 1), "plan": RoundPlan((full,)), "eos": eos})
        crossing = _cap_crossing_eos(continuation, prompt=prompt, k=k, full=full, empty=empty)
        if crossing is not None:
            out.append(crossing)
        if case.kind == "plugin":
            # the hostile-drafter rule: a draft longer than k, and one with an id outside the vocabulary
            n = 2 * (k + 1)
            for hostile in (("overlong", 2, 0), ("out_of_range", 1, 0)):
                out.append(
                    {"prompt": prompt, "k": k, "n": n, "plan": RoundPlan((full,)), "eos": None, "hostile": hostile}
                )
        return out


def _cap_crossing_eos(
    continuation: list[int], *, prompt: list[int], k: int, full: PlannedRound, empty: PlannedRound
) -> dict[str, Any] | None:
    """A speculative block that reaches ``max_new_tokens`` with EOS inside the budget, past its first token.

    The EOS is the first occurrence of a greedy token at position ``p + 1``; rounds of
    full accepts and empty drafts bring the context to ``p``; the budget is ``p + 3``, so
    the last round drafts two tokens (the second is EOS) and its block ``[t, EOS, bonus]``
    ends exactly at the cap. An engine that does not bound its draft by the budget
    verifies a longer block that crosses it; one that cuts such a block at the cap, or
    scans only the block's first or last token for EOS, emits past the EOS. A correct
    engine stops at the EOS with one token of budget left.
    """
    if k < 2:
        return None
    end = min(len(continuation) - 1, 2 * (k + 1))
    firsts = [q for q in range(1, end) if continuation[q] not in continuation[:q]]
    if not firsts:
        return None
    p = firsts[-1] - 1
    whole, rest = divmod(p, k + 1)
    rounds = (full,) * whole + (empty,) * rest + (full,)
    return {"prompt": prompt, "k": k, "n": p + 3, "plan": RoundPlan(rounds), "eos": continuation[p + 1]}
