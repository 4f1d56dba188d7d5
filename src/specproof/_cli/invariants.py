"""``specproof invariants``: print the invariant registry (the one source of truth)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "invariants",
        help="list every invariant id, its subject, what must hold and what it needs",
        description="Print the invariant registry. Ids (and globs of them) are what `certify --only` takes.",
    )
    p.add_argument("--json", action="store_true", help="print the registry as JSON")
    p.add_argument("--markdown", action="store_true", help="print the table in docs/invariants.md")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specproof.conformance import REGISTRY
    from specproof.conformance.cli_support import markdown_table, registry_json

    if args.json:
        print(registry_json())
    elif args.markdown:
        print(markdown_table())
    else:
        width = max(len(inv.id) for inv in REGISTRY)
        for inv in REGISTRY:
            needs = f"  [needs {', '.join(inv.needs)}]" if inv.needs else ""
            print(f"{inv.id:<{width}}  {inv.subject:<7}  {inv.summary.replace('`', '')}{needs}")
    return 0
