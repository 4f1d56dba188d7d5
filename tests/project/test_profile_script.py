"""benchmarks/profile_tests.py, the `tests` env's profile summary (docs/bench.md, "The tests env"): its
shares are read from py-spy's collapsed stacks as a profile of the suite gives them."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "profile_tests.py"
# an xdist worker's process frame holds a ";" of its own, which must not split it
_TOP = 'process 1:"python -m pytest";process 2:"python -c import sys;exec(x)";main (_pytest/main.py:10)'
_ZOO = "test_one (test_zoo.py:5);certify (specproof/conformance/__init__.py:9)"
_STACKS = (  # py-spy's raw format: frames joined by ";", then the samples
    (
        _ZOO,
        "ReferenceHybrid._run (specproof/engine/targets/reference.py:900)",
        "_rms_norm (specproof/engine/targets/_reference_blocks.py:44)",
        6,
    ),
    (_ZOO, "draw (hypothesis/core.py:3)", 2),
    ("test_two (test_layers.py:7)", "ReferenceHybrid.__init__ (specproof/engine/targets/reference.py:640)", 1),
    ("collect (_pytest/main.py:20)", 1),
)
RAW = "".join(";".join((_TOP, *stack[:-1])) + f" {stack[-1]}\n" for stack in _STACKS) + "\n"


@pytest.fixture(scope="module")
def script() -> dict[str, object]:
    return runpy.run_path(str(SCRIPT))


def test_the_summary_gives_each_share_of_all_samples(script: dict[str, object], tmp_path: Path) -> None:
    raw = tmp_path / "prof.raw"
    raw.write_text(RAW)
    text = script["summarise"](script["read_stacks"](raw), top=5)  # type: ignore[operator]
    lines = text.splitlines()
    assert lines[0] == "10 samples"
    assert "  80.0%  in-process certify runs" in lines
    assert "  60.0%  reference forward (ReferenceHybrid._run)" in lines
    assert "  10.0%  reference construction (ReferenceHybrid.__init__)" in lines
    assert "  80.0%  test_zoo" in lines and "  10.0%  test_layers" in lines
    assert "  10.0%  (outside a test function)" in lines
    assert "  60.0%  _rms_norm (specproof/engine/targets/_reference_blocks.py)" in lines  # line numbers merged
    assert "  70.0%  specproof" in lines and "  20.0%  hypothesis" in lines
    assert ' 100.0%  process 2:"python -c import sys;exec(x)"' in lines  # one frame, not two
    assert not any(line.endswith('exec(x)"') and "process" not in line for line in lines)


def test_it_asks_for_one_mode_and_an_existing_profile(
    script: dict[str, object], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv, message in (([], "give one of --out"), (["--summary", str(tmp_path / "none.raw")], "no such profile")):
        with pytest.raises(SystemExit) as stop:
            script["main"](argv)  # type: ignore[operator]
        assert stop.value.code == 2
        assert message in capsys.readouterr().err
