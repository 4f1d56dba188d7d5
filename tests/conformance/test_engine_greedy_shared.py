"""A built-in engine case decodes each prompt's plain greedy once: the draw's scripted drafter and the
run's judge read one continuation (plain greedy depends on the target alone, not on the drafter)."""

from __future__ import annotations

from specproof.conformance._engine_runs import RunCache
from specproof.conformance._plan import Plan
from specproof.conformance.drivers._engine_draws import EngineExamples
from specproof.strategies import PlannedRound, RoundPlan


def test_a_scripted_run_and_its_judge_share_one_greedy_continuation() -> None:
    plan = Plan.create("all", only=("engine.lossless",), max_context=256)
    try:
        case = next(c for c in plan.suite.engines if c.kind == "builtin")
        cache = RunCache()
        examples = EngineExamples(plan=plan, cache=cache)
        prompt = [3, 1, 4, 1, 5]
        script = RoundPlan((PlannedRound(draft_length=2, correct=1),))
        run = examples.execute(case, prompt=prompt, k=2, n=4, eos=None, plan=script)
        assert run.record is not None
        greedy_keys = [key for key in cache.greedy if isinstance(key, tuple) and key[1] == tuple(prompt)]
        assert len(greedy_keys) == 1, greedy_keys  # one continuation for the drafter and the judge
        expected, _ = examples.greedy(case, prompt, 4, None)
        assert list(run.record.generation.tokens) == expected  # what the judge compared with
    finally:
        plan.close()
