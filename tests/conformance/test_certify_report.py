"""``certify()`` returns a typed ``Report``; its ``to_json()`` is the ``specproof-report/2`` document, unchanged."""

from __future__ import annotations

import json

import jsonschema
import pytest

from specproof.conformance import Report, certify
from specproof.conformance.reports import FORMAT


def test_certify_returns_a_report_whose_json_is_the_report_format() -> None:
    report = certify("target", target="reference", only=("target.shape", "engine.stop"))
    assert isinstance(report, Report)
    assert report.verdict == "pass" and report.verdict_reason == "" and not report.interrupted
    document = report.to_json()
    assert document["format"] == FORMAT and document["verdict"] == report.verdict
    assert [r["id"] for r in report.results] == [r["id"] for r in document["results"]]
    assert report.path_coverage == document["path_coverage"] and set(report.path_coverage) == {"checkpoint", "replay"}
    assert report.result("target.shape")["status"] == "pass"
    assert report.result("replay-engine.stop")["exercised"] > 0
    with pytest.raises(KeyError, match="no check"):
        report.result("engine.stop")  # an engine check's id names its case
    json.dumps(document)  # a plain JSON document, as --report writes it
    document["verdict"] = "changed"
    assert report.to_json()["verdict"] == "pass"  # a copy: the record is unchanged


def test_the_report_document_validates_against_its_schema() -> None:
    from importlib.resources import files

    schema = json.loads((files("specproof") / "schemas" / "report-2.json").read_text())
    jsonschema.validate(certify("target", target="reference", only=("target.shape",)).to_json(), schema)


def test_dict_access_still_works_with_a_deprecation_warning() -> None:
    report = certify("target", target="reference", only=("target.shape",))
    with pytest.warns(DeprecationWarning, match=r"certify\(\) returns a Report"):
        assert report["verdict"] == "pass"
    with pytest.warns(DeprecationWarning):
        assert report.get("results")[0]["id"] == "target.shape"
    assert "verdict" in report
