"""``specproof certify --profile ci`` wall time (one round: it takes about two minutes here)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_certify_ci(benchmark):
    if importlib.util.find_spec("specproof._cli.certify") is None:
        pytest.skip("specproof certify is not in this checkout")
    benchmark.group = "certify"
    benchmark.name = "certify --profile ci"
    cmd = [sys.executable, "-m", "specproof", "certify", "--profile", "ci", "--json"]
    proc = benchmark.pedantic(
        subprocess.run, args=(cmd,), kwargs={"capture_output": True, "text": True}, rounds=1, iterations=1
    )
    benchmark.extra_info["exit_code"] = proc.returncode
    assert proc.returncode == 0, proc.stderr[-2000:]
