"""``specproof generate``: speculative decoding on a target, with a summary and an optional greedy comparison."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from specproof._cli.common import (
    add_target_argument,
    decode_tokens,
    encode_prompt,
    make_target,
    parse_ids,
)
from specproof.formats import generate as generate_format
from specproof.formats import trace as trace_format

DEFAULT_PROMPT = (
    "def area(width, height):\n    return width * height\n\n"
    "def area(width, height):\n    return width * height\n\n"
    "def area(width, height):\n"
)


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "generate",
        help="decode a prompt speculatively and summarise the rounds",
        description="Decode a prompt with SpecDecoder and print the continuation and a round summary.",
    )
    p.add_argument("prompt", nargs="?", default=None, help="prompt text (byte-level on the reference target)")
    p.add_argument("--ids", default=None, help="the prompt as token ids, comma or space separated")
    p.add_argument(
        "--prompt-file", default=None, metavar="FILE", help="read the prompt text from FILE (UTF-8, byte for byte)"
    )
    p.add_argument(
        "--workload",
        default=None,
        metavar="NAME",
        help="use a `specproof bench` workload's prompt: code-edit, retrieval-qa, structured, free-text",
    )
    add_target_argument(p)
    p.add_argument(
        "--drafter",
        default="ngram",
        help="ngram, ngram:MIN_N,MAX_N[,earliest], model:TARGET (a draft model: model:trained-small, "
        "model:reference:d_model=32), combined:TARGET (prompt lookup, else the draft model), eagle:trained / "
        "mtp:trained (feature heads reading the trained target's hidden states), or MODULE:ATTR",
    )
    p.add_argument("-k", type=int, default=4, help="draft length per round (default 4)")
    p.add_argument(
        "--rollback",
        choices=("checkpoint", "replay"),
        default=None,
        help="rollback strategy (default: checkpoint where the target has forward_with_checkpoints, else replay)",
    )
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--eos", type=int, default=None, metavar="ID", help="stop at this token id")
    p.add_argument("--seed", type=int, default=None, help="seed of the reference target's weights")
    p.add_argument("--compare-greedy", action="store_true", help="also run plain greedy: equality and both wall times")
    p.add_argument("--trace", default=None, metavar="FILE", help=f"write a {trace_format.ID} JSON Lines trace")
    p.add_argument("--json", action="store_true", help="print a JSON summary instead of text")
    p.add_argument(
        "--engine",
        default=None,
        metavar="SPEC",
        help="run this engine instead of SpecDecoder (MODULE:ATTR, exec:'CMD ARGS', tcp:HOST:PORT) and print its "
        "rounds; --target is then only used to encode the prompt and, with --compare-greedy, as the oracle when "
        "the engine exposes none",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from specproof.contract import UsageError
    from specproof.engine import SpecDecoder, greedy_decode
    from specproof.plugins import load_drafter

    sources = [
        name
        for name, value in (
            ("a prompt text", args.prompt),
            ("--ids", args.ids),
            ("--prompt-file", args.prompt_file),
            ("--workload", args.workload),
        )
        if value is not None
    ]
    if len(sources) > 1:
        raise UsageError(f"give one prompt, not {' and '.join(sources)}")
    if args.trace:
        from specproof.contract.files import check_output_path

        check_output_path(args.trace, option="--trace")  # before any decoding; nothing is created
    text = DEFAULT_PROMPT if args.prompt is None else args.prompt
    if args.prompt_file is not None:
        text = _read_prompt_file(args.prompt_file)
    elif args.workload is not None:
        text = _workload_prompt(args.workload)
    if args.engine is not None:
        return _run_engine(args, text)
    target = make_target(args.target, seed=args.seed)
    drafter = load_drafter(args.drafter)
    prompt = parse_ids(args.ids) if args.ids is not None else encode_prompt(target, text)
    if args.rollback is None:
        args.rollback = "checkpoint" if callable(getattr(target, "forward_with_checkpoints", None)) else "replay"
    decoder = SpecDecoder(target, drafter, k=args.k, rollback=args.rollback)
    t0 = time.perf_counter()
    gen = decoder.generate(prompt, args.max_new_tokens, eos_token_id=args.eos)
    spec_seconds = time.perf_counter() - t0
    if args.trace:
        from specproof.conformance.traces import write_trace

        write_trace(
            args.trace,
            gen,
            prompt=prompt,
            k=args.k,
            max_new_tokens=args.max_new_tokens,
            eos_token_id=args.eos,
            vocab_size=target.vocab_size,
            engine=decoder.name,
            # the spec that rebuilds these weights, so `check-trace --target` needs no flags
            target=args.target
            if args.seed is None
            else f"{args.target}{',' if ':' in args.target else ':'}seed={args.seed}",
            max_context=target.max_context,
            rollback=args.rollback,
        )
    assert gen.stats is not None
    stats = gen.stats
    summary: dict[str, object] = {
        "format": generate_format.ID,
        "target": args.target,
        "drafter": getattr(drafter, "name", type(drafter).__name__),
        "k": args.k,
        "rollback": args.rollback,
        "prompt_tokens": len(prompt),
        "tokens": list(gen.tokens),
        "text": decode_tokens(target, gen.tokens),
        "stop_reason": gen.stop_reason,
        "rounds": stats.rounds,
        "tokens_per_round": round(stats.mean_tokens_per_round, 3),
        "target_forwards": {
            "prefill": stats.prefill_forwards,
            "verify": stats.verify_forwards,
            "replay": stats.replay_forwards,
        },
        "greedy_forwards": stats.prefill_forwards + len(gen.tokens),
        "acceptance_by_position": [round(a, 3) for a in stats.acceptance_by_position],
        "spec_seconds": spec_seconds,
    }
    equal = True
    if args.compare_greedy:
        t0 = time.perf_counter()
        ref = greedy_decode(target, prompt, args.max_new_tokens, eos_token_id=args.eos)
        summary["greedy_seconds"] = time.perf_counter() - t0
        equal = ref.tokens == gen.tokens
        summary["equal_to_greedy"] = equal
        if not equal:
            first = next(
                (i for i, (a, b) in enumerate(zip(ref.tokens, gen.tokens)) if a != b),
                min(len(ref.tokens), len(gen.tokens)),
            )
            summary["first_divergence"] = first
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0 if equal else 1
    console = Console()
    console.print(decode_tokens(target, gen.tokens), markup=False, highlight=False, soft_wrap=True)
    table = Table(title=f"specproof generate — {decoder.name} on {args.target}", show_header=False)
    table.add_row("emitted tokens", f"{len(gen.tokens)} (stop: {gen.stop_reason})")
    table.add_row("rounds", str(stats.rounds))
    table.add_row("tokens per round", f"{stats.mean_tokens_per_round:.2f}")
    table.add_row(
        "target forwards",
        f"{stats.target_forwards} (prefill {stats.prefill_forwards}, verify {stats.verify_forwards}, "
        f"replay {stats.replay_forwards}); plain greedy needs {summary['greedy_forwards']}",
    )
    table.add_row("acceptance by position", " ".join(f"{a:.2f}" for a in stats.acceptance_by_position) or "-")
    table.add_row("wall time (speculative)", f"{spec_seconds * 1e3:.1f} ms")
    if args.compare_greedy:
        table.add_row("wall time (greedy)", f"{summary['greedy_seconds'] * 1e3:.1f} ms")  # type: ignore[operator]
        table.add_row(
            "equal to greedy", "yes" if equal else f"NO — first divergence at token {summary['first_divergence']}"
        )
    console.print(table)
    return 0 if equal else 1


def _read_prompt_file(path: str) -> str:
    from specproof.contract import UsageError

    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"--prompt-file {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"--prompt-file {path}: not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x})") from None
    if not text:
        raise UsageError(f"--prompt-file {path}: the file is empty")
    return text


def _workload_prompt(name: str) -> str:
    from specproof.bench import WORKLOAD_NAMES, build_workloads
    from specproof.contract import UsageError

    if name not in WORKLOAD_NAMES:
        raise UsageError(f"--workload {name!r}: not a bench workload; choose one of {', '.join(WORKLOAD_NAMES)}")
    return build_workloads([name])[0].text


def _run_engine(args: argparse.Namespace, text: str) -> int:
    """``generate --engine SPEC``: one generation of an engine plug-in, its rounds printed as they were recorded."""
    from rich.console import Console
    from rich.table import Table

    from specproof.engine import greedy_decode
    from specproof.plugins import resolve_plugin

    engine: Any = resolve_plugin(args.engine, kind="engine")
    if getattr(engine, "send_state", False):
        engine.send_state = False  # a wire engine's state dumps are for certify; generate reads none
    try:
        oracle = getattr(engine, "oracle", None) or getattr(engine, "target", None)
        encoder = oracle if oracle is not None else make_target(args.target, seed=args.seed)
        prompt = parse_ids(args.ids) if args.ids is not None else encode_prompt(encoder, text)
        t0 = time.perf_counter()
        gen = engine.generate(prompt, args.max_new_tokens, eos_token_id=args.eos)
        seconds = time.perf_counter() - t0
        steps = list(gen.steps or ())
        summary: dict[str, object] = {
            "format": generate_format.ID,
            "engine": args.engine,
            "prompt_tokens": len(prompt),
            "tokens": list(gen.tokens),
            "text": decode_tokens(encoder, gen.tokens),
            "stop_reason": gen.stop_reason,
            "rounds": [s.to_json() for s in steps],
            "seconds": seconds,
        }
        elapsed = getattr(engine, "last_elapsed_us", None)
        if isinstance(elapsed, (int, float)) and not isinstance(elapsed, bool):
            # a wire engine: its own time (final.elapsed_us) and the protocol's per round (docs/protocol.md)
            wall_us = float(getattr(engine, "last_wall_us", seconds * 1e6))
            summary["engine_elapsed_us"] = float(elapsed)
            summary["protocol_overhead_us_per_round"] = (
                round((wall_us - float(elapsed)) / len(steps), 1) if steps else None
            )
            wire = getattr(engine, "wire_summary", None)
            if callable(wire):
                summary["wire"] = wire()  # bytes each way and how the state travelled (digests, deltas, ...)
        equal = True
        if args.compare_greedy:
            greedy_fn = getattr(engine, "greedy", None)
            if oracle is not None:
                ref = list(greedy_decode(oracle, prompt, args.max_new_tokens, eos_token_id=args.eos).tokens)
            elif callable(greedy_fn):
                ref = [int(t) for t in greedy_fn(list(prompt), args.max_new_tokens)]
                if args.eos is not None and args.eos in ref:
                    ref = ref[: ref.index(args.eos) + 1]
            else:
                ref = list(greedy_decode(encoder, prompt, args.max_new_tokens, eos_token_id=args.eos).tokens)
            equal = ref == list(gen.tokens)
            summary["equal_to_greedy"] = equal
    finally:
        close = getattr(engine, "close", None)
        if callable(close):
            close()
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0 if equal else 1
    console = Console()
    console.print(summary["text"], markup=False, highlight=False, soft_wrap=True)
    table = Table(title=f"specproof generate --engine {args.engine}")
    for col in ("round", "base", "draft", "argmax", "accepted", "processed"):
        table.add_column(col, justify="right" if col in ("round", "base", "processed") else "left")
    for i, s in enumerate(steps):
        table.add_row(
            str(i), str(s.base), str(list(s.draft)), str(list(s.argmax)), str(list(s.accepted)), str(s.processed)
        )
    console.print(table)
    rounds = len(steps) or "-"
    per_round = f"{len(gen.tokens) / len(steps):.2f}" if steps else "-"
    console.print(
        f"{len(gen.tokens)} tokens (stop: {gen.stop_reason}) in {rounds} rounds, {per_round} tokens per round, "
        f"{seconds * 1e3:.1f} ms"
        + (
            f"; protocol overhead {summary['protocol_overhead_us_per_round']} µs per round"
            if summary.get("protocol_overhead_us_per_round") is not None
            else ""
        )
        + ("" if not args.compare_greedy else f"; equal to greedy: {'yes' if equal else 'NO'}"),
        markup=False,
    )
    return 0 if equal else 1
