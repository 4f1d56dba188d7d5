"""specproof-engine/1 keeps its conforming engines conforming (docs/protocol.md, Compatibility).

``stats.prefix_reused`` was added to the protocol after engines had been written from it: an
engine advertising ``sessions`` that does not report it (last round's protocol) must still pass
``engine.session``, with a note that its reuse was not judged; one that reports it is judged as
before (a figure above what it can hold, or nothing reused on a user turn, fails). The same rule
holds for Python engines (``reuses_prefix = True`` without ``stats.prefix_reused``).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

import pytest

from _wire_helpers import PY_ENGINE, by_invariant, certify_engine
from specproof.conformance import certify
from specproof.conformance.zoo._session_engines import SessionEngine

ONLY = ("engine.session",)


class UnreportedSessionEngine(SessionEngine):
    """The zoo's correct session engine, written before ``prefix_reused``: its stats never carry it."""

    def _reported_reuse(self, reused: int, prompt: Sequence[int]) -> int | None:  # type: ignore[override]
        return None


class ZeroReportedSessionEngine(SessionEngine):
    """Declares a cache and reports it unused on every request (a user turn included)."""

    def _reported_reuse(self, reused: int, prompt: Sequence[int]) -> int:
        return 0


def _session(report: Any) -> dict[str, Any]:
    """The ``engine.session`` result of a report (a ``Report`` or its JSON dict)."""
    return by_invariant(report.to_json() if hasattr(report, "to_json") else report)["engine.session"]


def test_a_wire_engine_of_last_rounds_protocol_passes_engine_session() -> None:
    result = _session(certify_engine(PY_ENGINE, "sessions-v0", only=ONLY))
    assert result["status"] == "pass", result
    assert result["exercised"] > 0
    notes = " ".join(result["notes"])
    assert "prefix reuse not judged" in notes and "prefix_reused" in notes, result["notes"]
    assert "prefix reuse not judged" in result["detail"]  # shown in the results table


@pytest.mark.parametrize(
    ("mode", "words"),
    [("sessions-overclaim", "cannot have cached"), ("sessions-zero", "re-prefilled all")],
)
def test_a_wire_engine_reporting_a_wrong_prefix_reused_still_fails(mode: str, words: str) -> None:
    result = _session(certify_engine(PY_ENGINE, mode, only=ONLY))
    assert result["status"] == "fail", result
    assert words in str(result["violations"]), result["violations"]
    assert not any("not judged" in n for n in result["notes"])


def test_a_python_session_engine_without_prefix_reused_passes() -> None:
    report = certify("engine", engine=f"{__name__}:UnreportedSessionEngine", profile="quick", only=ONLY)
    result = _session(report)
    assert result["status"] == "pass", result
    assert any("prefix reuse not judged" in n for n in result["notes"]), result["notes"]


def test_a_python_session_engine_reporting_no_reuse_on_a_user_turn_fails() -> None:
    report = certify("engine", engine=f"{__name__}:ZeroReportedSessionEngine", profile="quick", only=ONLY)
    result = _session(report)
    assert result["status"] == "fail", result
    assert "re-prefilled all" in str(result["violations"]), result["violations"]


def test_the_correct_python_session_engine_is_judged_and_passes() -> None:
    report = certify(
        "engine", engine="specproof.conformance.zoo._session_engines:SessionEngine", profile="quick", only=ONLY
    )
    result = _session(report)
    assert result["status"] == "pass", result
    assert not any("not judged" in n for n in result["notes"])


# --------------------------------------------------------------------------- the native engine


@pytest.fixture(scope="module")
def native_spec(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The ``exec:`` spec of the native engine (built once; skipped without a C++ toolchain)."""
    from specproof.plugins import load_target
    from specproof.wire.native import NativeToolchainError, build_native, export_weights, native_binary

    binary = native_binary()
    if not binary.is_file():
        try:
            build_native(quiet=True)
        except NativeToolchainError as exc:
            pytest.skip(f"no C++ toolchain to build the native engine: {exc}")
    weights = tmp_path_factory.mktemp("native") / "trained.safetensors"
    export_weights(weights, target="trained", load_target=load_target)
    return "exec:" + shlex.join([str(binary), "--weights", str(weights)])


@pytest.mark.slow
@pytest.mark.parametrize(("bug", "status"), [(None, "pass"), ("overclaims-prefix-reuse", "fail")])
def test_the_native_engine_reports_prefix_reused_and_is_judged_on_it(
    native_spec: str, bug: str | None, status: str
) -> None:
    spec = native_spec + ("" if bug is None else f" --bug {bug}")
    result = _session(certify("engine", engine=spec, profile="quick", only=ONLY))
    assert result["status"] == status, result
    assert not any("not judged" in n for n in result["notes"]), result["notes"]
    if bug is not None:
        assert "cannot have cached" in str(result["violations"]), result["violations"]


def test_a_wire_engine_of_last_rounds_protocol_conforms_unchanged_when_batches_are_asked_for() -> None:
    """``batched`` came later (docs/protocol.md, Batches): an engine that does not declare it gets the
    same verdicts with ``--batches`` as without, and every batch check skips it saying why."""
    only = ("engine.lossless", "engine.session", "batch.*")
    plain = by_invariant(certify_engine(PY_ENGINE, "sessions-v0", only=only))
    batched = by_invariant(certify_engine(PY_ENGINE, "sessions-v0", only=only, batches=True))
    for check in ("engine.lossless", "engine.session"):
        assert batched[check]["status"] == plain[check]["status"] == "pass", batched[check]
    skipped = {k: v for k, v in batched.items() if k.startswith("batch.")}
    assert skipped and all(v["status"] == "skip" for v in skipped.values()), skipped
    assert all("declares no batch_capabilities" in v["detail"] for v in skipped.values()), skipped
