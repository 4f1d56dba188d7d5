"""SessionMachine: requests on one live engine, judged against plain greedy.

The buggy session engines fail ``engine.session`` at a small derandomized budget, with
the whole request history; that history, saved and loaded, fails again on a fresh buggy
engine and passes on the correct one; the correct and unusual-but-correct engines pass.
"""

from __future__ import annotations

import functools
import json

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import InvalidArgument

from specproof.conformance.zoo import _session_engines as zoo
from specproof.conformance.zoo._targets import small_reference
from specproof.contract import UsageError
from specproof.engine import InvalidSettingError
from specproof.strategies import (
    SESSION_FORMAT,
    SessionFailure,
    SessionFileError,
    SessionHistory,
    SessionMachine,
    SessionRequest,
    engine_greedy,
    replay_session,
    run_session_machine,
    shrink_history,
    target_greedy,
)
from specproof.strategies._rounds import RoundPlan, ScriptedDrafter

VOCAB = 64
SCRIPTED = functools.partial(SessionRequest, kind="new_prompt", drafter="scripted")
NO_EXPLAIN = [p for p in Phase if p is not Phase.explain]


FIND_ONLY = (Phase.generate,)


def budget(max_examples: int, steps: int, phases=NO_EXPLAIN) -> settings:
    return settings(
        max_examples=max_examples,
        stateful_step_count=steps,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=phases,
    )


def oracle() -> object:
    return target_greedy(small_reference())


def run(factory, max_examples: int = 5, steps: int = 8, phases=NO_EXPLAIN, **kwargs) -> type[SessionMachine]:
    kwargs.setdefault("greedy", oracle())
    return run_session_machine(
        engine_factory=factory, vocab_size=VOCAB, settings=budget(max_examples, steps, phases), **kwargs
    )


@functools.cache
def caught(factory, phases=tuple(NO_EXPLAIN)) -> SessionFailure:
    """The failure at a small budget (5 examples of 8 steps, derandomized); cached, as two tests read it."""
    with pytest.raises(SessionFailure) as info:
        run(factory, phases=list(phases))
    return info.value


# --------------------------------------------------------------------------- the bugs are caught


# Shrinking the snapshot bug takes ~8 s (hundreds of replayed sessions): the shrunk case is checked on
# the stale cache; finding it at the same budget is what matters for the other.
@pytest.mark.parametrize(
    ("factory", "phases"), [(zoo.stale_prefix_cache, tuple(NO_EXPLAIN)), (zoo.snapshot_only_last_call, FIND_ONLY)]
)
def test_buggy_session_engine_fails_with_its_history(factory, phases, tmp_path):
    err = caught(factory, phases)
    assert str(err) == err.explanation and err.explanation.startswith(f"request {err.failing_request} (")
    history = SessionHistory.from_example(err.example)
    assert len(history.requests) >= 2, "a session bug needs an earlier request"
    assert history.failing_request == len(history.requests) - 1
    assert err.example["failing_request"] == err.failing_request == history.failing_request
    notes = "\n".join(getattr(err, "__notes__", []))
    assert "<-- fails" in notes and "the whole session" in notes

    path = history.save(tmp_path / "session.json")
    loaded = SessionHistory.load(path)
    assert loaded == history
    again = replay_session(loaded, engine_factory=factory, greedy=oracle(), vocab_size=VOCAB)
    assert [type(f) for f in again] == [SessionFailure]
    assert again[0].example["failing_request"] == history.failing_request
    assert replay_session(loaded, engine_factory=zoo.session_engine, greedy=oracle(), vocab_size=VOCAB) == []


def test_the_stale_prefix_cache_shrinks_to_two_requests_sharing_a_prefix():
    """A prompt, then a prompt that hits a prefix of its context shorter than the cache (a regenerate, or
    the first prompt token and another: which one the shrinker settles on depends on the machine's rules)."""
    history = SessionHistory.from_example(caught(zoo.stale_prefix_cache, tuple(NO_EXPLAIN)).example)
    first, second = history.requests
    assert first.kind == "new_prompt" and second.prompt[: len(first.prompt)] == first.prompt


@pytest.mark.parametrize("factory", [zoo.stale_prefix_cache, zoo.snapshot_only_last_call])
@pytest.mark.parametrize("white_box", [False, True])
def test_shrink_history_keeps_a_failing_session(factory, white_box):
    """Found without Hypothesis's (slow) shrinking, then shrunk by replays: shorter, still failing, the failure last."""
    ref = small_reference if white_box else None
    with pytest.raises(SessionFailure) as info:
        run(factory, max_examples=4, steps=10, phases=list(FIND_ONLY), reference_factory=ref)
    found = SessionHistory.from_example(info.value.example)
    kwargs = {"greedy": oracle(), "vocab_size": VOCAB, "reference_factory": ref}
    shrunk = shrink_history(found, engine_factory=factory, **kwargs)
    assert 2 <= len(shrunk.requests) <= len(found.requests)
    assert shrunk.failing_request == len(shrunk.requests) - 1
    [violation] = replay_session(shrunk, engine_factory=factory, **kwargs)
    assert violation.example["failing_request"] == shrunk.failing_request
    assert replay_session(shrunk, engine_factory=zoo.session_engine, **kwargs) == []
    assert all(r.note for r in shrunk.requests)  # re-described for the shrunk history


def test_shrink_history_returns_a_passing_history_unchanged():
    history = SessionHistory(requests=(SessionRequest(kind="new_prompt", prompt=(1, 2, 3), max_new_tokens=4),))
    kwargs = {"greedy": oracle(), "vocab_size": VOCAB}
    assert shrink_history(history, engine_factory=zoo.stale_prefix_cache, **kwargs) is history
    with pytest.raises(InvalidSettingError, match="max_replays=0"):
        shrink_history(history, engine_factory=zoo.stale_prefix_cache, max_replays=0, **kwargs)


def test_snapshot_only_last_call_needs_two_call_boundaries():
    """A hit on the last request's own snapshots is served right; one older than it is not."""
    regenerate = [
        SessionRequest(kind="new_prompt", prompt=(3, 1, 4, 1, 5, 9, 2, 6), max_new_tokens=8),
        SessionRequest(kind="regenerate", prompt=(3, 1, 4, 1, 5, 9, 2, 6), max_new_tokens=8),
    ]
    history = SessionHistory(requests=tuple(regenerate), vocab_size=VOCAB)
    kwargs = {"greedy": oracle(), "vocab_size": VOCAB}
    assert replay_session(history, engine_factory=zoo.snapshot_only_last_call, **kwargs) == []
    assert replay_session(history, engine_factory=zoo.stale_prefix_cache, **kwargs) != []
    first = regenerate[0]
    turn = SessionRequest(kind="multi_turn", prompt=(*first.prompt, 7, 7, 7), max_new_tokens=0)
    older = SessionHistory(requests=(first, turn, regenerate[1]), vocab_size=VOCAB)
    assert replay_session(older, engine_factory=zoo.session_engine, **kwargs) == []
    [violation] = replay_session(older, engine_factory=zoo.snapshot_only_last_call, **kwargs)
    assert violation.example["failing_request"] == 2


def test_white_box_check_sees_a_stale_state_the_tokens_hide():
    """A hit served with another request's state, then 7 tokens re-fed: the tokens recover, the KV does not."""
    prompt = (
        3,
        60,
        5,
        39,
        50,
        21,
        21,
        29,
        1,
        25,
        29,
        51,
        44,
        45,
        58,
        34,
        0,
        49,
        16,
        26,
        54,
        7,
        61,
        46,
        25,
        52,
        62,
        45,
        53,
    )
    greedy = oracle()
    first = SessionRequest(kind="new_prompt", prompt=prompt, max_new_tokens=8)
    context = (*prompt, *greedy(list(prompt), 8, None)[0])
    history = SessionHistory(
        requests=(
            first,
            SessionRequest(kind="multi_turn", prompt=(*context, 1, 2), max_new_tokens=4),
            SessionRequest(kind="edit", prompt=(*prompt[:20], 42, 58, 3, 29), max_new_tokens=8),
        ),
        vocab_size=VOCAB,
    )
    kwargs = {"greedy": greedy, "vocab_size": VOCAB}
    assert replay_session(history, engine_factory=zoo.snapshot_only_last_call, **kwargs) == []
    [violation] = replay_session(
        history, engine_factory=zoo.snapshot_only_last_call, reference_factory=small_reference, **kwargs
    )
    assert isinstance(violation, SessionFailure) and "does not hold the context" in violation.explanation
    assert violation.example["failing_request"] == 2
    assert replay_session(history, engine_factory=zoo.session_engine, reference_factory=small_reference, **kwargs) == []


def test_white_box_check_needs_the_target_at_the_context():
    class LeavesTargetBehind(zoo.SessionEngine):
        def generate(self, prompt, max_new_tokens, *, eos_token_id=None):
            gen = super().generate(prompt, max_new_tokens, eos_token_id=eos_token_id)
            self.reset()  # correct tokens, but the live target no longer holds the context
            return gen

    history = SessionHistory(requests=(SessionRequest(kind="new_prompt", prompt=(1, 2, 3), max_new_tokens=4),))
    [violation] = replay_session(
        history, engine_factory=LeavesTargetBehind, greedy=oracle(), vocab_size=VOCAB, reference_factory=small_reference
    )
    assert "has processed 0 tokens" in violation.explanation


# --------------------------------------------------------------------------- correct engines pass


@pytest.mark.parametrize("factory", [zoo.session_engine, zoo.session_engine_replay, zoo.varying_k_session_engine])
def test_correct_session_engines_pass(factory):
    # with the white-box check too: a correct engine's live target holds exactly ctx[:-1] after every request
    machine = run(factory, max_examples=15, steps=10, reference_factory=small_reference)
    seen = machine.observed
    kinds = ("new_prompt", "regenerate", "multi_turn", "earlier_prefix")
    for tag in (*(f"request:{kind}" for kind in kinds), "branch_back"):
        assert seen[tag] > 0, tag
    assert seen["request:edit"] > 0 and seen["drafter:scripted"] > 0 and seen["eos:last_k_plus_1"] > 0


def test_black_box_engine_with_only_greedy_passes():
    machine = run(
        zoo.greedy_only_session_engine,
        max_examples=15,
        steps=10,
        greedy=engine_greedy(zoo.greedy_only_session_engine()),
    )
    assert machine.observed["request:regenerate"] > 0
    assert not any(tag.startswith("drafter:") for tag in machine.observed)  # nothing to drive
    assert machine.observed["request:reset"] == 0  # no reset() to call


def test_set_drafter_hook_is_used_and_replayed():
    calls = []

    def set_drafter(engine, prompt, continuation, plan):
        assert isinstance(plan, RoundPlan)
        calls.append((tuple(prompt), len(continuation), plan.describe()))
        engine.drafter = ScriptedDrafter(prompt, continuation, plan, vocab_size=VOCAB)

    run(zoo.session_engine, max_examples=3, steps=4, set_drafter=set_drafter)
    assert calls
    history = SessionHistory(
        requests=(
            SessionRequest(kind="new_prompt", prompt=(1, 2, 3), max_new_tokens=6, drafter="scripted", plan=((4, 1),)),
        ),
    )
    calls.clear()
    kwargs = {"greedy": oracle(), "vocab_size": VOCAB, "set_drafter": set_drafter}
    assert replay_session(history, engine_factory=zoo.session_engine, **kwargs) == []
    assert calls == [((1, 2, 3), 6, "[partial(1/4)]")]


def test_replay_of_a_scripted_request_needs_a_drafter_to_set():
    history = SessionHistory(
        requests=(
            SessionRequest(kind="new_prompt", prompt=(1, 2), max_new_tokens=3, drafter="scripted", plan=((2, 2),)),
        ),
    )
    with pytest.raises(UsageError, match="no settable 'drafter'"):
        replay_session(history, engine_factory=zoo.greedy_only_session_engine, greedy=oracle(), vocab_size=VOCAB)


def test_an_engine_that_raises_is_a_session_violation():
    class Raises(zoo.SessionEngine):
        def generate(self, prompt, max_new_tokens, *, eos_token_id=None):
            if len(self._cached):
                raise RuntimeError("cache corrupted")
            return super().generate(prompt, max_new_tokens, eos_token_id=eos_token_id)

    history = SessionHistory(
        requests=(
            SessionRequest(kind="new_prompt", prompt=(1, 2, 3), max_new_tokens=2),
            SessionRequest(kind="regenerate", prompt=(1, 2, 3), max_new_tokens=2),
        )
    )
    [violation] = replay_session(history, engine_factory=Raises, greedy=oracle(), vocab_size=VOCAB)
    assert "RuntimeError: cache corrupted" in violation.explanation
    assert violation.example["failing_request"] == 1


def test_wrong_stop_reason_and_length_are_caught():
    from specproof.contract import Generation

    class StopsEarly(zoo.SessionEngine):
        def generate(self, prompt, max_new_tokens, *, eos_token_id=None):
            gen = super().generate(prompt, max_new_tokens, eos_token_id=eos_token_id)
            return Generation(tokens=gen.tokens, stop_reason="eos", steps=gen.steps, stats=gen.stats)

    history = SessionHistory(requests=(SessionRequest(kind="new_prompt", prompt=(1, 2, 3), max_new_tokens=4),))
    [violation] = replay_session(history, engine_factory=StopsEarly, greedy=oracle(), vocab_size=VOCAB)
    assert "stop_reason is 'eos'" in violation.explanation


# --------------------------------------------------------------------------- the history file


def _history() -> SessionHistory:
    return SessionHistory(
        requests=(
            SessionRequest(
                kind="new_prompt", prompt=(5, 6, 7), max_new_tokens=4, drafter="scripted", plan=((4, 4), (0, 0))
            ),
            SessionRequest(kind="reset"),
            SessionRequest(
                kind="edit", prompt=(5, 6, 9), max_new_tokens=2, eos_token_id=3, drafter="engine", note="cut at 2"
            ),
        ),
        vocab_size=VOCAB,
        engine="specproof.conformance.zoo:stale_prefix_cache",
        failing_request=2,
    )


def test_history_round_trip(tmp_path):
    history = _history()
    path = history.save(tmp_path / "h.json")
    text = path.read_text()
    assert json.loads(text)["format"] == SESSION_FORMAT
    assert len(text.splitlines()) >= 3 + len(history.requests)  # one request per line
    assert SessionHistory.load(path) == history
    assert SessionHistory.from_json(history.to_json()) == history
    assert "<-- fails" in history.describe().splitlines()[2]


def _write(tmp_path, obj) -> str:
    path = tmp_path / "bad.json"
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return str(path)


def _broken(**change) -> dict:
    data = _history().to_json()
    for key, value in change.items():
        if key.startswith("req0_"):
            data["requests"][0][key[5:]] = value
        else:
            data[key] = value
    return data


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"format": "specproof-session/1",\n "requests": [}', r"line 2 column \d+: not valid JSON"),
        ([1, 2], "a session history is a JSON object"),
        (_broken(format="specproof-session/9"), "format = 'specproof-session/9'"),
        (_broken(requests=[]), "requests must be a non-empty list"),
        (_broken(extra=1), "extra is not a known field"),
        (_broken(req0_prompt=[5, 64]), r"requests\[0\]\.prompt\[1\] = 64 must be in \[0, 64\)"),
        (_broken(req0_prompt=[]), r"requests\[0\]\.prompt must be a non-empty list"),
        (_broken(req0_kind="rewind"), r"requests\[0\]\.kind = 'rewind' is not one of"),
        (_broken(req0_max_new_tokens=-1), r"requests\[0\]\.max_new_tokens = -1 must be >= 0"),
        (_broken(req0_plan=[[1, 2]]), r"requests\[0\]\.plan\[0\] has correct=2 > draft_length=1"),
        (_broken(req0_plan=None), r"requests\[0\]\.plan is missing"),
        (_broken(req0_drafter="mine"), r"requests\[0\]\.drafter = 'mine'"),
        (_broken(failing_request=3), r"failing_request = 3 must be in \[0, 3\)"),
        (_broken(req0_eos_token_id=True), r"requests\[0\]\.eos_token_id must be an integer"),
    ],
)
def test_bad_history_files_name_the_problem(tmp_path, content, message):
    path = _write(tmp_path, content)
    with pytest.raises(SessionFileError, match=message) as info:
        SessionHistory.load(path)
    assert str(info.value).startswith(path)
    assert isinstance(info.value, UsageError)  # the CLI's exit 2


def test_missing_history_file(tmp_path):
    with pytest.raises(SessionFileError, match="cannot read the session history"):
        SessionHistory.load(tmp_path / "nope.json")


# --------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"engine_factory": 3}, "engine_factory=3 must be callable"),
        ({"greedy": None}, "greedy=None must be callable"),
        ({"vocab_size": 1}, "vocab_size=1 must be an integer >= 2"),
        ({"max_new_tokens": 0}, "max_new_tokens=0 must be an integer >= 1"),
        ({"max_prompt": True}, "max_prompt=True must be an integer >= 1"),
        ({"max_context": 5, "max_new_tokens": 4}, "max_context=5 must be an integer >= max_new_tokens"),
        ({"tie_tolerance": -1.0}, "tie_tolerance=-1.0 must be a finite number >= 0"),
        ({"set_drafter": "x"}, "set_drafter='x' must be callable or None"),
        ({"context_kinds": ["nope"]}, "unknown kind 'nope'"),
        ({"reference_factory": 1}, "reference_factory=1 must be callable or None"),
        ({"atol": float("nan")}, "atol=nan must be a finite number >= 0"),
    ],
)
def test_configure_validates_up_front(kwargs, message):
    base = {"engine_factory": zoo.session_engine, "greedy": oracle(), "vocab_size": VOCAB}
    with pytest.raises(InvalidArgument, match=message):
        SessionMachine.configure(**{**base, **kwargs})


def test_the_base_class_is_not_runnable():
    with pytest.raises(InvalidSettingError, match="SessionMachine is a base class"):
        SessionMachine()


def test_vocab_mismatch_is_reported():
    machine = SessionMachine.configure(engine_factory=zoo.session_engine, greedy=oracle(), vocab_size=32)
    with pytest.raises(InvalidSettingError, match="vocab_size=64"):
        machine()
