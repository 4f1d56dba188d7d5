"""A run that names its command builds that command's parser alone (start-up: no bench or Core ML imports)."""

from __future__ import annotations

import argparse
import subprocess
import sys

from specproof.cli import COMMANDS, _named_command, build_parser


def _choices(parser: argparse.ArgumentParser) -> set[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


def test_every_command_is_found_by_the_name_its_module_registers() -> None:
    assert all(_named_command([name]) for name in _choices(build_parser()))
    for path in COMMANDS:
        (name,) = _choices(build_parser(path))
        assert _named_command([name, "--help"]) == path


def test_no_command_or_an_unknown_one_builds_every_parser() -> None:
    assert _named_command([]) is None
    assert _named_command(["--help"]) is None
    assert _named_command(["certfy"]) is None


def test_a_certify_run_imports_neither_bench_nor_coreml() -> None:
    code = (
        "import sys\n"
        "from specproof.cli import main\n"
        "try:\n    main(['certify', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith(('specproof.bench', 'specproof.coreml'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
