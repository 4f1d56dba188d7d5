"""The ``specproof`` command.

Each subcommand lives beside the part of the design it drives and registers
itself here through ``COMMANDS`` (module paths, imported when the parser is
built, only the named command's when the arguments name one; those modules keep
heavy imports inside their ``run`` functions).
Exit codes: 0 success, 1 a failure the command found, 2 a usage error, 3 (certify) nothing was
certified, 130 interrupted. A closed output pipe (``specproof ... | head``) ends quietly.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from specproof._version import __version__
from specproof.contract import UsageError

__all__ = ["COMMANDS", "UsageError", "main"]

# Each module defines add_parser(subparsers) and sets a `func(args) -> int` default.
COMMANDS: tuple[str, ...] = (
    "specproof._cli.generate",
    "specproof._cli.certify",
    "specproof._cli.fuzz",
    "specproof._cli.check_trace",
    "specproof._cli.bundle",
    "specproof._cli.bench",
    "specproof._cli.invariants",
    "specproof._cli.native",
    "specproof._cli.export",
)


class _Parser(argparse.ArgumentParser):
    """A usage error is one line naming the command and the problem (``specproof certify: error: ...``),
    as the errors found after parsing are; ``--help`` shows the usage. Subcommands inherit the class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _named_command(argv: Sequence[str]) -> str | None:
    """The module of the command ``argv`` starts with (``check-trace``: ``specproof._cli.check_trace``), if any."""
    if argv:
        for path in COMMANDS:
            if path.rsplit(".", 1)[-1].replace("_", "-") == argv[0]:
                return path
    return None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or (``command``: one of ``COMMANDS``) of that one alone: a run imports
    its own command's module, not the others' (bench, Core ML), which cost start-up time it does not need."""
    parser = _Parser(
        prog="specproof",
        description="Verify and certify lossless greedy speculative decoding on hybrid language models.",
    )
    parser.add_argument("--version", action="version", version=f"specproof {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for path in COMMANDS if command is None else (command,):
        try:
            module = importlib.import_module(path)
        except ModuleNotFoundError as exc:  # a command not written yet in this checkout
            if exc.name != path:
                raise
            continue
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from specproof.contract.errors import InvalidSettingError, PluginError, SpecproofError

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_named_command(argv))
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except (UsageError, PluginError, InvalidSettingError) as exc:
        print(f"specproof {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except SpecproofError as exc:
        print(f"specproof {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`specproof generate --json | head`): stop quietly, as cat does
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # python -m specproof.cli
    raise SystemExit(main())
