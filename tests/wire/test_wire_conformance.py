"""Engines over the wire judged on what they did (issue 20's conformance scenarios).

Each scenario is an engine process speaking specproof-engine/1 (``tests/_wire_py_engine.py``,
``SpecDecoder`` on the zoo's small reference model behind the protocol), certified through
``certify engine --engine exec:...`` at quick:

- drafts ignored (``suite_drafts`` advertised, ``propose`` never sent) and drafts swapped
  (asked, then its own verified) fail ``engine.drafts-used``;
- an honest engine without ``suite_drafts`` is judged on its own drafts: nothing fails;
- an engine without the ``state`` capability: the state checks are skipped with a reason
  in the protocol's words, not the Python API's (one that advertises it and sends none is
  a protocol error: tests/wire/test_wire_protocol.py);
- the correct engine passes ``engine.drafts-used`` and refuses the suite's hostile drafts
  (an ``error`` answer) without failing;

and no engine process is left running afterwards.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from _wire_helpers import PY_ENGINE, by_invariant, certify_engine

pytestmark = pytest.mark.slow  # seconds per test: outside `tox -e quick`, always in `tox`

ONLY = ("engine.drafts-used", "engine.lossless", "engine.stop", "engine.accept-rule", "engine.state-restored")


def _run(mode: str, only: tuple[str, ...] = ONLY) -> dict[str, Any]:
    return certify_engine(PY_ENGINE, mode, only=only)


@pytest.mark.parametrize(
    ("mode", "words"),
    [("ignores-drafts", "asked for 0 drafts"), ("swaps-drafts", "but the round reports the draft")],
)
def test_an_engine_that_does_not_verify_the_suite_drafts_fails_drafts_used(mode: str, words: str) -> None:
    report = _run(mode)
    assert report["verdict"] == "fail"
    result = by_invariant(report)["engine.drafts-used"]
    assert result["status"] == "fail", result
    assert words in result["detail"]
    assert all(v["invariant"] == "engine.drafts-used" for v in result["violations"])
    # the engine's own drafts are lossless: only the rule it broke fails
    assert by_invariant(report)["engine.lossless"]["status"] == "pass"
    state = by_invariant(report)["engine.state-restored"]  # these modes do not advertise `state`
    assert state["status"] == "skip" and "`target`" not in state["detail"], state


def test_an_honest_engine_without_suite_drafts_is_judged_on_its_own_drafts() -> None:
    report = _run("no-suite-drafts", only=())  # every check, the session machine included
    results = by_invariant(report)
    assert results["engine.session"]["status"] == "pass"  # no scripted drafter is forced on it there either
    assert not [r for r in report["results"] if r["status"] in ("fail", "error")], report["results"]
    assert report["verdict"] in ("pass", "inconclusive")
    if report["verdict"] == "inconclusive":  # its n-gram drafts may never reach a rollback path
        assert report["unreached_paths"] and "drafts for itself" in report["verdict_reason"]
    assert results["engine.drafts-used"]["status"] == "skip"
    assert "drafted for itself" in results["engine.drafts-used"]["detail"]
    assert results["engine.lossless"]["status"] == "pass" and results["engine.accept-rule"]["exercised"] > 0
    (engine,) = report["subjects"]["engines"]
    assert engine["capabilities"]["suite_drafts"] is False


def test_the_correct_engine_uses_the_suite_drafts_and_refuses_hostile_ones() -> None:
    report = _run("ok")
    assert report["verdict"] == "pass", [(r["invariant"], r["status"], r["detail"]) for r in report["results"]]
    results = by_invariant(report)
    assert results["engine.drafts-used"]["exercised"] > 10
    assert results["engine.state-restored"]["status"] == "pass"
    (coverage,) = report["path_coverage"].values()
    # the hostile drafts (explicit on every profile) were refused: those generations did not complete
    assert coverage["completed"] < coverage["generations"]


def test_state_digests_pass_a_perturbed_engine_and_fail_a_stale_conv_state() -> None:
    """Digests over the wire (capability state_digest): a correct engine whose state is atol/4 off
    everywhere (not bit-equal to numpy) passes; one that reports a conv tap never written fails."""
    only = ("engine.state-restored", "engine.lossless")
    report = _run("digest-perturbed", only=only)
    results = by_invariant(report)
    assert results["engine.state-restored"]["status"] == "pass", results["engine.state-restored"]
    assert results["engine.state-restored"]["exercised"] > 0
    (engine,) = report["subjects"]["engines"]
    assert engine["wire"]["state"] == "digests", engine["wire"]
    report = _run("digest-stale-conv", only=only)
    result = by_invariant(report)["engine.state-restored"]
    assert result["status"] == "fail", result
    text = " ".join(v["explanation"] for v in result["violations"])
    assert "conv_state differs at layer" in text and "signed projection" in text and "the bound" in text
    assert "SPECPROOF_WIRE_STATE=full" in text
    # the reproduce command sets the key the failure names, so pasted it compares the same projections
    key = re.search(r"\$SPECPROOF_WIRE_DIGEST_KEY=([0-9a-f]{32})", text)
    assert key and result["reproduce"].startswith(f"SPECPROOF_WIRE_DIGEST_KEY={key[1]} specproof certify ")


def test_a_digest_failure_reproduced_with_its_key_fails_again(monkeypatch: pytest.MonkeyPatch) -> None:
    only = ("engine.state-restored",)
    first = by_invariant(_run("digest-stale-conv", only=only))["engine.state-restored"]
    env = first["reproduce"].partition(" specproof certify ")[0]
    name, _, key = env.partition("=")
    assert name == "SPECPROOF_WIRE_DIGEST_KEY" and len(key) == 32
    monkeypatch.setenv(name, key)
    again = by_invariant(_run("digest-stale-conv", only=only))["engine.state-restored"]
    assert again["status"] == "fail" and f"$SPECPROOF_WIRE_DIGEST_KEY={key}" in again["violations"][0]["explanation"]
    assert again["reproduce"] == first["reproduce"]
