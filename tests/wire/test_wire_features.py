"""Feature drafters over the wire: the capability ``features`` (docs/protocol.md, Features).

An engine in another process (``tests/_wire_py_engine.py``, ``SpecDecoder`` on the zoo's small
reference model) sends the target's features of the accepted positions with every ``propose``;
the client hands them to the suite's feature drafter unchanged, and ``engine.features`` judges
them against a fresh copy of the handshake's model:

- the correct engine passes ``engine.features`` (exercised) and ``engine.lossless``;
- rows of a rejected draft position, and rows never updated after the prompt, fail it, named;
- an engine without the capability: the drafter computes its features, the check is skipped;
- protocol errors (``from`` past the rows held, data of the wrong length, a handshake naming
  ``features`` without ``d_model``) are refused naming the field; a drafter layer the engine
  does not report is a usage error naming the layer, before anything is sent.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from _processes import running_processes
from _wire_helpers import PY_ENGINE, by_invariant, certify_engine, start
from specproof.contract.errors import PluginError
from specproof.wire import EngineProtocolError, EngineRequestError, ExecEngine, validate_message
from specproof.wire._limits import NO_STATE_LINE_BYTES, check_feature_shape, feature_line_bytes

pytestmark = pytest.mark.slow  # seconds per test: outside `tox -e quick`, always in `tox`

DRAFTER = "specproof.conformance.zoo:feature_head_drafter"  # layers 0, 1, 3 of the zoo's small reference
ONLY = ("engine.features", "engine.lossless")


def _run(mode: str, drafter: str = DRAFTER) -> dict[str, dict[str, Any]]:
    return by_invariant(certify_engine(PY_ENGINE, mode, only=ONLY, drafter=drafter))


class Recorder:
    """A feature drafter that records what it is handed and drafts nothing."""

    feature_layers = (0, 3)

    def __init__(self) -> None:
        self.calls: list[tuple[int, dict[int, tuple[int, ...]] | None]] = []

    def propose(self, context: Sequence[int], k: int, *, features: Mapping[int, Any] | None = None) -> list[int]:
        shapes = None if features is None else {layer: np.asarray(a).shape for layer, a in features.items()}
        self.calls.append((len(context), shapes))
        return []


# --------------------------------------------------------------------------- certify


def test_the_correct_engine_passes_engine_features() -> None:
    results = _run("features")
    assert results["engine.features"]["status"] == "pass", results["engine.features"]
    assert results["engine.features"]["exercised"] > 0
    assert results["engine.lossless"]["status"] == "pass"


@pytest.mark.parametrize(
    ("mode", "words"),
    [
        ("features-from-rejected", "is not the target's feature at that position"),
        ("features-stale", "expected one row per accepted position"),
    ],
)
def test_planted_feature_bugs_fail_engine_features(mode: str, words: str) -> None:
    results = _run(mode)
    result = results["engine.features"]
    assert result["status"] == "fail", result
    assert words in result["detail"], result["detail"]
    assert results["engine.lossless"]["status"] == "pass"  # the features do not change the tokens


def test_an_engine_without_the_capability_skips_engine_features() -> None:
    results = _run("ok")
    result = results["engine.features"]
    assert result["status"] == "skip", result
    assert result["exercised"] == 0
    assert "never handed its feature drafter features" in result["detail"]
    assert results["engine.lossless"]["status"] == "pass"


def test_a_drafter_layer_the_engine_does_not_report_is_a_usage_error(tmp_path: Path) -> None:
    module = tmp_path / "deep_drafter.py"
    module.write_text(
        "class Deep:\n"
        "    feature_layers = (1, 7)\n"
        "    def propose(self, context, k, *, features=None):\n"
        "        return []\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(PluginError, match=r"layer 7, which engine py-features"):
            certify_engine(PY_ENGINE, "features", only=ONLY, drafter="deep_drafter:Deep")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("deep_drafter", None)
    assert running_processes(str(PY_ENGINE)) == []


# --------------------------------------------------------------------------- the client


def test_the_client_hands_over_exactly_the_rows_sent() -> None:
    with start(PY_ENGINE, "features") as engine:
        assert engine.feature_layers == (0, 1, 2, 3) and engine.d_model == 32
        drafter = Recorder()
        engine.drafter = drafter
        gen = engine.generate([5, 6, 7, 8], 6)
        assert gen.tokens
        assert drafter.calls
        for n, shapes in drafter.calls:  # one row per position of context[:-1], every declared layer
            assert shapes == {0: (n - 1, 32), 3: (n - 1, 32)}


def test_the_client_asks_for_no_features_of_an_engine_without_the_capability() -> None:
    with start(PY_ENGINE, "ok") as engine:
        assert engine.feature_layers is None
        drafter = Recorder()
        engine.drafter = drafter
        engine.generate([5, 6, 7], 3)
        assert drafter.calls and all(shapes is None for _, shapes in drafter.calls)


def test_a_layer_the_engine_does_not_report_is_refused_before_sending() -> None:
    class Deep(Recorder):
        feature_layers = (0, 9)

    with start(PY_ENGINE, "features") as engine:
        engine.drafter = Deep()
        sent = engine.traffic["bytes_sent"]
        with pytest.raises(EngineRequestError, match=r"layer 9, which the engine does not report"):
            engine.generate([5, 6, 7], 3)
        assert engine.traffic["bytes_sent"] == sent  # nothing was sent
        engine.drafter = Recorder()
        assert engine.generate([5, 6, 7], 3).tokens  # the engine is still in step


@pytest.mark.parametrize(
    ("mode", "words"),
    [
        ("features-bad-from", r"features\.from=1, but the client holds 0 rows"),
        ("features-short-data", r"features\.data holds 512 bytes, but features\.rows=3 for 2 layers .* make 768"),
    ],
)
def test_malformed_features_are_protocol_errors_naming_the_field(mode: str, words: str) -> None:
    with start(PY_ENGINE, mode, max_restarts=0) as engine:
        engine.drafter = Recorder()
        with pytest.raises(EngineProtocolError, match=words):
            engine.generate([5, 6, 7, 8], 3)


def test_a_handshake_naming_features_without_d_model_is_refused() -> None:
    hello = {
        "type": "hello",
        "protocol": "specproof-engine/1",
        "engine": {"name": "no-width"},
        "vocab_size": 64,
        "max_context": 32,
        "k": 2,
        "rollback": "replay",
        "capabilities": ["greedy", "suite_drafts", "features"],
        "feature_layers": [0],
    }
    code = f"import sys; print({json.dumps(json.dumps(hello))}, flush=True); sys.stdin.read()"
    with pytest.raises(EngineProtocolError, match=r"names the capability 'features' but no d_model"):
        ExecEngine([sys.executable, "-c", code], timeout=10)


# --------------------------------------------------------------------------- schemas and limits


def test_the_schemas_accept_a_propose_with_and_without_features() -> None:
    base = {"type": "propose", "id": 1, "round": 0, "context_length": 4, "k": 2}
    assert validate_message(dict(base), expect=("propose",))
    data = base64.b64encode(np.zeros((2, 3, 4), "<f4").tobytes()).decode()
    with_features = {**base, "features": {"from": 0, "rows": 3, "data": data}}
    assert validate_message(with_features, expect=("propose",))["features"]["rows"] == 3
    for bad in (
        {"from": 0, "rows": 3},
        {"from": -1, "rows": 3, "data": data},
        {"from": 0, "rows": 3, "data": data, "x": 1},
    ):
        with pytest.raises(EngineProtocolError):
            validate_message({**base, "features": bad}, expect=("propose",))


def test_feature_shapes_are_checked_before_decoding() -> None:
    data = base64.b64encode(np.zeros((2, 3, 4), "<f4").tobytes()).decode()
    ok = {"from": 1, "rows": 3, "data": data}
    assert check_feature_shape(ok, held=1, layers=2, d_model=4, max_context=8) == (1, 3)
    with pytest.raises(EngineProtocolError, match=r"features\.from=2, but the client holds 1 rows"):
        check_feature_shape({**ok, "from": 2}, held=1, layers=2, d_model=4, max_context=8)
    with pytest.raises(EngineProtocolError, match="pass max_context=3"):
        check_feature_shape(ok, held=1, layers=2, d_model=4, max_context=3)
    with pytest.raises(EngineProtocolError, match=r"features\.data holds 96 bytes.* make 128"):
        check_feature_shape({**ok, "rows": 4}, held=1, layers=2, d_model=4, max_context=8)
    huge = {"from": 0, "rows": 2**31 - 2, "data": "AAAA"}  # nothing the size of rows is allocated
    with pytest.raises(EngineProtocolError, match="nothing was allocated"):
        check_feature_shape(huge, held=0, layers=64, d_model=2**31 - 1, max_context=2**31 - 1)


def test_a_propose_with_max_context_rows_fits_the_default_line_limit() -> None:
    layers, d_model, max_context = 4, 32, 256  # the small reference, every layer
    data = base64.b64encode(np.zeros((layers, max_context, d_model), "<f4").tobytes()).decode()
    line = json.dumps(
        {
            "type": "propose",
            "id": 2**31,
            "round": 2**31,
            "context_length": max_context,
            "k": 4096,
            "features": {"from": 0, "rows": max_context, "data": data},
        }
    )
    assert len(line) < feature_line_bytes(layers, d_model, max_context)
    big = feature_line_bytes(3, 4096, 8192)  # 384 MiB of base64: past the 4 MiB floor, at the 256 MiB ceiling
    assert NO_STATE_LINE_BYTES < big <= 256 << 20
    with start(PY_ENGINE, "features") as engine:
        assert engine.max_line_bytes >= feature_line_bytes(4, 32, engine.max_context)


def test_features_the_request_did_not_ask_for_are_a_protocol_error() -> None:
    hello = {
        "type": "hello",
        "protocol": "specproof-engine/1",
        "engine": {"name": "eager"},
        "vocab_size": 64,
        "max_context": 32,
        "k": 2,
        "rollback": "replay",
        "capabilities": ["greedy", "suite_drafts", "features"],
        "d_model": 1,
        "feature_layers": [0],
    }
    propose = {"type": "propose", "id": 1, "round": 0, "context_length": 2, "k": 2}
    propose["features"] = {"from": 0, "rows": 1, "data": "AAAAAA=="}
    code = (
        "import sys\n"
        f"print({json.dumps(json.dumps(hello))}, flush=True)\n"
        "sys.stdin.readline()\n"
        f"print({json.dumps(json.dumps(propose))}, flush=True)\n"
        "sys.stdin.read()\n"
    )
    with ExecEngine([sys.executable, "-c", code], timeout=10, max_restarts=0) as engine:
        engine.drafter = type("Plain", (), {"propose": lambda self, context, k: []})()
        with pytest.raises(EngineProtocolError, match="a propose with features, but the request asked for none"):
            engine.generate([1, 2], 2)
