"""The options of a certification, defined once for ``specproof certify`` and the pytest plugin.

Each ``Option`` names its ``certify`` flag and its plugin twin (``--specproof-*``); the CLI
adds them to argparse (``add_to_argparse``), the plugin to pytest's parser
(``add_to_pytest``), from the same help, type, default and choices. A ``certify`` option
with no twin is listed in ``NOT_IN_PLUGIN`` with the reason (tests/conformance/test_plugin_options.py
fails on one that is neither).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from specproof.conformance._profiles import PROFILES
from specproof.contract.validation import integer_argument, number_argument
from specproof.formats import report as report_format
from specproof.formats import session as session_format

__all__ = [
    "NOT_IN_PLUGIN",
    "OPTIONS",
    "SUBJECT_OPTIONS",
    "Option",
    "add_to_argparse",
    "add_to_pytest",
    "get",
    "plan_arguments",
]


def _capacities() -> str:
    """``quick 4096, ci 16384, release 65536``: each profile's largest context, from the profiles."""
    return ", ".join(f"{name} {profile.max_capacity}" for name, profile in PROFILES.items())


@attrs.frozen(kw_only=True)
class Option:
    dest: str  # certify's argparse dest; the plugin's is "specproof_" + dest
    cli: str  # certify's flag ("" for the positional subject)
    plugin: str  # the pytest plugin's flag
    help: str  # "{verb}": certify / fuzz
    default: Any = None
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    repeat: bool = False  # action="append"
    flag: bool = False  # action="store_true": on when given
    # a ``Plan.create`` argument of the same name (False: resolved first, e.g. --db opens a database,
    # or not part of the plan at all, e.g. --report)
    plan: bool = True
    # an opt-in option (some checks run only with it): why those checks skip when it is not given,
    # ``{flag}`` standing for ``cli`` (the drivers' ``options``, drivers/_protocol.py)
    skip_without: str = ""

    def not_given(self) -> str:
        """Why a check that runs only with this option skips without it (it names the flag to give)."""
        return (self.skip_without or f"{self.dest} was not asked for: give {{flag}}").format(flag=self.cli)

    def kwargs(self, verb: str) -> dict[str, Any]:
        out: dict[str, Any] = {"help": self.help.format(verb=verb), "default": self.default}
        if self.repeat:
            out.update(action="append", default=[])
        if self.flag:
            out.update(action="store_true", default=False)
        if self.type is not None:
            out["type"] = self.type
        if self.metavar is not None:
            out["metavar"] = self.metavar
        if self.choices is not None:
            out["choices"] = self.choices
        return out


OPTIONS: tuple[Option, ...] = (
    Option(
        dest="subject",
        cli="",
        plugin="--specproof-subject",
        choices=("drafter", "target", "engine", "all"),
        help="what to {verb} (default: inferred from the options given; 'all' for the built-in stack)",
    ),
    Option(
        dest="drafter",
        cli="--drafter",
        plugin="--specproof-drafter",
        metavar="SPEC",
        help="drafter to {verb} (default: ngram)",
    ),
    Option(
        dest="target", cli="--target", plugin="--specproof-target", metavar="SPEC", help="target (default: reference)"
    ),
    Option(
        dest="engine",
        cli="--engine",
        plugin="--specproof-engine",
        metavar="SPEC",
        help="engine to {verb}: MODULE:ATTR, exec:'CMD ARGS', tcp:HOST:PORT, vllm:DIR[,OPTION=VALUE...], "
        "llamacpp:FILE[,OPTION=VALUE...]",
    ),
    Option(
        dest="oracle",
        cli="--oracle",
        plugin="--specproof-oracle",
        metavar="SPEC",
        help="the model the target was converted from (a target spec: reference:..., family:NAME, hf:DIR, mlx:DIR): "
        "target.matches-source compares the target's logits with it (docs/contract.md, Targets)",
    ),
    Option(
        dest="tie_tolerance",
        cli="--tie-tolerance",
        plugin="--tie-tolerance",  # (the plugin's name since before the --specproof- prefix)
        type=number_argument,
        help="top-2 logit margin under which a divergence from greedy is excused (default: the subject's own, else 0)",
    ),
    Option(
        dest="atol",
        cli="--atol",
        plugin="--atol",
        type=number_argument,
        help="absolute tolerance on logits and recurrent state (default: the subject's own, else 0 = exact)",
    ),
    Option(
        dest="only",
        cli="--only",
        plugin="--specproof-only",
        repeat=True,
        metavar="ID",
        help="run only these invariant ids or globs (comma-separated or repeated; `specproof invariants` lists them)",
    ),
    Option(
        dest="profile",
        cli="--profile",
        plugin="--specproof-profile",
        default="quick",
        help="quick | ci | release (default quick)",
    ),
    Option(
        dest="sampling",
        cli="--sampling",
        plugin="--specproof-sampling",
        metavar="PARAMS",
        help="also {verb} sampled decoding at these parameters: temperature=T[,top_k=K,top_p=P,min_p=M] "
        "(the sampling checks run only with it; docs/contract.md, Sampling)",
        skip_without="sampled decoding was not asked for: give {flag} temperature=T[,top_p=P,...] "
        "(docs/contract.md, Sampling)",
    ),
    Option(
        dest="batches",
        cli="--batches",
        plugin="--specproof-batches",
        flag=True,
        help="also {verb} a batched engine's batches: the batch.* checks run only with it (at quick they add "
        "about 250%% to the built-in stack's CPU time; docs/contract.md, Batches)",
        skip_without="batches were not asked for: give {flag} (docs/contract.md, Batches)",
    ),
    Option(
        dest="decode_state",
        cli="--decode-state",
        plugin="--specproof-decode-state",
        flag=True,
        help="also {verb} decode-time state (penalties, logit bias, bad words, min_tokens, stop sequences) on "
        "engines that declare decode_features: the decode.* checks run only with it (docs/contract.md, Decode state)",
        skip_without="decode-time parameters were not asked for: give {flag} (docs/contract.md, Decode state)",
    ),
    Option(
        dest="trees",
        cli="--trees",
        plugin="--specproof-trees",
        flag=True,
        help="also {verb} token-tree drafts on a tree engine: the tree.* checks run only with it "
        "(docs/contract.md, Trees)",
        skip_without="trees were not asked for: give {flag} (docs/contract.md, Trees)",
    ),
    Option(
        dest="seed",
        cli="--seed",
        plugin="--specproof-seed",
        type=integer_argument,
        help="Hypothesis seed (default: derandomized)",
    ),
    Option(
        dest="max_context",
        cli="--max-context",
        plugin="--specproof-max-context",
        type=integer_argument,
        metavar="N",
        help="test an engine at a context capacity of N tokens (default: its max_context, bounded by the "
        f"profile: {_capacities()}); the certificate says which capacity was tested",
    ),
    Option(
        dest="expect_fail",
        plan=False,
        cli="--expect-fail",
        plugin="--specproof-expect-fail",
        repeat=True,
        metavar="ID[=REASON]",
        help="a known, documented failure of this invariant: reported as xfail, not failing the verdict; "
        "if it passes it is xpass and fails the verdict (strict). Repeatable",
    ),
    Option(
        dest="expect_fail_file",
        plan=False,
        cli="--expect-fail-file",
        plugin="--specproof-expect-fail-file",
        metavar="FILE",
        help="expected failures, one `ID [reason]` per line (`#` comments); a bad line is a usage error",
    ),
    Option(
        dest="report",
        plan=False,
        cli="--report",
        plugin="--specproof-report",
        metavar="FILE",
        help=f"write the {report_format.ID} JSON here",
    ),
    Option(
        dest="markdown",
        plan=False,
        cli="--markdown",
        plugin="--specproof-markdown",
        metavar="FILE",
        help="write the Markdown certificate here",
    ),
    Option(
        dest="replay_session",
        cli="--replay-session",
        plugin="--specproof-replay-session",
        metavar="FILE",
        help=f"replay a saved {session_format.ID} request history on the engine (what a session failure's "
        "reproduce command does)",
    ),
    Option(
        dest="hypothesis_dir",
        plan=False,
        cli="--hypothesis-dir",
        plugin="--specproof-hypothesis-dir",
        metavar="DIR",
        help="Hypothesis' storage directory (default $SPECPROOF_HYPOTHESIS_DIR, else ~/.cache/specproof/hypothesis); "
        "never .hypothesis/ in the working directory",
    ),
    Option(
        dest="db",
        plan=False,
        cli="--db",
        plugin="--specproof-db",
        metavar="PATH|redis://HOST:PORT/N|none",
        help="the example database failures (and, from seeded runs, covering examples) are saved in and "
        "replayed from first (default: examples/ in the Hypothesis directory); a Redis URL as redis-py reads it "
        "(redis://HOST:PORT/N, redis://:PASSWORD@HOST/N, redis://[::1]:6379/0, rediss:// for TLS) shares one "
        "across machines (kept beside the local directory); none remembers nothing",
    ),
    Option(
        dest="db_replay",
        plan=False,
        cli="--db-replay",
        plugin="--specproof-db-replay",
        default="all",
        choices=("all", "failures"),
        help="what a derandomized run replays from the database: all (saved failures, then the covering "
        "examples of rollback paths its own search did not reach; the default) or failures (saved failures "
        "only: the gate's examples and cost are its own, whatever campaigns saved)",
    ),
)

NOT_IN_PLUGIN: dict[str, str] = {
    "junitxml": "pytest's own --junitxml writes one testcase per check",
    "json": "prints the report in place of the table; under pytest, --specproof-report FILE writes it",
    "help": "pytest's own --help lists the plugin's options",
    "func": "the subcommand's entry point, not an option",
}

_BY_DEST = {o.dest: o for o in OPTIONS}

SUBJECT_OPTIONS: tuple[str, ...] = (
    "subject",
    "drafter",
    "target",
    "engine",
    "oracle",
    "tie_tolerance",
    "atol",
    "only",
)
"""What to check and how strictly: the options ``certify`` and ``fuzz`` share."""


def plan_arguments(values: Mapping[str, Any], dests: Iterable[str] | None = None) -> dict[str, Any]:
    """The ``Plan.create`` arguments among these option values (by dest; ``dests``: only these).

    The one mapping from options to a plan, for ``specproof certify`` and ``fuzz``, the pytest
    plugin and ``certify()``: an option given as a list (``--only``, repeated) becomes a tuple.
    """
    wanted = set(_BY_DEST) if dests is None else set(dests)
    out: dict[str, Any] = {}
    for option in OPTIONS:
        if option.plan and option.dest in wanted and option.dest in values:
            value = values[option.dest]
            out[option.dest] = tuple(value or ()) if option.repeat else value
    return out


def get(dest: str) -> Option:
    return _BY_DEST[dest]


def add_to_argparse(parser: Any, dests: Iterable[str], *, verb: str) -> None:
    """Add these options to an argparse parser under their ``certify`` flags."""
    for dest in dests:
        option = _BY_DEST[dest]
        kwargs = option.kwargs(verb)
        if option.cli:
            parser.add_argument(option.cli, **kwargs)
        else:  # the positional subject
            parser.add_argument(option.dest, nargs="?", **kwargs)


def add_to_pytest(group: Any) -> None:
    """Add every option to the plugin's pytest option group under its ``--specproof-*`` flag."""
    for option in OPTIONS:
        group.addoption(option.plugin, dest="specproof_" + option.dest, **option.kwargs("certify"))
