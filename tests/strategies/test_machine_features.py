"""Feature drafters judged across requests (issue 27), and a feature judge that names the cause.

The session machine installs feature drafters on most requests where the engine's drafter
reads target features and judges the rows the engine hands at every proposal against a
fresh copy of the model: a prefix cache that hands zero rows for the positions it served
(vLLM #43650's shape), or keeps an earlier context's rows for positions it re-feeds, is
rejected with the request, the position, the layer and the cache hit named; the correct
prefix cache passes (and the same engine judged without a model, where no feature drafter
can be judged, passes too). ``FeatureJudge`` names each cause it can prove, and the
engine's wrong target state before the features.
"""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import InvalidArgument

from specproof.conformance.zoo._feature_sessions import (
    FeatureSessionEngine,
    PrefixHitStaleFeatures,
    PrefixHitZeroFeatures,
)
from specproof.conformance.zoo._session_engines import SessionEngine
from specproof.conformance.zoo._targets import small_reference
from specproof.contract import UsageError
from specproof.strategies import (
    FeatureJudge,
    FeatureRows,
    SessionFailure,
    SessionFileError,
    SessionHistory,
    SessionMachine,
    SessionRequest,
    replay_session,
    run_session_machine,
    shrink_history,
    target_greedy,
)

VOCAB = 64
LAYERS = (1, 3)  # what the zoo's FeatureLookupDrafter declares


def _budget(max_examples: int = 5, steps: int = 8) -> settings:
    return settings(
        max_examples=max_examples,
        stateful_step_count=steps,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[p for p in Phase if p is not Phase.explain],
    )


def _run(factory, **kwargs) -> type[SessionMachine]:
    return run_session_machine(
        engine_factory=factory, greedy=target_greedy(small_reference()), vocab_size=VOCAB, settings=_budget(), **kwargs
    )


@functools.cache
def _zero_rows_failure() -> SessionFailure:
    with pytest.raises(SessionFailure) as info:
        _run(PrefixHitZeroFeatures, feature_reference_factory=small_reference)
    return info.value


# --------------------------------------------------------------------------- the session machine


def test_a_prefix_cache_handing_zero_rows_is_rejected_naming_request_position_layer_and_cache_hit():
    err = _zero_rows_failure()
    history = SessionHistory.from_example(err.example)
    failing = history.requests[err.failing_request]
    assert failing.feature_layers == LAYERS and failing.kind != "reset"
    why = err.explanation
    assert why.startswith(f"request {err.failing_request} ({failing.kind})")
    assert "features the engine handed its feature drafter (layers [1, 3]) are wrong" in why
    assert "features[1] row" in why and "position" in why
    assert "all zeros" in why and "served from its caches" in why
    assert "target state" not in why  # the target is right: the handoff is named, not the target


@pytest.mark.slow  # a failing session machine shrunk: tens of seconds
def test_a_prefix_cache_keeping_stale_rows_is_rejected_naming_the_earlier_context():
    with pytest.raises(SessionFailure) as info:
        _run(PrefixHitStaleFeatures, feature_reference_factory=small_reference)
    why = info.value.explanation
    assert "are wrong" in why and "feature in an earlier context" in why and "stale rows from another request" in why
    history = SessionHistory.from_example(info.value.example)
    kwargs = {"greedy": target_greedy(small_reference()), "vocab_size": VOCAB, "reference_factory": small_reference}
    assert len(replay_session(history, engine_factory=PrefixHitStaleFeatures, **kwargs)) == 1
    assert replay_session(history, engine_factory=FeatureSessionEngine, **kwargs) == []


def test_the_zero_rows_history_saves_replays_and_passes_on_the_correct_prefix_cache(tmp_path):
    history = SessionHistory.from_example(_zero_rows_failure().example)
    loaded = SessionHistory.load(history.save(tmp_path / "features.json"))
    assert loaded == history
    assert any("feature_layers" in r for r in json.loads((tmp_path / "features.json").read_text())["requests"])
    kwargs = {"greedy": target_greedy(small_reference()), "vocab_size": VOCAB, "reference_factory": small_reference}
    [again] = replay_session(loaded, engine_factory=PrefixHitZeroFeatures, **kwargs)
    assert "all zeros" in again.explanation
    assert replay_session(loaded, engine_factory=FeatureSessionEngine, **kwargs) == []
    shrunk = shrink_history(loaded, engine_factory=PrefixHitZeroFeatures, **kwargs)
    assert shrunk.requests[-1].feature_layers == LAYERS  # the features are what the failure needs
    with pytest.raises(UsageError, match=r"feature drafter \(layers \[1, 3\]\).*feature_reference_factory"):
        replay_session(loaded, engine_factory=PrefixHitZeroFeatures, greedy=kwargs["greedy"], vocab_size=VOCAB)


@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
def test_the_correct_prefix_cache_passes_with_features_judged_on_prefix_hits(rollback):
    engine = functools.partial(FeatureSessionEngine, rollback=rollback)
    machine = _run(engine, feature_reference_factory=small_reference)
    requests, proposals, hits = machine.features_judged()
    assert requests > 0 and proposals >= requests and hits > 0


def test_without_a_model_no_feature_drafter_is_judged_and_the_zero_rows_go_unseen():
    """The feature judge is what rejects the member: without a model to judge by, nothing is judged."""
    machine = _run(PrefixHitZeroFeatures)
    assert machine.features_judged() == (0, 0, 0)


def test_an_engine_with_a_plain_drafter_installs_no_feature_drafter():
    machine = _run(SessionEngine, feature_reference_factory=small_reference)
    assert machine.features_judged() == (0, 0, 0)


def test_feature_layers_can_be_given_for_an_engine_whose_own_drafter_is_plain():
    """A plain drafter in the engine, layers configured: the installed drafters read features, judged."""
    machine = _run(
        lambda: FeatureSessionEngine(drafter=SessionEngine().drafter),
        feature_layers=(0, 2),
        feature_reference_factory=small_reference,
    )
    requests, proposals, _ = machine.features_judged()
    assert requests > 0 and proposals > 0


@pytest.mark.parametrize(
    ("layers", "message"),
    [((), "non-empty sequence"), ((1, 1), "names a layer twice"), ((-1,), "integers >= 0"), (3, "sequence")],
)
def test_feature_layers_are_validated_up_front(layers, message):
    with pytest.raises(InvalidArgument, match=message):
        SessionMachine.configure(
            engine_factory=FeatureSessionEngine,
            greedy=target_greedy(small_reference()),
            vocab_size=VOCAB,
            feature_layers=layers,
        )


# --------------------------------------------------------------------------- the history format


def test_histories_without_feature_layers_read_and_write_as_before():
    req = SessionRequest(kind="new_prompt", prompt=(1, 2), max_new_tokens=3, drafter="scripted", plan=((2, 1),))
    assert "feature_layers" not in req.to_json()
    old = {"format": "specproof-session/1", "requests": [req.to_json()]}
    assert SessionHistory.from_json(old).requests[0].feature_layers is None
    with_layers = {**req.to_json(), "feature_layers": [1, 3]}
    loaded = SessionHistory.from_json({"format": "specproof-session/1", "requests": [with_layers]})
    assert loaded.requests[0].feature_layers == (1, 3)
    assert "feature_layers=[1, 3]" in loaded.requests[0].describe()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"drafter": None, "plan": None}, r"requests\[0\]\.feature_layers is given but the request installs no"),
        ({"feature_layers": [1, 1]}, r"requests\[0\]\.feature_layers = \[1, 1\] names a layer twice"),
        ({"feature_layers": []}, r"requests\[0\]\.feature_layers"),
        ({"feature_layers": [-1]}, r"requests\[0\]\.feature_layers\[0\]"),
    ],
)
def test_bad_feature_layers_in_a_history_name_the_field(change, message):
    req = {"kind": "new_prompt", "prompt": [1], "max_new_tokens": 1, "drafter": "scripted", "plan": [[1, 1]]}
    obj = {"format": "specproof-session/1", "requests": [{**req, "feature_layers": [1], **change}]}
    with pytest.raises(SessionFileError, match=message):
        SessionHistory.from_json(obj)


# --------------------------------------------------------------------------- the judge names the cause


CTX = [3, 17, 42, 5, 9, 33, 61, 2, 40, 40, 12, 7]


def _rows(tokens) -> dict[int, np.ndarray]:
    return {layer: rows.copy() for layer, rows in FeatureRows(small_reference, LAYERS).upto(tokens).items()}


def _rows_of(tokens, layer: int) -> np.ndarray:
    return FeatureRows(small_reference, (layer,)).upto(tokens)[layer].copy()


def _judged(context, handed, *, live=None, before=()) -> dict:
    judge = FeatureJudge(small_reference, LAYERS, atol=0.0, live=live)
    for ctx, rows, draft in before:
        judge.check(ctx, rows, round_index=0)
        if draft:
            judge.saw(ctx, draft, round_index=0)
    assert judge.found == []
    judge.check(context, handed, round_index=1)
    [found] = judge.found
    return found


def test_the_correct_rows_pass_and_count():
    judge = FeatureJudge(small_reference, LAYERS, atol=0.0)
    judge.check(CTX, _rows(CTX[:-1]), round_index=0)
    judge.check(CTX, None, round_index=1)  # no features handed: nothing judged
    assert judge.found == [] and judge.checks == 1


def test_zero_rows_are_named_as_never_computed():
    handed = _rows(CTX[:-1])
    handed[3][:4] = 0
    found = _judged(CTX, handed)
    assert found["example"] == {"context_length": 12, "round": 1, "layer": 3, "position": 0, "cause": "zeros"}
    assert "features[3] row 0 (position 0 of the 11 accepted, token 3)" in found["explanation"]
    assert "all zeros" in found["explanation"]


def test_shifted_rows_and_another_layers_rows_are_named():
    handed = _rows(CTX[:-1])
    handed[1][5] = handed[1][4]
    assert _judged(CTX, handed)["example"]["cause"] == "shifted"
    handed = _rows(CTX[:-1])
    handed[3][1:] = handed[3][:-1].copy()
    handed[3][0] = 0
    found = _judged(CTX, handed)  # row 0 is zeros, but every row is shifted: the shift is the cause
    assert found["example"]["cause"] == "shifted" and "shifted by +1" in found["explanation"]
    handed = _rows(CTX[:-1])
    handed[1] = handed[3].copy()
    found = _judged(CTX, handed)
    assert found["example"]["cause"] == "layer" and "it is layer 3's" in found["explanation"]
    handed = _rows(CTX[:-1])
    handed[1] = _rows_of(CTX[:-1], 0)  # a layer the drafter did not declare (off by one block)
    found = _judged(CTX, handed)
    assert "it is layer 0's (the wrong layer; the drafter declared 1)" in found["explanation"]


def test_an_earlier_requests_row_is_named_stale():
    earlier = [*CTX[:2], 50, *CTX[3:]]  # differs from CTX at position 2
    handed = _rows(CTX[:-1])
    handed[1][6] = _rows(earlier[:-1])[1][6]
    found = _judged(CTX, handed, before=[(earlier, _rows(earlier[:-1]), ())])
    assert found["example"]["cause"] == "stale"
    assert "an earlier context (11 tokens, which differs from this one from position 2 on)" in found["explanation"]


def test_a_rejected_draft_tokens_row_is_named():
    draft = [21, 22, 23]
    after = [*CTX, 21, 30]  # the first draft token accepted, the second rejected (30 is the bonus)
    handed = _rows(after[:-1])
    handed[1][-1] = _rows([*CTX, *draft])[1][len(CTX) + 2]  # the last verify row: draft token 23's
    found = _judged(after, handed, before=[(CTX, _rows(CTX[:-1]), draft)])
    assert found["example"]["cause"] == "rejected"
    assert f"draft token 23 at position {len(CTX) + 2}, handed as position {len(CTX)}'s" in found["explanation"]


def test_a_wrong_target_state_is_named_before_the_features():
    """The features come from the engine's target; when its state is wrong, the target is named."""
    wrong = [*CTX[:4], 0, *CTX[5:]]
    live = small_reference()
    live.reset()
    _, feats, _ = live.forward_with_features(wrong[:-1], LAYERS)  # the engine's target fed a wrong token
    found = _judged(CTX, {layer: np.asarray(feats[layer]) for layer in LAYERS}, live=live)
    assert found["example"]["cause"] == "target"
    assert "the engine's target state itself is wrong here" in found["explanation"]
    assert "not the feature handoff" in found["explanation"]
    live.reset()
    live.forward(CTX[:5])
    handed = _rows(CTX[:-1])
    handed[1][7] += 1.0
    found = _judged(CTX, handed, live=live)
    assert found["example"]["cause"] == "target" and "processed 5 tokens, not the 11 accepted" in found["explanation"]


def test_a_right_target_with_a_wrong_row_blames_the_row():
    live = small_reference()
    live.reset()
    live.forward(CTX[:-1])
    handed = _rows(CTX[:-1])
    handed[3][7] += 0.5
    found = _judged(CTX, handed, live=live)
    assert found["example"]["cause"] == "value"
    assert "matches no accepted position's" in found["explanation"]
    assert (
        "no earlier context's this judge saw" in found["explanation"]
        and "largest difference 0.5" in found["explanation"]
    )


def test_a_missing_layer_and_a_bad_shape_are_named():
    handed = _rows(CTX[:-1])
    del handed[3]
    assert "no features for layer 3" in _judged(CTX, handed)["explanation"]
    handed = _rows(CTX[:-2])
    found = _judged(CTX, handed)
    assert found["example"]["cause"] == "shape" and "expected one row per accepted position" in found["explanation"]
