"""``specproof bundle inspect|export|check``: judge a Core ML bundle for verify forwards; export a reference
as one; check one against the model it was exported from.

``inspect`` exits 0 when a function of the bundle qualifies for a K-token verify
forward, 1 when none does, 2 when the path is not a readable bundle. ``check`` exits 0 when
the bundle computes what its source computes, 1 when it does not, 2 on bad input, 3 when a
rule exercised nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from specproof._cli.common import add_target_argument
from specproof.contract.validation import integer_argument
from specproof.formats import bundle_inspect as bundle_inspect_format
from specproof.formats import golden as golden_format

_EXPORT_TARGET_HELP = (
    "reference target spec to export (default reference:layers=conv+attn+conv+attn): conv, attn and gdn blocks, "
    "dense or mixture-of-experts feed-forwards; at least one attn and one conv or gdn block"
)


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "bundle",
        help="inspect a Core ML bundle for verify qualification, or export the reference target as one",
        description="Core ML bundles: inspect (any OS, no model load) and export (the reference target, stateful).",
    )
    bsub = p.add_subparsers(dest="bundle_command", metavar="ACTION")
    ins = bsub.add_parser(
        "inspect",
        help="list inputs/outputs/states and say whether the bundle can verify K draft tokens in one forward",
        description=(
            "Read a .mlpackage without loading it and give each function a verdict. "
            "Exit 0: a function qualifies; 1: none does; 2: not a readable bundle."
        ),
    )
    ins.add_argument("path", help="the .mlpackage (or .mlmodel)")
    ins.add_argument(
        "--k", type=integer_argument, default=4, help="draft tokens per verify forward (default 4: K+1=5 ids)"
    )
    ins.add_argument("--json", action="store_true", help=f"print the verdict as JSON ({bundle_inspect_format.ID})")
    ins.set_defaults(func=run_inspect)
    _add_export_parser(bsub)
    _add_check_parser(bsub)
    _add_host_loop_parser(bsub)
    p.set_defaults(func=lambda args: _no_action(p))


def _add_layout_arguments(exp: argparse.ArgumentParser) -> None:
    """``bundle export``'s options for where states live and how the program reads positions and runs GDN."""
    from specproof.coreml import GDN_FORMS, LAYOUTS, POSITIONS

    exp.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="all-mlstate",
        help="all-mlstate: every state a Core ML state (default); kv-mlstate: KV cache as states, conv_state and "
        "rec_state as input/output tensors (NAME -> NAME_out), the layout that runs on the Neural Engine; "
        "unified-kv: as kv-mlstate with keys and values in one state kv_cache [2, ...]",
    )
    exp.add_argument(
        "--positions",
        choices=POSITIONS,
        default="scalar",
        help="scalar: position [1] = processed (default); seed: position_ids [1, processed + q], every position of "
        "the context so far and of the chunk, the program reading the last q (a length that grows with the "
        "context: docs/coreml.md, Position layouts)",
    )
    exp.add_argument(
        "--gdn",
        choices=GDN_FORMS,
        default="unrolled",
        help="how gdn blocks run the delta rule over a chunk: unrolled max_query masked steps (default) "
        "or a while_loop",
    )


def _add_export_parser(bsub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from specproof.coreml import DEFAULT_EXPORT_TARGET, DEFAULT_MAX_QUERY, FAMILIES

    exp = bsub.add_parser(
        "export",
        help="export the reference target as a stateful ML program (iOS 18 / macOS 15), optionally with golden outputs",
        description=(
            "Build the reference target's forward with coremltools' MIL builder: fp16 states key_cache, value_cache, "
            "conv_state, rec_state (with gdn blocks) at full max_context; input_ids [1, 1..MAX_QUERY]; position [1] "
            "(--positions seed: position_ids [1, processed + q]); "
            "logits [1, q, vocab]. docs/coreml.md"
        ),
    )
    exp.add_argument("path", help="output .mlpackage path")
    exp.add_argument(
        "--k", type=integer_argument, default=4, help="draft tokens the bundle must verify per forward (default 4)"
    )
    exp.add_argument(
        "--max-query",
        type=integer_argument,
        default=None,
        help=f"longest token chunk per forward (default max(K+1, {DEFAULT_MAX_QUERY}), 16 with unrolled gdn blocks; "
        "prefill is chunked)",
    )
    exp.add_argument(
        "--max-context",
        type=integer_argument,
        default=None,
        help="KV cache length of the exported states (default 512, a family's own 128; weights do not change)",
    )
    exp.add_argument(
        "--family",
        choices=tuple(FAMILIES),
        default=None,
        help="export a flagship shape instead of --target: lfm2-moe (conv+attn, MoE) or qwen3.6-moe "
        "(gdn+gdn+gdn+attn, MoE; all four states); docs/coreml.md",
    )
    _add_layout_arguments(exp)
    exp.add_argument(
        "--last-token-only",
        action="store_true",
        help="export logits [1, 1, vocab] for the last position only (a variant the inspector must reject)",
    )
    exp.add_argument(
        "--golden", default=None, metavar="FILE", help=f"also write greedy tokens of fixed prompts ({golden_format.ID})"
    )
    exp.add_argument(
        "--multifunction",
        action="store_true",
        help="write fixed-shape functions sharing weights and states: decode (input_ids [1, 1], the default) and "
        "verify ([1, K+1]), the shapes the Neural Engine runs (docs/coreml.md); not with --max-query or "
        "--last-token-only",
    )
    _add_tree_argument(exp)
    exp.add_argument("--force", action="store_true", help="replace an existing bundle at PATH")
    add_target_argument(exp, default=DEFAULT_EXPORT_TARGET)
    exp.set_defaults(func=run_export)
    for action in exp._actions:
        if action.dest == "target":
            action.help = _EXPORT_TARGET_HELP


def _add_tree_argument(exp: argparse.ArgumentParser) -> None:
    exp.add_argument(
        "--tree",
        type=integer_argument,
        default=None,
        metavar="N",
        help="also write a verify_tree function: a token tree of N nodes (the pending token and N-1 draft nodes) "
        "in one forward, from input_ids [1, N] and parents [N]; per-node states out for the host to commit "
        "(docs/coreml.md, Trees); with or without --multifunction",
    )


def _add_check_parser(bsub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from specproof.contract.validation import number_argument
    from specproof.coreml import CheckOptions

    defaults = CheckOptions()
    chk = bsub.add_parser(
        "check",
        help="check a bundle (run by the ML-program evaluator, any OS) against the model it was exported from",
        description=(
            "Feed drawn token sequences in drawn chunkings to the bundle (through the numpy evaluator of its saved "
            "program) and to the source model: logits per position within --rtol, the states both hold after every "
            "chunk, greedy tokens of the golden prompts. Exit 0: it computes what the source computes; 1: it does "
            "not; 2: bad input; 3: a rule exercised nothing. docs/coreml.md"
        ),
    )
    chk.add_argument("path", help="the .mlpackage")
    chk.add_argument(
        "--against",
        default=None,
        metavar="SPEC",
        help="the source model's target spec (trained, reference:..., family:NAME, hf:/path, mlx:/path); "
        "default: the bundle's specproof.target metadata",
    )
    chk.add_argument("--examples", type=integer_argument, default=defaults.examples, help="drawn token sequences")
    chk.add_argument("--max-tokens", type=integer_argument, default=defaults.max_tokens, help="longest drawn sequence")
    chk.add_argument(
        "--rtol",
        type=number_argument,
        default=defaults.rtol,
        help=f"tolerance as a fraction of a row's (a state's) largest |source value| (default {defaults.rtol})",
    )
    chk.add_argument(
        "--router-margin",
        type=number_argument,
        default=defaults.router_margin,
        help="rows from the first source router decision closer than this (router logits) are not compared: "
        f"an fp16 bundle may route it otherwise (default {defaults.router_margin})",
    )
    chk.add_argument(
        "--tie-tolerance",
        type=number_argument,
        default=defaults.tie_tolerance,
        help=f"top-2 logit margin that excuses a greedy divergence (default {defaults.tie_tolerance})",
    )
    chk.add_argument("--seed", type=integer_argument, default=None, help="Hypothesis seed (default: derandomized)")
    chk.add_argument("--json", action="store_true", help="print the report as JSON")
    chk.set_defaults(func=run_check)


def _check_source(args: argparse.Namespace) -> tuple[Any, str]:
    """The source model and its spec: --against, else the bundle's specproof.target metadata."""
    from specproof.contract import UsageError
    from specproof.contract.errors import SpecproofError
    from specproof.coreml import BundleReadError, inspect_bundle
    from specproof.plugins import load_target

    spec = args.against
    if spec is None:
        try:
            spec = inspect_bundle(args.path).metadata.get("specproof.target")
        except BundleReadError as exc:
            raise UsageError(f"bundle check: {exc}") from None
        if not spec:
            raise UsageError(
                f"bundle check: {args.path!r} records no specproof.target; name the source: --against SPEC"
            )
    try:
        return load_target(spec), spec
    except SpecproofError as exc:
        raise UsageError(f"bundle check --against {spec!r}: {exc}") from None


def _add_host_loop_parser(bsub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from specproof.formats import trace as trace_format

    hl = bsub.add_parser(
        "host-loop",
        help="run docs/swift-engine.md's host loop over a multifunction bundle (any OS) and write its trace",
        description=(
            "The on-device host loop (decode/verify functions, position layout, states threaded through every call, "
            "restore-and-replay), transcribed to Python and run by the ML-program evaluator; the trace it writes is "
            f"{trace_format.ID}, for `specproof check-trace`. docs/swift-engine.md"
        ),
    )
    hl.add_argument("path", help="a multifunction .mlpackage (bundle export --multifunction)")
    hl.add_argument("--trace", required=True, metavar="FILE", help=f"the {trace_format.ID} trace to write")
    hl.add_argument("--prompt", default=None, help="prompt text (UTF-8 bytes: a byte-level vocabulary)")
    hl.add_argument("--ids", default=None, help="prompt token ids, comma- or space-separated")
    hl.add_argument("--max-new-tokens", type=integer_argument, default=32, help="tokens to generate (default 32)")
    hl.add_argument("--eos", type=integer_argument, default=None, help="end-of-sequence token id (default: none)")
    hl.add_argument("--drafter", default="ngram", help="drafter spec (default ngram), as `specproof generate`'s")
    hl.set_defaults(func=run_host_loop)


def run_host_loop(args: argparse.Namespace) -> int:
    from specproof._cli.common import parse_ids
    from specproof.conformance.traces import write_trace
    from specproof.contract import UsageError
    from specproof.contract.errors import SpecproofError
    from specproof.contract.files import check_output_path
    from specproof.coreml import HostLoop
    from specproof.plugins import load_drafter

    if (args.prompt is None) == (args.ids is None):
        raise UsageError("bundle host-loop: give one prompt: --prompt TEXT or --ids IDS")
    check_output_path(args.trace, option="--trace")  # before any decoding; nothing is created
    try:
        prompt = parse_ids(args.ids) if args.ids is not None else list(str(args.prompt).encode("utf-8"))
        loop = HostLoop(args.path, load_drafter(args.drafter))
        gen = loop.generate(prompt, args.max_new_tokens, eos_token_id=args.eos)
    except SpecproofError as exc:
        raise UsageError(f"bundle host-loop: {exc}") from None
    write_trace(
        args.trace, gen, prompt=prompt, k=loop.k, max_new_tokens=args.max_new_tokens, eos_token_id=args.eos,
        vocab_size=loop.vocab_size, engine=f"specproof bundle host-loop ({loop.positions} positions)",
        target=f"coreml-eval:{args.path}", max_context=loop.max_context, rollback="replay",
    )  # fmt: skip
    calls = ", ".join(f"{name} {n}" for name, n in sorted(loop.calls.items()))
    print(f"wrote {args.trace}: {len(gen.steps or ())} rounds, {len(gen.tokens)} tokens ({gen.stop_reason}); {calls}")
    return 0


def run_check(args: argparse.Namespace) -> int:
    from specproof.contract import UsageError
    from specproof.contract.errors import InvalidSettingError
    from specproof.coreml import CheckOptions, check_bundle

    try:
        options = CheckOptions(
            examples=args.examples,
            max_tokens=args.max_tokens,
            rtol=args.rtol,
            router_margin=args.router_margin,
            tie_tolerance=args.tie_tolerance,
            seed=args.seed,
        )
    except InvalidSettingError as exc:
        raise UsageError(str(exc)) from None
    source, spec = _check_source(args)
    try:
        report = check_bundle(args.path, source, against=spec, options=options)
    except InvalidSettingError as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
        return report.exit_code
    print(f"specproof bundle check — {report.path} against {spec}")
    for r in report.results:
        print(f"{r.status:<12} {r.id:<14} ({r.exercised} exercised) {r.detail}")
    print(f"verdict: {report.verdict.upper()} in {report.seconds:.1f} s (exit {report.exit_code})")
    return report.exit_code


def _no_action(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _print_report(report: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(100, Console().width))
    head = Table(title=f"specproof bundle inspect — {report.path}", show_header=False)
    head.add_row("model", f"{report.model_type}, specification version {report.specification_version}")
    head.add_row("deployment target", report.deployment_target + (f" (opset {report.opset})" if report.opset else ""))
    head.add_row("functions", ", ".join(f.name + (" (default)" if f.default else "") for f in report.functions))
    for key in (
        "specproof.target",
        "specproof.max_context",
        "specproof.max_query",
        "specproof.functions",
        "specproof.last_token_only",
        "specproof.layout",
        "specproof.positions",
        "specproof.gdn",
        "specproof.ffn",
        "specproof.planted_bug",
    ):
        if key in report.metadata:
            head.add_row(key, report.metadata[key])
    console.print(head)
    for fn in report.functions:
        io = Table(title=f"function {fn.name!r}: interface")
        for col in ("kind", "name", "dtype", "shape", "shapes"):
            io.add_column(col)
        for t in (*fn.inputs, *fn.states, *fn.outputs):
            shape = t.shape_text() if not t.enumerated else "[" + ", ".join(str(d) for d in t.dims) + "]"
            extra = t.shape_kind + (f" ({len(t.enumerated)} enumerated)" if t.enumerated else "")
            if t.producer:
                extra += f", from {t.producer}"
            io.add_row(t.kind, t.name, t.dtype, shape, extra)
        console.print(io)
        rules = Table(title=f"function {fn.name!r}: verify qualification for K={report.k}")
        rules.add_column("rule")
        rules.add_column("", justify="center")
        rules.add_column("found")
        rules.add_column("why it matters")
        for r in fn.rules:
            rules.add_row(r.id, "[green]pass[/]" if r.passed else "[bold red]FAIL[/]", r.detail, r.why)
        console.print(rules)
        console.print(f"function {fn.name!r} state layout: {fn.state_layout}", markup=False)
        console.print(f"function {fn.name!r} position layout: {fn.position_layout}", markup=False)
        if fn.compute_units is not None:
            units = ", ".join(fn.compute_units.units)
            console.print(f"function {fn.name!r} compute units: {units} ({fn.compute_units.detail})", markup=False)
        for warning in fn.warnings:
            console.print(f"warning: {warning}", markup=False, style="yellow")
        verdict = "qualifies" if fn.qualifies else f"does NOT qualify ({', '.join(r.id for r in fn.failed)})"
        console.print(f"function {fn.name!r} {verdict} for a verify forward of K={report.k} draft tokens")
        if fn.tree is not None:
            how = "verifies" if fn.tree.verifies_tree else "does NOT verify"
            why = f" ({fn.tree.why})" if fn.tree.why else ""
            line = f"function {fn.name!r} {how} a token tree in one forward: {fn.tree.detail}{why}"
            console.print(line, markup=False)
    console.print(
        f"verdict: {'QUALIFIES' if report.qualifies else 'DOES NOT QUALIFY'} (exit {report.exit_code})",
        markup=False,
    )


def run_inspect(args: argparse.Namespace) -> int:
    from specproof.contract.errors import MissingDependencyError
    from specproof.coreml import BundleReadError, inspect_bundle

    try:
        report = inspect_bundle(args.path, k=args.k)
    except (BundleReadError, MissingDependencyError) as exc:
        what = "not a readable bundle" if isinstance(exc, BundleReadError) else "missing dependency"
        if args.json:  # a JSON consumer gets JSON, errors included
            error = {"format": bundle_inspect_format.ID, "path": str(args.path), "error": f"{what}: {exc}"}
            print(json.dumps({**error, "exit_code": 2}, indent=2))
        else:
            print(f"specproof bundle inspect: {what}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        _print_report(report)
    return report.exit_code


def export_target_spec(spec: str, max_context: int) -> str:
    """The spec that rebuilds the exported target: ``spec`` with ``max_context`` overridden."""
    head, sep, rest = spec.partition(":")
    kept = [p for p in rest.split(",") if p and not p.strip().startswith("max_context=")] if sep else []
    return f"{head}:{','.join([*kept, f'max_context={max_context}'])}"


def _export_target(args: argparse.Namespace) -> tuple[Any, str]:
    """The target to export and the spec (or description) that names it."""
    from specproof.contract import UsageError
    from specproof.coreml import DEFAULT_EXPORT_TARGET, check_exportable, family_target
    from specproof.engine import ReferenceHybrid
    from specproof.plugins import load_target

    if args.max_context is not None and args.max_context < 2:
        raise UsageError(f"--max-context {args.max_context}: must be >= 2")
    if args.family:
        if args.target != DEFAULT_EXPORT_TARGET:
            raise UsageError("--family and --target are exclusive: a family names its own reference target")
        target = family_target(args.family, max_context=args.max_context)
        # a spec that rebuilds the source (load_target): what `bundle check` compares the bundle with
        return target, f"family:{args.family},max_context={target.max_context}"
    if args.target.split(":", 1)[0] not in ("reference", "reference-moe"):
        raise UsageError(f"--target {args.target!r}: only reference targets can be exported")
    spec = export_target_spec(args.target, 512 if args.max_context is None else args.max_context)
    loaded = load_target(spec)
    assert isinstance(loaded, ReferenceHybrid)
    check_exportable(loaded.config)
    return loaded, spec


def run_export(args: argparse.Namespace) -> int:
    from specproof.contract import UsageError
    from specproof.coreml import export_bundle, export_multifunction, export_tree, golden_cases, write_golden

    if args.multifunction and (args.max_query is not None or args.last_token_only):
        raise UsageError("--multifunction writes fixed shapes (1 and K+1 tokens): no --max-query, no --last-token-only")
    if args.tree is not None and args.last_token_only:
        raise UsageError("--tree needs a logits row per node: not with --last-token-only")
    if args.tree is not None and args.positions != "scalar":
        raise UsageError("--tree reads one position [1] (depths come from parents): not with --positions seed")
    target, spec = _export_target(args)
    if args.tree is not None:
        from specproof.contract.errors import InvalidSettingError
        from specproof.coreml import check_tree_nodes

        try:
            check_tree_nodes(args.tree, target)  # before the export starts
        except InvalidSettingError as exc:
            raise UsageError(str(exc)) from None
    cases = golden_cases(target) if args.golden else None  # a bad prompt fails here, before the export
    out = Path(args.path)
    if out.exists():
        if not args.force:
            raise UsageError(f"{str(out)!r} exists; pass --force to replace it")
        if out.is_dir():
            shutil.rmtree(out)
        else:
            out.unlink()
    if args.tree is not None:
        result = export_tree(
            out, target, nodes=args.tree, k=args.k, multifunction=args.multifunction, max_query=args.max_query,
            target_spec=spec, layout=args.layout, gdn=args.gdn,
        )  # fmt: skip
        chain = "decode ([1, 1]) and verify" if args.multifunction else "main"
        shapes = (
            f"functions {chain} (input_ids up to [1, {result.max_query}]) and verify_tree (input_ids [1, {args.tree}], "
            f"parents [{args.tree}])"
        )
    elif args.multifunction:
        result = export_multifunction(
            out, target, k=args.k, target_spec=spec, layout=args.layout, gdn=args.gdn, positions=args.positions
        )
        shapes = f"functions decode (input_ids [1, 1]) and verify ([1, {result.max_query}]), logits [1, q, vocab]"
    else:
        result = export_bundle(
            out,
            target,
            k=args.k,
            max_query=args.max_query,
            last_token_only=args.last_token_only,
            target_spec=spec,
            layout=args.layout,
            gdn=args.gdn,
            positions=args.positions,
        )
        shapes = f"input_ids [1, 1..{result.max_query}], logits " + (
            "[1, 1, vocab] (last token only)" if result.last_token_only else "[1, q, vocab]"
        )
    print(
        f"wrote {result.path} ({result.bytes / 1024:.0f} KiB, {result.seconds:.1f} s): {target.describe()}; "
        f"layout {result.layout}, gdn {result.gdn}, positions {args.positions}; {shapes}"
    )
    if args.golden:
        doc = write_golden(args.golden, target, target_spec=spec, cases=cases)
        n = sum(len(c["tokens"]) for c in doc["cases"])
        print(f"wrote {args.golden}: {len(doc['cases'])} golden cases, {n} greedy tokens (target {spec})")
    return 0
