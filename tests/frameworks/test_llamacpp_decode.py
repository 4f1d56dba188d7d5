"""llama.cpp (llama-cpp-python) with decode parameters, held to the decode-state checks on the trained fixture
(docs/real-engines.md, "Decode parameters").

Each certification runs ``specproof certify engine --engine llamacpp:FILE,... --decode-state`` in its own
process and reads the JSON report. On llama-cpp-python 0.3.36, greedy and prompt lookup (K = 4,
``n_rs_seq=4``) alike: ``decode.penalties`` (repetition, presence and frequency penalties and a logit bias
through llama.cpp's own samplers) and ``decode.stop`` pass at quick; ``decode.min-tokens`` skips (llama.cpp
has no min-tokens sampler: the engine does not declare it, and refuses ``min_tokens`` naming it), and
``decode.processor-state`` skips (llama.cpp reports no processor state); ``decode.logprobs`` passes (the
processed row of each pick, read in llama.cpp's own chain), as do ``decode.sampled``,
``decode.parameter-parity`` and ``decode.session``; ``decode.grammar`` skips here (its requests end on id 0,
which is llama.cpp's end of generation only with ``eos=0``: tests/frameworks/test_llamacpp_grammar.py).
Prompt lookup drafts and accepts under the penalties
(``test_prompt_lookup_drafts_under_decode_parameters``), so the pass is speculative.

If a later release changes one, its test fails saying so: update docs/real-engines.md. Skipped when
llama-cpp-python is not importable; run in the llama.cpp environment (``tox -e llamacpp``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

try:
    import llama_cpp  # noqa: F401  (the module under test)
except ImportError as exc:
    pytest.skip(f"llama-cpp-python is not importable here ({exc}); run tox -e llamacpp", allow_module_level=True)

from specproof.contract import BatchRequest, DecodeParams, Grammar
from specproof.contract.decode_state import plain_decode_with
from specproof.contract.errors import UnsupportedParameterError
from specproof.engine.targets.lfm2_gguf import save_lfm2_gguf
from specproof.fixtures import load_trained_target
from specproof.plugins import resolve_plugin

pytestmark = pytest.mark.slow

TIMEOUT = 600
LOOKUP = "speculative=lookup:4,n_rs_seq=4"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_lfm2_gguf(load_trained_target(), tmp_path_factory.mktemp("gguf") / "trained.gguf", source="trained")


def certify_decode(model: Path, options: str, tmp_path: Path) -> dict[str, dict[str, Any]]:
    report = tmp_path / "report.json"
    spec = f"llamacpp:{model}" + (f",{options}" if options else "")
    argv = [sys.executable, "-m", "specproof", "certify", "engine", "--engine", spec, "--decode-state"]
    argv += ["--only", "decode.*", "--profile", "quick", "--db", "none", "--report", str(report)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert report.is_file(), f"certify wrote no report (rc {done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}"
    return {r["invariant"]: r for r in json.loads(report.read_text())["results"]}


@pytest.mark.parametrize("options", ["", LOOKUP])
def test_penalties_bias_stops_and_logprobs_pass_min_tokens_skips(model: Path, tmp_path: Path, options: str) -> None:
    results = certify_decode(model, options, tmp_path)
    statuses = {inv: r["status"] for inv, r in results.items()}
    passing = ("penalties", "stop", "logprobs", "sampled", "parameter-parity", "session")
    assert statuses == {
        **{f"decode.{name}": "pass" for name in passing},
        "decode.min-tokens": "skip",
        "decode.processor-state": "skip",
        "decode.grammar": "skip",
        "decode.stop-strings": "skip",
        "decode.prompt-logprobs": "skip",
    }, results
    assert all(results[f"decode.{name}"]["exercised"] > 0 for name in passing), results
    assert "min_tokens" in results["decode.min-tokens"]["detail"]
    assert "grammar" in results["decode.grammar"]["detail"]


def test_logprobs_read_before_the_processors_are_rejected(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The meta-test of the adapter's logprobs: the recording stage moved to the head of llama.cpp's chain
    (raw logits, before the penalties and bias: the issue's "logprobs before processors") fails
    ``decode.logprobs`` at quick, with speculation on; in place (the test above) it passes."""
    from specproof.conformance import certify
    from specproof.engine.adapters import llamacpp as adapter

    build = adapter.build_decode_chain

    class _RecorderFirst:
        def __init__(self, internals: Any, recorder: Any) -> None:
            self.internals, self.recorder = internals, recorder

        def LlamaSampler(self) -> Any:  # llama-cpp-python's name
            chain = self.internals.LlamaSampler()
            chain.add_custom(self.recorder)
            return chain

    def recorder_first(internals: Any, *, recorder: Any = None, **kwargs: Any) -> Any:
        return build(_RecorderFirst(internals, recorder) if recorder else internals, **kwargs)

    monkeypatch.setattr(adapter, "build_decode_chain", recorder_first)
    report = certify("engine", engine=f"llamacpp:{model},{LOOKUP}", only=("decode.logprobs",), decode_state=True)
    [result] = report.to_json()["results"]
    assert result["status"] == "fail", result
    assert "teacher-forced scoring after the processors" in result["violations"][0]["explanation"]


def test_prompt_lookup_drafts_under_decode_parameters(model: Path) -> None:
    """The pass is speculative: drafts are made and accepted with the penalties and bias on, and every output
    equals plain decoding's; min_tokens and bad words are refused naming them."""
    engine: Any = resolve_plugin(f"llamacpp:{model},{LOOKUP}", kind="engine")
    params = [
        DecodeParams(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.4),
        DecodeParams(logit_bias={5: 3.0, 9: -4.0}),
        DecodeParams(frequency_penalty=1.5, logit_bias={3: 8.0}),
    ]
    drafted = accepted = 0
    for i in range(9):
        prompt = [(7 * i + 3 * j) % engine.vocab_size for j in range(6)] * 2
        gen = engine.generate(prompt, 20, decode=params[i % 3])
        assert list(gen.tokens) == list(plain_decode_with(engine.oracle, prompt, 20, decode=params[i % 3]).tokens)
        drafted, accepted = drafted + gen.stats.drafted, accepted + gen.stats.accepted
    assert drafted > 0 and accepted > 0, (drafted, accepted)
    with pytest.raises(UnsupportedParameterError, match="min_tokens"):
        engine.generate([1, 2, 3], 4, decode=DecodeParams(min_tokens=2))
    with pytest.raises(UnsupportedParameterError, match="bad_words"):
        engine.generate([1, 2, 3], 4, decode=DecodeParams(bad_words=[[1]]))
    with pytest.raises(UnsupportedParameterError, match="no faithful GBNF translation"):
        engine.generate([1, 2, 3], 4, decode=DecodeParams(grammar=Grammar.json_schema({"type": "integer"}),
                                                          eos_token_ids=[0]))  # fmt: skip
    engine.close()


def test_the_batch_engine_refuses_decode_parameters(model: Path) -> None:
    """``parallel=N`` runs llama.cpp's greedy sampler per sequence: a batch request with decode parameters is
    refused naming them, never decoded without them."""
    engine: Any = resolve_plugin(f"llamacpp:{model},{LOOKUP},parallel=2", kind="engine")
    decode = DecodeParams(presence_penalty=1.0)
    request = BatchRequest(request_id="a", prompt=(1, 2, 3), max_new_tokens=4, decode=decode)
    with pytest.raises(UnsupportedParameterError, match="decode parameters"):
        engine.add_request(request)
    engine.close()
