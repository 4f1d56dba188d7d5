"""Decode parameters in the engine-case search (docs/contract.md, "Decode state", "In the engine-case search"):
with ``--decode-state`` the one search of an engine case draws the processors the case declares, and every
engine invariant judges those runs against plain decoding with them. A state bug on the processors' path only
is found there (and by no decode check); correct engines pass; without the option nothing is drawn."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specproof.conformance import certify
from specproof.conformance.drivers import _engine_draws
from specproof.conformance.drivers._case_decode import case_processor_features, draw_case_decode
from specproof.conformance.zoo import CORRECT_DECODE, ZOO
from specproof.contract import DecodeParams

MEMBER = "decode_last_round_keeps_rejected"


def _statuses(engine: str | None, *, decode_state: bool, only: str = "engine.*") -> dict[str, str]:
    kw: dict[str, Any] = {} if engine is None else {"engine": engine}
    report = certify("engine", only=(only,), decode_state=decode_state, **kw).to_json()
    return {r["invariant"]: r["status"] for r in report["results"]}


def test_a_case_declaring_processors_draws_them_or_none() -> None:
    builtin = SimpleNamespace(kind="builtin", engine=None, make_reference=None)
    seen: set[bool] = set()

    @given(data=st.data())
    def draw(data: st.DataObject) -> None:
        params = draw_case_decode(data, builtin, 64)
        assert params is None or (isinstance(params, DecodeParams) and params.features())
        seen.add(params is None)

    draw()
    assert seen == {True, False}


@pytest.mark.parametrize(
    ("declared", "reference", "features"),
    [
        (("penalties", "logprobs"), True, {"penalties"}),
        (None, True, set()),  # declares nothing: never sent decode parameters
        ("penalties", True, set()),  # not a tuple of names
        (("logit_bias",), False, {"logit_bias"}),  # no model to decode plainly with: nothing drawn
    ],
)
def test_only_declared_processors_of_a_plugin_with_a_model_are_drawn(
    declared: object, reference: bool, features: set[str]
) -> None:
    case = SimpleNamespace(
        kind="plugin", engine=SimpleNamespace(decode_features=declared), make_reference=object() if reference else None
    )
    assert case_processor_features(case) == features

    @given(data=st.data())
    def draw(data: st.DataObject) -> None:
        params = draw_case_decode(data, case, 64)
        assert params is None or (reference and params.features() <= features)
        assert reference or params is None

    draw()


def test_without_the_option_the_search_draws_no_decode_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> None:
        raise AssertionError("decode parameters drawn without --decode-state")

    monkeypatch.setattr(_engine_draws, "draw_case_decode", refuse)
    assert set(_statuses(None, decode_state=False, only="engine.lossless").values()) == {"pass"}


@pytest.mark.slow
def test_a_state_bug_on_the_processors_path_is_found_only_with_decode_draws() -> None:
    spec = ZOO[MEMBER].spec
    assert _statuses(spec, decode_state=True)["engine.kv-length"] == "fail"
    assert "fail" not in _statuses(spec, decode_state=False).values()  # the search without processors misses it
    assert "fail" not in _statuses(spec, decode_state=True, only="decode.*").values()  # the output is right


@pytest.mark.slow
@pytest.mark.parametrize("engine", [None, CORRECT_DECODE["decode_zoo_engine"], CORRECT_DECODE["decode_replay_engine"]])
def test_correct_engines_pass_the_engine_checks_with_decode_draws(engine: str | None) -> None:
    statuses = _statuses(engine, decode_state=True)
    assert "fail" not in statuses.values() and "error" not in statuses.values(), statuses
    assert statuses["engine.lossless"] == "pass"
