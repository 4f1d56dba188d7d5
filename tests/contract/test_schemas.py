"""The JSON Schemas of specproof's own formats (specproof/schemas/): every real output matches its
schema, every schema can fail (a broken document is refused naming the field), and every input
format is read through its schema."""

from __future__ import annotations

import copy
import json
import re
import shlex
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from _targets import small_target
from specproof.bench import make_baseline, run_bench, save_baseline
from specproof.conformance import certify
from specproof.conformance._campaign import CampaignOptions, CampaignState, WorkerState
from specproof.conformance.drivers import DRIVERS
from specproof.conformance.traces import Golden, golden_case, write_golden, write_trace
from specproof.engine import NgramDrafter, SpecDecoder
from specproof.formats import FORMATS, load_schema, problems, validate
from specproof.strategies import SessionHistory

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_DIR = ROOT / "src" / "specproof" / "schemas"
SCHEMAS = {f.schema: f.id for f in FORMATS}  # schema name -> format id, from the format modules
ZOO_SESSION_BUG = "specproof.conformance.zoo:snapshot_only_last_call"  # fails engine.session in ~2 s


def _ok(name: str, doc: Any, part: str | None = None) -> None:
    assert validate(name, doc, part=part) == [], json.dumps(doc, default=str)[:2000]


# --------------------------------------------------------------------------- the schema files


def test_every_schema_file_is_a_valid_draft_2020_12_schema_and_is_listed() -> None:
    files = sorted(p.stem for p in SCHEMA_DIR.glob("*.json"))
    assert files == sorted(SCHEMAS)
    for name, fmt in SCHEMAS.items():
        schema = load_schema(name)
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert schema["$id"] == f"https://specproof.dev/schemas/{name}.json"
        assert schema["title"].startswith(fmt + ":") and schema["description"]
        if schema.get("type") == "array":  # a JSON array (invariants --json) carries no format field
            fields = schema["items"]["properties"].values()
            assert schema["items"]["required"] and all(p.get("description") for p in fields)
            continue
        # the format's own name is pinned: a document of another version is refused
        objects = [schema] if "properties" in schema else [schema["$defs"]["header"]]
        for obj in objects:
            tag = obj["properties"].get("format") or obj["properties"].get("schema")
            assert tag["const"] == fmt
            # every top-level field says what it means
            for field, sub in obj["properties"].items():
                assert sub.get("description") or "$ref" in sub, f"{name}: {field} has no description"


def test_each_format_id_is_spelled_in_one_module_only() -> None:
    """A format's id (``specproof-report/2``) lives in its module of ``specproof.formats``; every
    writer and reader takes it from there. The schema files pin the same id (``const``, checked
    above), so they may spell it; no other source file may."""
    src = ROOT / "src" / "specproof"
    sources = sorted(src.rglob("*.py"))
    for fmt in FORMATS:
        spelled = [str(p.relative_to(src)) for p in sources if fmt.id in p.read_text()]
        module = fmt.schema.rsplit("-", 1)[0].replace("-", "_").replace("bench_baseline", "baseline")
        assert spelled == [f"formats/{module}.py"], f"{fmt.id} is spelled in {spelled}"


def test_each_format_module_names_its_own_schema_and_tag() -> None:
    import specproof.formats as formats

    assert sorted(f.id for f in FORMATS) == sorted(set(f.id for f in FORMATS))  # no id twice
    for fmt in FORMATS:
        assert formats.by_schema(fmt.schema) is fmt
        doc_field = "schema" if fmt.schema.startswith("bench") else ("format" if fmt.field else None)
        assert fmt.field == doc_field and fmt.tag() == ({doc_field: fmt.id} if doc_field else {})
    with pytest.raises(KeyError, match="no specproof format with schema 'report-9'"):
        formats.by_schema("report-9")


def test_the_schemas_ship_as_package_data() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"schemas/*.json"' in pyproject
    for name in SCHEMAS:
        assert resources.files("specproof").joinpath("schemas", f"{name}.json").is_file()


def test_load_schema_returns_a_copy_and_refuses_unknown_names() -> None:
    load_schema("report-2")["title"] = "changed"
    assert load_schema("report-2")["title"] != "changed"
    with pytest.raises(KeyError, match="no specproof schema 'report-9'"):
        load_schema("report-9")
    with pytest.raises(KeyError, match="no part 'nope'"):
        validate("trace-1", {}, part="nope")


# --------------------------------------------------------------------------- real outputs


@pytest.fixture(scope="module")
def drafter_report() -> dict[str, Any]:
    return certify("drafter", profile="quick").to_json()


@pytest.fixture(scope="module")
def failing_engine_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))  # the failing session's history is saved under ~/.cache/specproof
        return certify("engine", engine=ZOO_SESSION_BUG, profile="quick", db=str(home / "db")).to_json()


def test_a_passing_certify_report_matches_its_schema(drafter_report: dict[str, Any]) -> None:
    assert drafter_report["verdict"] == "pass" and drafter_report["subjects"]["drafter"]
    _ok("report-2", drafter_report)
    _ok("report-2", json.loads(json.dumps(drafter_report, default=str)))  # as written to the file


def test_a_failing_engine_report_with_a_database_matches_its_schema(failing_engine_report: dict[str, Any]) -> None:
    report = failing_engine_report
    assert report["verdict"] == "fail" and report["database"] is not None
    assert any(r["violations"] for r in report["results"])
    _ok("report-2", json.loads(json.dumps(report, default=str)))


def test_a_target_report_matches_its_schema() -> None:
    report = certify("target", profile="quick", only=("target.causality",)).to_json()
    assert report["subjects"]["target"]["spec"]
    _ok("report-2", json.loads(json.dumps(report, default=str)))


def test_a_campaign_report_matches_its_schema(failing_engine_report: dict[str, Any], tmp_path: Path) -> None:
    """The campaign's merge, fed what a worker sends (check results, round reports), as ``run_campaign`` does."""
    options = CampaignOptions(
        plan={"subject": "engine", "profile": "quick"}, db=None, hypothesis_dir=str(tmp_path), workers=2, seed=1
    )
    state = CampaignState(options=options, workers=[WorkerState(index=0), WorkerState(index=1)])
    for worker in (0, 1):
        for result in failing_engine_report["results"]:
            state.absorb_check(worker, copy.deepcopy(result))
        state.absorb_round(worker, copy.deepcopy(failing_engine_report))
    state.stopped = "max-failures reached"
    report = json.loads(json.dumps(state.report(), default=str))
    assert report["campaign"]["failures"] and report["verdict"] == "fail"
    _ok("report-2", report)
    empty = CampaignState(options=options, workers=[WorkerState(index=0)]).report()  # nothing ran: the defaults
    _ok("report-2", json.loads(json.dumps(empty, default=str)))


def test_the_session_file_a_failing_session_check_writes_matches_its_schema(
    failing_engine_report: dict[str, Any],
) -> None:
    (failing,) = [
        r for r in failing_engine_report["results"] if r["status"] == "fail" and "--replay-session" in r["reproduce"]
    ]
    words = shlex.split(failing["reproduce"])
    path = Path(words[words.index("--replay-session") + 1])
    doc = json.loads(path.read_text())
    _ok("session-1", doc)
    assert SessionHistory.load(path).failing_request is not None


def test_a_trace_and_a_golden_file_match_their_schemas(tmp_path: Path) -> None:
    target = small_target()
    decoder = SpecDecoder(target, NgramDrafter(), k=4, rollback="replay")
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    gen = decoder.generate(prompt, 16, eos_token_id=None)
    path = tmp_path / "t.jsonl"
    write_trace(
        path,
        gen,
        prompt=prompt,
        k=4,
        max_new_tokens=16,
        eos_token_id=None,
        vocab_size=target.vocab_size,
        engine=decoder.name,
        target="small",
        max_context=target.max_context,
        rollback="replay",
    )
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    _ok("trace-1", lines[0], part="header")
    for line in lines[1:-1]:
        _ok("trace-1", line, part="round")
    _ok("trace-1", lines[-1], part="final")
    for line in lines:
        _ok("trace-1", line)  # the root: any one line
    golden = tmp_path / "g.json"
    write_golden(golden, Golden(target="small", cases=(golden_case(target, prompt, 8),)))
    _ok("golden-1", json.loads(golden.read_text()))


@pytest.fixture(scope="module")
def bench_result() -> dict[str, Any]:
    from _bench_records import tiny_config as _tiny_config

    return json.loads(json.dumps(run_bench(_tiny_config()).to_json()))


def _printed(capsys: pytest.CaptureFixture[str], argv: list[str]) -> Any:
    from specproof.cli import main

    main(argv)
    return json.loads(capsys.readouterr().out)


def test_the_printed_json_of_generate_check_trace_and_invariants_match_their_schemas(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = str(tmp_path / "t.jsonl")
    decoder = _printed(capsys, ["generate", "def f(x):", "--max-new-tokens", "8", "--json", "--trace", trace])
    _ok("generate-1", decoder)
    compared = _printed(capsys, ["generate", "--ids", "1,2,3", "--max-new-tokens", "4", "--compare-greedy", "--json"])
    _ok("generate-1", compared)
    assert "greedy_seconds" in compared
    engine = _printed(
        capsys,
        ["generate", "--engine", "specproof.conformance.zoo:zoo_engine", "--ids", "1,2,3", "--json"],
    )
    _ok("generate-1", engine)
    assert isinstance(engine["rounds"], list)
    _ok("check-trace-1", _printed(capsys, ["check-trace", trace, "--json"]))
    with_oracle = _printed(capsys, ["check-trace", trace, "--target", "reference", "--json"])
    _ok("check-trace-1", with_oracle)
    assert with_oracle["lossless"] is not None
    _ok("invariants-1", _printed(capsys, ["invariants", "--json"]))
    # each can fail: the two forms of generate are told apart; a result's status is one of the five
    assert validate("generate-1", {**decoder, "engine": "x"})
    assert validate("generate-1", {**engine, "rounds": 3})
    assert validate("check-trace-1", {**with_oracle, "results": [{**with_oracle["results"][0], "status": "ok"}]})
    assert validate("invariants-1", [{"id": "engine.x", "subject": "engine"}])


def test_a_bench_result_and_its_baseline_match_their_schemas(bench_result: dict[str, Any], tmp_path: Path) -> None:
    _ok("bench-2", bench_result)
    save_baseline(tmp_path / "b.json", bench_result)
    _ok("bench-baseline-2", json.loads((tmp_path / "b.json").read_text()))
    _ok("bench-baseline-2", json.loads((ROOT / "benchmarks" / "baseline.json").read_text()))  # the committed one


# --------------------------------------------------------------------------- every schema can fail


def _session() -> dict[str, Any]:
    return {
        "format": "specproof-session/1",
        "vocab_size": 64,
        "engine": "mypkg:make",
        "failing_request": 1,
        "requests": [
            {
                "kind": "new_prompt",
                "prompt": [1, 2],
                "max_new_tokens": 4,
                "eos_token_id": None,
                "drafter": "scripted",
                "plan": [[4, 2]],
                "note": "first",
            },
            {"kind": "reset"},
        ],
    }


def _baseline() -> dict[str, Any]:
    from _bench_records import result as _result

    return make_baseline(_result())


def _trace_header() -> dict[str, Any]:
    return {
        "format": "specproof-trace/1",
        "vocab_size": 32,
        "k": 4,
        "prompt": [1, 2],
        "max_new_tokens": 4,
        "eos_token_id": None,
        "engine": "e",
        "target": "t",
    }


def _golden() -> dict[str, Any]:
    return {
        "format": "specproof-golden/1",
        "target": "t",
        "cases": [{"prompt": [1], "max_new_tokens": 2, "eos_token_id": None, "tokens": [3, 4]}],
    }


def _del(path: tuple[Any, ...]):
    def edit(doc: Any) -> None:
        for p in path[:-1]:
            doc = doc[p]
        del doc[path[-1]]

    return edit


def _set(path: tuple[Any, ...], value: Any):
    def edit(doc: Any) -> None:
        for p in path[:-1]:
            doc = doc[p]
        doc[path[-1]] = value

    return edit


# (schema, part, a valid document, an edit that breaks it, a regex the problem must match)
BROKEN = [
    ("report-2", None, "drafter", _del(("verdict",)), r"^verdict is missing"),
    (
        "report-2",
        None,
        "drafter",
        _set(("results", 0, "examples"), "12"),
        r"^results\[0\]\.examples must be an integer",
    ),
    ("report-2", None, "drafter", _set(("verdict",), "ok"), r"^verdict = 'ok' is not one of 'pass'"),
    ("report-2", None, "drafter", _set(("results", 0, "shiny"), 1), r"^results\[0\]\.shiny is not a known field"),
    ("report-2", None, "drafter", _set(("format",), "specproof-report/1"), r"^format = 'specproof-report/1'; expected"),
    ("session-1", None, _session, _del(("requests", 0, "prompt")), r"^requests\[0\]\.prompt is missing"),
    (
        "session-1",
        None,
        _session,
        _set(("requests", 0, "max_new_tokens"), "4"),
        r"^requests\[0\]\.max_new_tokens must be",
    ),
    (
        "session-1",
        None,
        _session,
        _set(("requests", 0, "plan", 0), [4]),
        r"^requests\[0\]\.plan\[0\] must have at least 2",
    ),
    ("trace-1", "header", _trace_header, _del(("k",)), r"^k is missing"),
    ("trace-1", "header", _trace_header, _set(("prompt",), [1, -2]), r"^prompt\[1\] = -2 must be >= 0"),
    (
        "trace-1",
        "round",
        lambda: {"round": 0, "base": 2, "draft": [], "argmax": [1], "accepted": [1], "processed": 3},
        _set(("base",), None),
        r"^base must be an integer >= 0, got null",
    ),
    (
        "trace-1",
        "final",
        lambda: {"final": True, "tokens": [1], "stop_reason": "eos"},
        _set(("stop_reason",), "done"),
        r"^stop_reason = 'done' is not one of",
    ),
    ("golden-1", None, _golden, _del(("cases", 0, "tokens")), r"^cases\[0\]\.tokens is missing"),
    (
        "golden-1",
        None,
        _golden,
        _set(("cases", 0, "margins"), [-1.0, 2]),
        r"^cases\[0\]\.margins\[0\] = -1.0 must be >= 0",
    ),
    ("bench-baseline-2", None, _baseline, _del(("thresholds", "ratio")), r"^thresholds\.ratio is missing"),
    ("bench-baseline-2", None, _baseline, _set(("thresholds", "ratio"), 1.5), r"^thresholds\.ratio = 1.5 must be < 1"),
    ("bench-2", None, "bench", _del(("cells", 0, "speedup")), r"^cells\[0\]\.speedup is missing"),
    ("bench-2", None, "bench", _set(("cells", 0, "lossless"), "yes"), r"^cells\[0\]\.lossless must be a boolean"),
]


@pytest.mark.parametrize(
    ("name", "part", "make", "edit", "message"), BROKEN, ids=[f"{b[0]}-{i}" for i, b in enumerate(BROKEN)]
)
def test_a_broken_document_is_refused_naming_the_field(
    request: pytest.FixtureRequest, name: str, part: str | None, make: Any, edit: Any, message: str
) -> None:
    if make == "drafter":
        doc = copy.deepcopy(request.getfixturevalue("drafter_report"))
    elif make == "bench":
        doc = copy.deepcopy(request.getfixturevalue("bench_result"))
    else:
        doc = make()
    _ok(name, doc, part=part)
    edit(doc)
    found = validate(name, doc, part=part)
    assert found and re.search(message, found[0]), found


# (schema, part, a valid document that differs from the usual: optional fields absent, extras where allowed)
VARIANTS = [
    ("session-1", None, {"format": "specproof-session/1", "requests": [{"kind": "reset"}]}),
    (
        "session-1",
        None,
        {
            "format": "specproof-session/1",
            "vocab_size": None,
            "requests": [{"kind": "edit", "prompt": [0], "max_new_tokens": 0}],
        },
    ),
    ("trace-1", "header", {**_trace_header(), "max_context": 128, "rollback": None}),
    ("golden-1", None, {"format": "specproof-golden/1", "target": "t", "cases": []}),
    ("golden-1", None, {**_golden(), "cases": [{**_golden()["cases"][0], "margins": [0.5, 1e308]}]}),
    (
        "bench-baseline-2",
        None,
        {
            "schema": "specproof-bench-baseline/2",
            "mode": "quick",
            "target": "reference",
            "thresholds": dict.fromkeys(["machine_independent", "ratio", "mean_ratio", "cpu_ratio", "cpu_pooled"], 0.0),
            "figures": {"x/speedup": {"value": 1, "kind": "ratio", "better": "higher"}},
            "extra": "a field from a later version",
        },
    ),
]


@pytest.mark.parametrize(("name", "part", "doc"), VARIANTS, ids=[f"{v[0]}-{i}" for i, v in enumerate(VARIANTS)])
def test_a_valid_variant_is_accepted(name: str, part: str | None, doc: Any) -> None:
    _ok(name, doc, part=part)


def test_report_variants_are_accepted(drafter_report: dict[str, Any]) -> None:
    doc = copy.deepcopy(drafter_report)
    del doc["subjects"]["drafter"]  # present only when drafter checks ran
    doc["verdict"], doc["verdict_reason"], doc["seed"] = "interrupted", None, 7
    doc["results"][0]["status"] = "pending"
    doc["results"][0]["excused"] = {"count": 1, "margins": [0.01]}
    doc["subjects"]["engines"][0]["wire"] = {"bytes_received": 10, "bytes_sent": 5, "overhead_us_per_round": None}
    _ok("report-2", doc)


def test_bench_result_variants_are_accepted(bench_result: dict[str, Any]) -> None:
    doc = copy.deepcopy(bench_result)
    doc["cells"][0]["final_period"] = 3
    doc["real_contexts"] = {"cells": []}
    doc["config"]["later_option"] = True  # the config is every BenchConfig field: open
    _ok("bench-2", doc)


def test_problems_carry_the_path_keyword_and_value() -> None:
    doc = _session()
    doc["requests"][0]["prompt"] = [1, "x"]
    doc["requests"][1]["surprise"] = 1
    found = problems("session-1", doc)
    assert [(p.path, p.keyword) for p in found] == [
        (("requests", 0, "prompt", 1), "type"),
        (("requests", 1, "surprise"), "additionalProperties"),
    ]
    assert found[0].value == "x" and found[0].where == "requests[0].prompt[1]"
    assert str(found[0]) == "requests[0].prompt[1] must be an integer >= 0, got 'x'"


def test_the_schemas_enums_are_the_codes_own() -> None:
    """The schemas repeat a few lists the code keeps: they must not drift apart."""
    import typing

    from specproof.bench._gate import _KINDS, _OPTIONAL_KINDS
    from specproof.conformance._results import Status
    from specproof.contract import STOP_REASONS
    from specproof.strategies._session_history import DRAFTER_CHOICES, REQUEST_KINDS

    request = load_schema("session-1")["$defs"]["request"]["properties"]
    assert tuple(request["kind"]["enum"]) == REQUEST_KINDS
    assert tuple(request["drafter"]["enum"]) == (*DRAFTER_CHOICES, None)
    assert tuple(load_schema("trace-1")["$defs"]["final"]["properties"]["stop_reason"]["enum"]) == STOP_REASONS
    baseline = load_schema("bench-baseline-2")
    assert tuple(baseline["$defs"]["figure"]["properties"]["kind"]["enum"]) == (*_KINDS, *_OPTIONAL_KINDS)
    assert tuple(baseline["properties"]["thresholds"]["required"]) == _KINDS
    status = load_schema("report-2")["$defs"]["result"]["properties"]["status"]["enum"]
    assert tuple(status) == typing.get_args(Status)


def test_the_invariants_schema_names_every_registered_driver() -> None:
    # the schema is a published file; the drivers are code: a new driver must reach the schema too
    schema = json.loads(resources.files("specproof").joinpath("schemas/invariants-1.json").read_text())
    declared = schema["items"]["properties"]["driver"]["enum"]
    assert sorted(declared) == sorted(DRIVERS), (declared, sorted(DRIVERS))
