"""ModelDrafter and CombinedDrafter: drafts equal a fresh drafter's, the cost of a proposal, specs, the zoo."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specproof.conformance import get
from specproof.conformance.checks.drafter import check_deterministic
from specproof.conformance.zoo import _model_drafters as zoo
from specproof.engine import (
    InvalidSettingError,
    PluginError,
    ReferenceConfig,
    ReferenceHybrid,
    SpecDecoder,
    greedy_decode,
)
from specproof.engine.drafters import CombinedDrafter, ModelDrafter, NgramDrafter
from specproof.plugins import drafter_factory, load_drafter, load_target

SMALL = "reference:d_model=16,n_heads=2,n_kv_heads=1,head_dim=8,ffn_dim=32,max_context=96,layers=conv+attn+gdn"


def small_model(seed: int = 3, max_context: int = 96) -> ReferenceHybrid:
    cfg = ReferenceConfig(
        vocab_size=256,
        d_model=16,
        n_heads=2,
        n_kv_heads=1,
        head_dim=8,
        ffn_dim=32,
        layers=("conv", "attn", "gdn"),
        max_context=max_context,
        seed=seed,
    )
    return ReferenceHybrid(cfg)


def fresh_draft(context: list[int], k: int, **kw: object) -> list[int]:
    return ModelDrafter(small_model(), **kw).propose(context, k)  # type: ignore[arg-type]


def _greedy(context: list[int], k: int) -> list[int]:
    m = small_model()
    row = m.forward(context)[-1]
    out = [int(row.argmax())]
    while len(out) < k:
        out.append(int(m.forward([out[-1]])[-1].argmax()))
    return out


tokens = st.lists(st.integers(0, 255), min_size=1, max_size=40)


@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
def test_draft_is_the_draft_models_greedy_continuation(rollback: str) -> None:
    ctx = list(b"def f(x):\n    return x")
    assert fresh_draft(ctx, 5, rollback=rollback) == _greedy(ctx, 5)


@settings(max_examples=20)
@given(
    ctx=tokens,
    steps=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 3), st.integers(0, 5)), min_size=1, max_size=8),
    rollback=st.sampled_from(["checkpoint", "replay"]),
)
def test_along_a_decoding_each_draft_equals_a_fresh_drafters(ctx, steps, rollback) -> None:
    """Accept j of the draft, add a bonus token and maybe a user turn: bitwise the fresh drafter's draft."""
    drafter = ModelDrafter(small_model(), rollback=rollback)
    ctx = list(ctx)
    for j, extra, k in steps:
        draft = drafter.propose(ctx, k)
        assert draft == fresh_draft(ctx, k), (ctx, k)
        ctx = ctx + draft[:j] + [(ctx[-1] * 7 + 1) % 256] + [(i * 13) % 256 for i in range(extra)]
        ctx = ctx[:90]


def test_cost_of_a_proposal_is_one_catch_up_forward_plus_the_draft_forwards() -> None:
    target = load_target("reference:d_model=32,max_context=512")
    drafter = ModelDrafter(small_model(max_context=512))
    prompt = list(b"hello hello hello, said the ")
    gen = SpecDecoder(target, drafter, k=4).generate(prompt, 60)
    assert gen.tokens == greedy_decode(load_target("reference:d_model=32,max_context=512"), prompt, 60).tokens
    rounds = gen.stats.rounds
    assert rounds - 1 <= drafter.proposals <= rounds  # the last round may have k_eff == 0
    assert drafter.restarts == 1  # the prefill of the prompt, never again
    assert drafter.catchup_forwards <= drafter.proposals
    assert drafter.draft_forwards <= 3 * drafter.proposals  # k - 1 one-token forwards per proposal
    assert drafter.forwards == drafter.catchup_forwards + drafter.draft_forwards
    # never a re-prefill: after the first catch-up, each one feeds at most the accepted draft + bonus
    assert drafter.tokens_fed <= len(prompt) + len(gen.tokens) + drafter.draft_forwards + 4 * rounds


def test_a_user_turn_is_one_catch_up_forward_and_a_new_conversation_restarts() -> None:
    drafter = ModelDrafter(small_model())
    a = list(range(10, 30))
    drafter.propose(a, 3)
    before = drafter.forwards
    drafter.propose([*a, 1, 2, 3, 4, 5], 3)  # a user turn: five tokens the model has not seen
    assert drafter.forwards == before + 1 + 2 and drafter.restarts == 1
    assert drafter.propose([99, 98, 97], 3) == fresh_draft([99, 98, 97], 3)
    assert drafter.restarts == 2


def test_the_same_context_twice_needs_no_forward_for_the_first_token() -> None:
    drafter = ModelDrafter(small_model())
    ctx = list(range(40, 60))
    first = drafter.propose(ctx, 1)
    forwards = drafter.forwards
    assert drafter.propose(ctx, 1) == first and drafter.forwards == forwards
    assert drafter.propose(ctx, 4) == fresh_draft(ctx, 4)


def test_reset_gives_a_fresh_drafter() -> None:
    drafter = ModelDrafter(small_model())
    drafter.propose(list(range(50)), 4)
    drafter.reset()
    assert drafter.forwards == 0 and drafter.model.processed == 0
    assert drafter.propose([5, 6, 7], 4) == fresh_draft([5, 6, 7], 4)


def test_k_zero_capacity_clamp_and_contexts_past_max_context() -> None:
    drafter = ModelDrafter(small_model(max_context=20))
    assert drafter.propose([1, 2, 3], 0) == [] and drafter.forwards == 0
    assert drafter.propose([], 3) == []
    assert len(drafter.propose(list(range(18)), 8)) == 3  # 18 + 3 - 1 == 20: the model holds context + draft[:-1]
    assert drafter.propose(list(range(20)), 4) == fresh_draft(list(range(20)), 1)[:1]
    assert drafter.propose(list(range(21)), 4) == []  # longer than the draft model: no draft, no error
    assert drafter.propose(list(range(5)), 2) == fresh_draft(list(range(5)), 2)


def test_rollback_setting() -> None:
    assert ModelDrafter(small_model()).rollback == "checkpoint"
    assert ModelDrafter(small_model(), rollback="replay").rollback == "replay"
    with pytest.raises(InvalidSettingError, match="rollback"):
        ModelDrafter(small_model(), rollback="nope")  # type: ignore[arg-type]

    class NoCheckpoints:
        def __init__(self) -> None:
            self.inner = small_model()
            self.vocab_size, self.max_context = 256, 96

        def __getattr__(self, name: str) -> object:
            if name == "forward_with_checkpoints":
                raise AttributeError(name)
            return getattr(self.inner, name)

    assert ModelDrafter(NoCheckpoints()).rollback == "replay"  # type: ignore[arg-type]
    with pytest.raises(InvalidSettingError, match="forward_with_checkpoints"):
        ModelDrafter(NoCheckpoints(), rollback="checkpoint")  # type: ignore[arg-type]


def test_combined_uses_lookup_when_it_matches_else_the_model() -> None:
    combined = CombinedDrafter(ModelDrafter(small_model()))
    ctx = list(b"abcdefgh xyz abcdef")
    assert combined.propose(ctx, 3) == NgramDrafter(min_n=3, max_n=4).propose(ctx, 3) == list(b"gh ")
    novel = list(b"qwertyuiop")
    assert combined.propose(novel, 3) == fresh_draft(novel, 3)
    # a match near the end of the context: the lookup gives one token, the model completes the draft
    run = list(b"xy      ")
    assert NgramDrafter(min_n=3, max_n=4, extend=False).propose(run, 4) == [32]
    assert combined.propose(run, 4) == [32, *fresh_draft([*run, 32], 3)]
    assert (combined.lookup_drafts, combined.completed_drafts, combined.model_drafts) == (1, 1, 1)
    assert combined.propose(novel, 0) == []
    combined.reset()
    assert combined.model.forwards == 0


# ------------------------------------------------------------------------------- specs


def test_load_drafter_specs() -> None:
    assert isinstance(load_drafter("ngram"), NgramDrafter)
    ng = load_drafter("ngram:2,4,earliest")
    assert (ng.min_n, ng.max_n, ng.prefer) == (2, 4, "earliest")  # type: ignore[attr-defined]
    m = load_drafter(f"model:{SMALL}")
    assert isinstance(m, ModelDrafter) and m.model.config.d_model == 16  # type: ignore[attr-defined]
    c = load_drafter(f"combined:{SMALL}")
    assert isinstance(c, CombinedDrafter)
    plug = load_drafter("specproof.conformance.zoo:lookup_drafter")
    assert callable(plug.propose)
    make = drafter_factory(f"model:{SMALL}")
    assert make() is not make()  # fresh instances


def test_trained_small_spec() -> None:
    d = load_drafter("model:trained-small")
    assert isinstance(d, ModelDrafter) and d.vocab_size == 256 and d.rollback == "checkpoint"


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("", "expected a drafter spec"),
        ("nope", "unknown drafter"),
        ("ngram:x", "ngram:MIN_N,MAX_N"),
        ("ngram:3,1", "min_n=3"),
        ("model:", "draft model target spec"),
        ("model:no-such-model", "cannot load the draft model 'no-such-model'"),
        ("combined:reference:bogus=1", "cannot load the draft model"),
        ("nosuchmodule_xyz:make", "cannot import"),
    ],
)
def test_bad_specs_are_plugin_errors_naming_the_spec(spec: str, match: str) -> None:
    with pytest.raises(PluginError, match=match) as info:
        load_drafter(spec)
    assert repr(spec) in str(info.value)


# ------------------------------------------------------------------------------- the zoo's model drafters


CONTEXT = list(b"    def update(self, key, value):\n        self.data[key] = value\n        return self.data\n")
OTHER = list(b"import sys\nprint(sys.argv)\n")
CALLED = [i % 3 != 1 for i in range(len(CONTEXT))]


@pytest.mark.parametrize(
    ("factory", "why"),
    [
        (zoo.model_drafter_no_rollback, "called at every position"),
        (zoo.model_drafter_kv_only_rollback, "called at every position"),
        (zoo.model_drafter_kv_only_rollback_gdn, "called at every position"),
        (zoo.model_drafter_reset_keeps_state, "after an unrelated generation and reset()"),
    ],
)
def test_zoo_model_drafters_change_proposals(factory, why) -> None:
    violations, compared = check_deterministic(
        get("drafter.deterministic"), factory, CONTEXT, [4, 3, 2], other=OTHER, called=CALLED
    )
    assert compared and violations and why in violations[0].explanation


@pytest.mark.parametrize(
    "factory", [zoo.model_drafter_checkpoint, zoo.model_drafter_replay, zoo.model_drafter_reprefill]
)
def test_correct_model_drafters_pass(factory) -> None:
    violations, compared = check_deterministic(
        get("drafter.deterministic"), factory, CONTEXT, [4, 3, 2], other=OTHER, called=CALLED
    )
    assert compared and not violations


def test_the_bugs_cost_acceptance_not_losslessness() -> None:
    """Along a real decoding on trained, the no-rollback drafter's drafts diverge from a fresh drafter's."""
    prompt = list(b"def area(width, height):\n    return width * height\n\ndef area(width, height):\n")
    target = load_target("trained:max_context=512")
    buggy = zoo.model_drafter_no_rollback()
    gen = SpecDecoder(target, buggy, k=4).generate(prompt, 32)
    assert gen.tokens == greedy_decode(load_target("trained:max_context=512"), prompt, 32).tokens
    good = zoo.model_drafter_checkpoint()
    good_gen = SpecDecoder(load_target("trained:max_context=512"), good, k=4).generate(prompt, 32)
    assert good_gen.tokens == gen.tokens
    assert good_gen.stats.accepted >= gen.stats.accepted


@pytest.mark.parametrize("factory", ["model_drafter_hf", "model_drafter_mlx"])
def test_draft_model_on_a_framework_target_passes(factory: str) -> None:
    """Correct, different: the draft model is transformers' LFM2 (checkpoint rollback: its conv windows come out
    of the verify forward) or mlx-lm's (replay rollback); neither is batch-invariant."""
    pytest.importorskip("transformers" if factory.endswith("hf") else "mlx_lm")
    make = getattr(zoo, factory)
    assert make().rollback == ("checkpoint" if factory.endswith("hf") else "replay")
    violations, compared = check_deterministic(
        get("drafter.deterministic"), make, CONTEXT[:40], [4, 2], other=OTHER, called=CALLED
    )
    assert compared and not violations


def test_a_multi_turn_session_never_re_prefills_the_draft_model() -> None:
    """User turns between generations are caught up in one forward each; the prompt is prefilled once."""
    target = load_target("reference:d_model=32,max_context=512")
    drafter = ModelDrafter(small_model(max_context=512), rollback="replay")
    session = SpecDecoder(target, drafter, k=3, rollback="replay").start(list(b"User: hi\nBot:"))
    for turn in (b"\nUser: and then?\nBot:", b"\nUser: ok\nBot:"):
        session.generate(12)
        session.extend(list(turn))
    session.generate(12)
    assert drafter.restarts == 1
    assert drafter.catchup_forwards <= drafter.proposals
    ctx = list(session.context)
    assert ModelDrafter(small_model(max_context=512)).propose(ctx, 3) == drafter.propose(ctx, 3)
