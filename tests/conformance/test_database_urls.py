"""``--db`` takes a Redis URL as redis-py's own parser reads it (issue 35, faults): a password
(``redis://:PASSWORD@HOST``), an IPv6 host in brackets (``redis://[::1]:PORT``) and TLS
(``rediss://``) reach a real ``redis-server`` set up that way; a URL it refuses, or one naming no
host, is a usage error quoting redis-py's reason; the password is never printed (``***``)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from specproof.cli import main
from specproof.conformance._database import open_database, redacted
from specproof.contract import UsageError

FORMS = "e.g. redis://HOST:PORT/N, redis://:PASSWORD@HOST:PORT/N, redis://[::1]:6379/0, rediss://HOST:PORT/N"
PASSWORD = "s3cret-pw"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("redis://", f"--db 'redis://': not a Redis URL: it names no host (redis-py would take localhost:6379 in "
         f"silence) ({FORMS})"),
        ("redis://h:notaport/0", f"--db 'redis://h:notaport/0': not a Redis URL: Port could not be cast to integer "
         f"value as 'notaport' ({FORMS})"),
        ("http://h:1/0", f"--db 'http://h:1/0': not a Redis URL: Redis URL must specify one of the following schemes "
         f"(redis://, rediss://, unix://) ({FORMS})"),
        ("redis://:pw@h:70000/0", f"--db 'redis://:***@h:70000/0': not a Redis URL: Port out of range 0-65535 "
         f"({FORMS})"),
    ],
)  # fmt: skip
def test_a_url_redis_py_refuses_is_a_usage_error_with_its_reason(value: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(UsageError) as err:
        open_database(value, default_dir=tmp_path / "examples")
    assert str(err.value) == message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw@h:1/0", "redis://:***@h:1/0"),
        ("redis://user:pw@[::1]:1/0", "redis://user:***@[::1]:1/0"),
        ("rediss://h:1/0", "rediss://h:1/0"),
        ("/some/dir", "/some/dir"),
    ],
)
def test_a_password_is_never_shown(url: str, shown: str) -> None:
    assert redacted(url) == shown


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.fixture
def redis_with_password(tmp_path: Path) -> Iterator[dict[str, int]]:
    """A real redis-server that asks for a password, on 127.0.0.1 and (where the host has it) ::1,
    with a TLS port beside its plain one (a self-signed certificate); ``{"port": P, "tls": T}``."""
    server = shutil.which("redis-server")
    if server is None or shutil.which("openssl") is None:
        pytest.skip("redis-server and openssl are needed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    binds = ["127.0.0.1", "::1"] if socket.has_ipv6 and _ipv6_loopback() else ["127.0.0.1"]
    port, tls = _free_port(), _free_port()
    args = [server, "--port", str(port), "--bind", *binds, "--save", "", "--appendonly", "no", "--dir", str(tmp_path)]
    args += ["--requirepass", PASSWORD, "--tls-port", str(tls), "--tls-cert-file", str(cert)]
    args += ["--tls-key-file", str(key), "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not (_answers("127.0.0.1", port) and _answers("127.0.0.1", tls)):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.skip(f"redis-server did not start with a password, ::1 and TLS (exit {proc.poll()})")
            time.sleep(0.05)
        yield {"port": port, "tls": tls, "ipv6": int("::1" in binds)}
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def _round_trip(url: str, tmp_path: Path) -> str:
    """Open ``url`` as --db does, save an example through it and read it back; the spec it reports."""
    store = open_database(url, default_dir=tmp_path / "examples")
    assert store is not None and store.shared_database is not None
    store.shared_database.save(b"specproof-url-test", b"\x00value")
    assert list(store.shared_database.fetch(b"specproof-url-test")) == [b"\x00value"]
    assert store.lost is None, store.lost
    return store.spec


def test_a_password_an_ipv6_host_and_tls_reach_a_real_server(
    redis_with_password: dict[str, int], tmp_path: Path
) -> None:
    port, tls = redis_with_password["port"], redis_with_password["tls"]
    assert _round_trip(f"redis://:{PASSWORD}@127.0.0.1:{port}/0", tmp_path) == f"redis://:***@127.0.0.1:{port}/0"
    assert _round_trip(f"redis://default:{PASSWORD}@127.0.0.1:{port}/1", tmp_path).endswith(f"***@127.0.0.1:{port}/1")
    if redis_with_password["ipv6"]:
        assert _round_trip(f"redis://:{PASSWORD}@[::1]:{port}/0", tmp_path) == f"redis://:***@[::1]:{port}/0"
    ca = tmp_path / "cert.pem"
    assert _round_trip(f"rediss://:{PASSWORD}@127.0.0.1:{tls}/0?ssl_ca_certs={ca}", tmp_path).startswith("rediss://")
    # the server's refusals are usage errors naming why, the password never shown
    for url, why in [
        (f"redis://:wrong@127.0.0.1:{port}/0", "AuthenticationError"),
        (f"redis://127.0.0.1:{port}/0", "AuthenticationError"),  # no password: the server asks for one
    ]:
        with pytest.raises(UsageError) as err:
            open_database(url, default_dir=tmp_path / "examples")
        assert why in str(err.value) and "wrong" not in str(err.value), err.value


def test_certify_with_a_password_url_never_prints_the_password(
    redis_with_password: dict[str, int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"redis://:{PASSWORD}@127.0.0.1:{redis_with_password['port']}/0"
    report = tmp_path / "r.json"
    args = ["certify", "drafter", "--only", "drafter.max-length", "--db", url, "--hypothesis-dir", str(tmp_path / "h")]
    code = main([*args, "--report", str(report)])
    printed = capsys.readouterr()
    assert code == 0, printed.out[-3000:]
    assert PASSWORD not in printed.out + printed.err + report.read_text()
    assert json.loads(report.read_text())["database"]["shared"] == url.replace(PASSWORD, "***")
