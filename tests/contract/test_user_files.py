"""Every file a user hands the suite is bounded in size and JSON depth: a one-line error naming the
file (and line), before the memory is spent; the suite's own files of the same kind are accepted."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from specproof.bench import load_baseline
from specproof.bench._gate import BaselineError
from specproof.cli import main
from specproof.conformance.traces import GoldenFormatError, TraceFormatError, load_golden, read_trace
from specproof.contract.files import (
    MAX_JSON_DEPTH,
    MAX_USER_FILE_BYTES,
    FileTooLargeError,
    loads_bounded,
    read_bounded_text,
)
from specproof.strategies import SessionFileError, SessionHistory

DEEP = "[" * 200_000 + "]" * 200_000


def _huge(path: Path, size: int = MAX_USER_FILE_BYTES + 1) -> Path:
    with open(path, "wb") as fh:  # sparse: costs no disk and is never read whole
        fh.truncate(size)
    return path


def test_read_bounded_text_and_loads_bounded() -> None:
    assert loads_bounded('{"a": [[1]], "s": "' + "[" * 1000 + '"}')["a"] == [[1]]
    assert loads_bounded("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) is not None
    with pytest.raises(ValueError, match=f"nested more than {MAX_JSON_DEPTH} deep"):
        loads_bounded(DEEP)
    with pytest.raises(json.JSONDecodeError):
        loads_bounded("{")


def test_a_file_past_the_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    big = _huge(tmp_path / "big", MAX_USER_FILE_BYTES + 4096)
    # the size named is the file's (from its metadata): a read, of at most the limit + 1 bytes, would name that
    with pytest.raises(FileTooLargeError, match=f"{MAX_USER_FILE_BYTES + 4096} bytes, more than the limit"):
        read_bounded_text(big)
    small = tmp_path / "small"
    small.write_text("x" * 1000)
    assert read_bounded_text(small, max_bytes=1000) == "x" * 1000
    with pytest.raises(FileTooLargeError):
        read_bounded_text(small, max_bytes=999)


@pytest.mark.parametrize("content", ["huge", "deep"])
def test_session_files(tmp_path: Path, content: str) -> None:
    path = tmp_path / "session.json"
    if content == "huge":
        _huge(path)
        what = "more than the limit"
    else:
        path.write_text(DEEP)
        what = "nested more than"
    with pytest.raises(SessionFileError, match=what) as info:
        SessionHistory.load(path)
    assert str(path) in str(info.value)


def test_replay_session_with_an_oversized_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _huge(tmp_path / "session.json")
    start = time.monotonic()
    args = ["certify", "engine", "--engine", "specproof.conformance.zoo:snapshot_only_last_call"]
    with pytest.raises(SystemExit) as exited:  # the command line in-process: no interpreter to start
        raise SystemExit(main([*args, "--replay-session", str(path)]))
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    assert "more than the limit" in err and str(path) in err
    assert "Traceback" not in err
    assert time.monotonic() - start < 60


def test_traces_golden_files_and_baselines(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"format": "specproof-trace/1"}\n' + DEEP + "\n")
    with pytest.raises(TraceFormatError, match=r"line 2: JSON nested more than"):
        read_trace(trace)
    trace.write_text('{"format": "specproof-trace/1", "n": ' + "1" * 5000 + "}\n")
    with pytest.raises(TraceFormatError, match="line 1: invalid JSON"):
        read_trace(trace)
    golden = tmp_path / "g.json"
    golden.write_text(DEEP)
    with pytest.raises(GoldenFormatError, match="nested more than"):
        load_golden(golden)
    baseline = tmp_path / "b.json"
    baseline.write_text(DEEP)
    with pytest.raises(BaselineError, match=r"baseline .*b\.json: JSON nested more than"):
        load_baseline(baseline)
    _huge(baseline)
    with pytest.raises(BaselineError, match=r"not a baseline: .* more than the limit"):
        load_baseline(baseline)


def test_every_format_reads_within_its_own_size_limit(tmp_path: Path) -> None:
    """A format's ``read_text`` refuses a file past its ``max_bytes`` before reading it; traces and
    golden files may be larger than the other user files, never unbounded."""
    import attrs

    from specproof.formats import FORMATS, golden, trace

    for fmt in FORMATS:
        big = trace.MAX_BYTES if fmt.schema in ("trace-1", "golden-1") else MAX_USER_FILE_BYTES
        assert fmt.max_bytes == big, fmt.id
    assert golden.FORMAT_ONE_CASE_PER_LINE.max_bytes == trace.MAX_BYTES
    small = attrs.evolve(trace.FORMAT, max_bytes=10)
    path = tmp_path / "t.jsonl"
    path.write_text("x" * 10)
    assert small.read_text(path) == "x" * 10
    path.write_text("x" * 11)
    with pytest.raises(FileTooLargeError, match="11 bytes, more than the limit of 10 bytes"):
        small.read_text(path)
