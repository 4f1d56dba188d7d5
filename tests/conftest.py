"""Hypothesis profiles for the project's own tests.

``dev`` (the default) is quick; ``ci`` is derandomized so CI is deterministic.
Select with HYPOTHESIS_PROFILE (tox and .ci/run set ``ci``).
"""

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "ci",
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# `specproof certify` keeps an example database under Hypothesis' directory by default: the tests'
# CLI runs get one of their own for the session, never the user's cache.
if "SPECPROOF_HYPOTHESIS_DIR" not in os.environ:
    import tempfile

    os.environ["SPECPROOF_HYPOTHESIS_DIR"] = os.path.join(tempfile.mkdtemp(prefix="specproof-tests-"), "hypothesis")


@pytest.fixture(autouse=True)
def _own_example_database(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each test gets an example database of its own: what one test's certify saved (failures,
    covering examples) is never replayed by another's, whichever xdist worker runs them."""
    monkeypatch.setenv("SPECPROOF_HYPOTHESIS_DIR", str(tmp_path_factory.mktemp("hypothesis")))


@pytest.fixture(autouse=True)
def _no_local_constants(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test draws without Hypothesis' local constants (specproof.strategies.no_local_constants): the
    literals of the local modules a process imported (specproof when installed editable, a module a test
    wrote to tmp_path) would otherwise move a derandomized test's examples with what its xdist worker ran
    before it. Tests marked ``local_constants`` compare draws with and without them, so run outside."""
    if request.node.get_closest_marker("local_constants") is not None:
        yield
        return
    from specproof.strategies import no_local_constants

    with no_local_constants():
        yield


class RedisServer:
    def __init__(self, url: str, process: subprocess.Popen[bytes]) -> None:
        self.url, self.process = url, process

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


@pytest.fixture
def redis_server(tmp_path: Any) -> Iterator[RedisServer]:
    """A real ``redis-server`` on a free loopback port (``.url``, ``.stop()``), stopped after the test.

    Skipped (with the reason) only where redis-server is not installed and SPECPROOF_REQUIRE_REDIS
    is unset; CI (.ci/run) installs it and sets SPECPROOF_REQUIRE_REDIS=1, so there it must run.
    """
    server = shutil.which("redis-server")
    if server is None:
        if os.environ.get("SPECPROOF_REQUIRE_REDIS"):
            pytest.fail("redis-server is not installed, and SPECPROOF_REQUIRE_REDIS is set (CI must run this test)")
        pytest.skip("redis-server is not installed (apt-get install redis-server; .ci/run does)")
    # A free port is picked, then bound by redis-server: another process can take it in between,
    # and redis-server then exits at once. That is retried on a new port (never reported as a failure).
    dirs = ["--dir", str(tmp_path)]
    for _attempt in range(5):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen(
            [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", *dirs],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while proc.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    pass
            except OSError:
                if time.monotonic() > deadline:
                    proc.kill()
                    pytest.fail(f"redis-server did not answer on port {port} within 10 s")
                time.sleep(0.05)
                continue
            time.sleep(0.1)  # connected: still ours only if it is still running
            if proc.poll() is None:
                break
        if proc.poll() is None:
            break
    else:
        pytest.fail("redis-server exited at start on 5 free ports in a row")
    server_ = RedisServer(f"redis://127.0.0.1:{port}/0", proc)
    try:
        yield server_
    finally:
        server_.stop()


@pytest.fixture(scope="session")
def seed_reaching_max_context() -> int:
    """A ``--seed`` whose quick search of the built-in stack reaches ``clamped_at_max_context`` in both
    engine cases (the derandomized gate reaches it in neither): the rare path of the covering-example tests.

    Which seeds do depends on the Hypothesis version (3 under 6.155.2 and 6.170.15; constraints.txt
    pins the version tox and CI install, and a new one may move it), so it is searched for, about a
    second a seed, not written down. None in 1..40 is a skip naming the version, never a pass. Searched in
    each xdist worker, not shared. (A worker that read another's answer once failed the covering-example
    tests in a full run, its plain gate reaching max_context: Hypothesis drew from the constants of the
    local modules each worker had imported. The project's searches now draw none of them,
    docs/contract.md "The same examples in every process".)
    """
    import hypothesis

    from specproof.conformance import certify

    for seed in range(1, 41):
        report = certify("engine", only=("engine.stop",), seed=seed, db="none")
        if all(row["clamped_at_max_context"] for row in report.path_coverage.values()):
            return seed
    pytest.skip(f"no --seed in 1..40 reaches max_context in a quick search under Hypothesis {hypothesis.__version__}")


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Pure certify runs several tests read, run once per session across xdist workers (tests/_shared_runs.py)."""
    from _shared_runs import SharedRuns

    base = tmp_path_factory.getbasetemp()  # under xdist, a worker's own: its parent is the session's
    return SharedRuns(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base)
