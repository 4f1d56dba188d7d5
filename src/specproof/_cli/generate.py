"""``specproof generate``: speculative decoding on a target, with a summary and an optional greedy comparison.

``--sampling temperature=0.8,top_p=0.95[,top_k=K,min_p=M,seed=S]`` samples (docs/contract.md, "Sampling")
with ``--scheme rejection`` (default) or ``match``; without ``seed=`` one is drawn and reported, so the
run can be reproduced. Bad sampling text is a usage error (exit 2) before anything is loaded.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from specproof._cli.common import (
    DEFAULT_TARGET,
    add_target_argument,
    decode_tokens,
    encode_prompt,
    make_target,
    parse_ids,
)
from specproof.contract.validation import integer_argument
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
    # no --target: the default, or the target a feature drafter reads (eagle:trained, mtp:trained -> trained)
    p.set_defaults(target=None)
    p.add_argument(
        "--drafter",
        default="ngram",
        help="ngram, ngram:MIN_N,MAX_N[,earliest], model:TARGET (a draft model: model:trained-small, "
        "model:reference:d_model=32), combined:TARGET (prompt lookup, else the draft model), eagle:trained / "
        "mtp:trained (feature heads reading the trained target's hidden states; --target then defaults to trained), "
        "or MODULE:ATTR",
    )
    p.add_argument("-k", type=integer_argument, default=4, help="draft length per round (default 4)")
    p.add_argument(
        "--rollback",
        choices=("checkpoint", "replay"),
        default=None,
        help="rollback strategy (default: checkpoint where the target has forward_with_checkpoints, else replay)",
    )
    p.add_argument(
        "--sampling",
        default=None,
        metavar="PARAMS",
        help="sample instead of greedy decoding: temperature=T[,top_k=K,top_p=P,min_p=M,seed=S] (e.g. "
        "temperature=0.8,top_p=0.95; temperature=0 is greedy); without seed= one is drawn and reported",
    )
    p.add_argument(
        "--scheme",
        choices=("rejection", "match"),
        default=None,
        help="with --sampling: the lossless acceptance rule, rejection sampling against the drafter's q (default) "
        "or sample-and-match",
    )
    p.add_argument("--max-new-tokens", type=integer_argument, default=64)
    p.add_argument("--eos", type=integer_argument, default=None, metavar="ID", help="stop at this token id")
    p.add_argument("--seed", type=integer_argument, default=None, help="seed of the reference target's weights")
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
    from specproof.engine import SpecDecoder
    from specproof.plugins import load_drafter

    sampling = _sampling(args)  # usage errors first: nothing is loaded yet
    text = _prompt_text(args)
    if args.engine is not None:
        args.target = args.target or DEFAULT_TARGET
        return _run_engine(args, text, sampling)
    drafter = load_drafter(args.drafter)
    args.target = _target_spec(args, drafter)
    target = make_target(args.target, seed=args.seed)
    prompt = parse_ids(args.ids) if args.ids is not None else encode_prompt(target, text)
    if args.rollback is None:
        args.rollback = "checkpoint" if callable(getattr(target, "forward_with_checkpoints", None)) else "replay"
    decoder = SpecDecoder(target, drafter, k=args.k, rollback=args.rollback, scheme=args.scheme)
    t0 = time.perf_counter()
    gen = decoder.generate(prompt, args.max_new_tokens, eos_token_id=args.eos, sampling=sampling)
    spec_seconds = time.perf_counter() - t0
    if args.trace:
        _write_trace(args, gen, prompt, target, decoder.name)
    summary = _summary(args, gen, prompt, target, drafter, spec_seconds, sampling)
    equal = _compare_greedy(args, summary, target, prompt, gen.tokens) if args.compare_greedy else True
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_summary(args, summary, gen, target, decoder.name)
    return 0 if equal else 1


def _sampling(args: argparse.Namespace) -> Any:
    """``--sampling`` parsed (``SamplingParams``; a drawn seed when it names none), or None for greedy;
    ``args.scheme`` set. The options that do not fit a sampled generation are usage errors here."""
    from specproof.contract import UsageError
    from specproof.contract.sampling import parse_sampling

    args.scheme_given = args.scheme is not None
    if args.sampling is None:
        if args.scheme is not None:
            raise UsageError(
                f"--scheme {args.scheme} is the acceptance rule of a sampled generation: give --sampling too"
            )
        args.scheme = "rejection"
        return None
    sampling = parse_sampling(args.sampling)
    args.scheme = args.scheme or "rejection"
    if sampling.greedy:
        return sampling  # temperature=0 or top_k=1: greedy exactly, so a greedy trace and comparison hold
    if args.compare_greedy:
        raise UsageError(
            f"--compare-greedy compares with greedy decoding, which --sampling {args.sampling} (temperature > 0) "
            "does not promise to equal: drop one (temperature=0 is greedy)"
        )
    if args.trace:
        raise UsageError(
            f"--trace records a greedy generation for check-trace, which judges it against the greedy rule; "
            f"drop --trace or --sampling {args.sampling}"
        )
    if sampling.seed is None:  # the run can be reproduced: the seed is in the summary
        import secrets

        sampling = sampling.with_seed(secrets.randbits(62))
    return sampling


def _prompt_text(args: argparse.Namespace) -> str:
    """The prompt text from the one source given (usage errors, and the --trace path, before any decoding)."""
    from specproof.contract import UsageError

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
    if args.prompt_file is not None:
        return _read_prompt_file(args.prompt_file)
    if args.workload is not None:
        return _workload_prompt(args.workload)
    return DEFAULT_PROMPT if args.prompt is None else str(args.prompt)


def _target_spec(args: argparse.Namespace, drafter: object) -> str:
    """The target to decode on: --target; without it, the target a feature drafter reads its features from
    (``feature_target_spec``, as certify does), else the default. A feature drafter on another model is
    a usage error naming the fix (its heads cannot read that model's hidden states)."""
    from specproof.contract import UsageError

    feature = getattr(drafter, "feature_target_spec", None)
    feature = feature if isinstance(feature, str) and feature else None
    if args.target is None:
        return feature or DEFAULT_TARGET
    if feature is not None and args.target.partition(":")[0] != feature.partition(":")[0]:
        raise UsageError(
            f"--drafter {args.drafter!r} reads the hidden states of target {feature!r}, not --target "
            f"{args.target!r}: drop --target (it defaults to {feature!r}) or pass --target {feature}"
        )
    return str(args.target)


def _write_trace(args: argparse.Namespace, gen: Any, prompt: list[int], target: Any, engine: str) -> None:
    from specproof.conformance.traces import write_trace

    write_trace(
        args.trace,
        gen,
        prompt=prompt,
        k=args.k,
        max_new_tokens=args.max_new_tokens,
        eos_token_id=args.eos,
        vocab_size=target.vocab_size,
        engine=engine,
        # the spec that rebuilds these weights, so `check-trace --target` needs no flags
        target=args.target
        if args.seed is None
        else f"{args.target}{',' if ':' in args.target else ':'}seed={args.seed}",
        max_context=target.max_context,
        rollback=args.rollback,
    )


def _summary(
    args: argparse.Namespace,
    gen: Any,
    prompt: list[int],
    target: Any,
    drafter: object,
    seconds: float,
    sampling: Any,
) -> dict[str, object]:
    stats = gen.stats
    assert stats is not None
    return {
        "format": generate_format.ID,
        "target": args.target,
        "drafter": getattr(drafter, "name", type(drafter).__name__),
        "k": args.k,
        "rollback": args.rollback,
        **_sampling_fields(args, sampling, drafter),
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
        "spec_seconds": seconds,
    }


def _sampling_fields(args: argparse.Namespace, sampling: Any, drafter: object) -> dict[str, object]:
    """The summary's ``sampling`` (the parameters, seed included; null: greedy) and, sampled, ``scheme``
    and ``drafter_q``: ``declared`` (the drafter samples and returns its q rows: ``propose_sampled``) or
    ``one-hot`` (a deterministic drafter)."""
    if sampling is None:
        return {"sampling": None}
    declared = callable(getattr(drafter, "propose_sampled", None))
    return {"sampling": sampling.to_json(), "scheme": args.scheme, "drafter_q": "declared" if declared else "one-hot"}


def _sampling_label(summary: dict[str, Any]) -> str:
    """``greedy``, or the parameters as ``--sampling`` takes them (seed included), the scheme and the q."""
    from specproof.contract.sampling import SamplingParams

    if summary.get("sampling") is None:
        return "greedy"
    params = SamplingParams.from_json(summary["sampling"])
    text = params.describe() + (" (greedy exactly)" if params.greedy else "")
    if "scheme" in summary:
        text += f"; scheme {summary['scheme']}"
    if "drafter_q" in summary:
        text += "; drafter q " + (
            "declared (it samples)" if summary["drafter_q"] == "declared" else "one-hot (deterministic drafter)"
        )
    return text


def _compare_greedy(
    args: argparse.Namespace, summary: dict[str, object], target: Any, prompt: list[int], tokens: Any
) -> bool:
    """Plain greedy on the same target: equality, the first divergence and its wall time go in ``summary``."""
    from specproof.engine import greedy_decode

    t0 = time.perf_counter()
    ref = greedy_decode(target, prompt, args.max_new_tokens, eos_token_id=args.eos)
    summary["greedy_seconds"] = time.perf_counter() - t0
    equal = ref.tokens == tokens
    summary["equal_to_greedy"] = equal
    if not equal:
        summary["first_divergence"] = next(
            (i for i, (a, b) in enumerate(zip(ref.tokens, tokens)) if a != b), min(len(ref.tokens), len(tokens))
        )
    return bool(equal)


def _print_summary(args: argparse.Namespace, summary: dict[str, Any], gen: Any, target: Any, engine: str) -> None:
    from rich.console import Console
    from rich.table import Table

    stats = gen.stats
    console = Console()
    console.print(decode_tokens(target, gen.tokens), markup=False, highlight=False, soft_wrap=True)
    table = Table(title=f"specproof generate — {engine} on {args.target}", show_header=False)
    name = str(summary["drafter"])
    table.add_row("drafter", (name if args.drafter in name else f"{name} (--drafter {args.drafter})") + f", k={args.k}")
    table.add_row("sampling", _sampling_label(summary))
    table.add_row("emitted tokens", f"{len(gen.tokens)} (stop: {gen.stop_reason})")
    table.add_row("rounds", str(stats.rounds))
    table.add_row("tokens per round", f"{stats.mean_tokens_per_round:.2f}")
    table.add_row(
        "target forwards",
        f"{stats.target_forwards} (prefill {stats.prefill_forwards}, verify {stats.verify_forwards}, "
        f"replay {stats.replay_forwards}); plain greedy needs {summary['greedy_forwards']}",
    )
    table.add_row("acceptance by position", " ".join(f"{a:.2f}" for a in stats.acceptance_by_position) or "-")
    table.add_row("wall time (speculative)", f"{summary['spec_seconds'] * 1e3:.1f} ms")
    if args.compare_greedy:
        table.add_row("wall time (greedy)", f"{summary['greedy_seconds'] * 1e3:.1f} ms")
        equal = summary["equal_to_greedy"]
        table.add_row(
            "equal to greedy", "yes" if equal else f"NO — first divergence at token {summary['first_divergence']}"
        )
    console.print(table)


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


def _run_engine(args: argparse.Namespace, text: str, sampling: Any) -> int:
    """``generate --engine SPEC``: one generation of an engine plug-in, its rounds printed as they were recorded.
    With ``--sampling`` the engine must declare the ``sampling`` capability; ``--scheme`` is its own business."""
    from specproof.contract import UsageError
    from specproof.engine.plugin_modules import declared_capabilities
    from specproof.plugins import resolve_plugin

    if sampling is not None and args.scheme_given:
        raise UsageError("--scheme chooses SpecDecoder's rule; an --engine samples by its own: drop --scheme")
    engine: Any = resolve_plugin(args.engine, kind="engine")
    if getattr(engine, "send_state", False):
        engine.send_state = False  # a wire engine's state dumps are for certify; generate reads none
    extra: dict[str, Any] = {}
    if sampling is not None:
        if "sampling" not in (declared_capabilities(engine) or frozenset()):
            close = getattr(engine, "close", None)
            if callable(close):
                close()
            raise UsageError(f"--engine {args.engine} does not declare the 'sampling' capability: drop --sampling")
        extra["sampling"] = sampling
    try:
        oracle = getattr(engine, "oracle", None) or getattr(engine, "target", None)
        encoder = oracle if oracle is not None else make_target(args.target, seed=args.seed)
        prompt = parse_ids(args.ids) if args.ids is not None else encode_prompt(encoder, text)
        t0 = time.perf_counter()
        gen = engine.generate(prompt, args.max_new_tokens, eos_token_id=args.eos, **extra)
        seconds = time.perf_counter() - t0
        steps = list(gen.steps or ())
        summary: dict[str, object] = {
            "format": generate_format.ID,
            "engine": args.engine,
            "sampling": None if sampling is None else sampling.to_json(),
            "prompt_tokens": len(prompt),
            "tokens": list(gen.tokens),
            "text": decode_tokens(encoder, gen.tokens),
            "stop_reason": gen.stop_reason,
            "rounds": [s.to_json() for s in steps],
            "seconds": seconds,
        }
        _wire_figures(engine, summary, seconds, len(steps))
        equal = True
        if args.compare_greedy:
            ref = _engine_greedy(args, engine, oracle, encoder, prompt)
            equal = ref == list(gen.tokens)
            summary["equal_to_greedy"] = equal
    finally:
        close = getattr(engine, "close", None)
        if callable(close):
            close()
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_engine_rounds(args, summary, gen, steps, seconds, equal)
    return 0 if equal else 1


def _wire_figures(engine: Any, summary: dict[str, object], seconds: float, rounds: int) -> None:
    """A wire engine: its own time (final.elapsed_us) and the protocol's per round (docs/protocol.md)."""
    elapsed = getattr(engine, "last_elapsed_us", None)
    if not isinstance(elapsed, (int, float)) or isinstance(elapsed, bool):
        return
    wall_us = float(getattr(engine, "last_wall_us", seconds * 1e6))
    summary["engine_elapsed_us"] = float(elapsed)
    summary["protocol_overhead_us_per_round"] = round((wall_us - float(elapsed)) / rounds, 1) if rounds else None
    wire = getattr(engine, "wire_summary", None)
    if callable(wire):
        summary["wire"] = wire()  # bytes each way and how the state travelled (digests, deltas, ...)


def _engine_greedy(args: argparse.Namespace, engine: Any, oracle: Any, encoder: Any, prompt: list[int]) -> list[int]:
    """Plain greedy for ``--compare-greedy``: the engine's model, else its ``greedy()``, else --target."""
    from specproof.engine import greedy_decode

    greedy_fn = getattr(engine, "greedy", None)
    if oracle is not None:
        return list(greedy_decode(oracle, prompt, args.max_new_tokens, eos_token_id=args.eos).tokens)
    if callable(greedy_fn):
        ref = [int(t) for t in greedy_fn(list(prompt), args.max_new_tokens)]
        if args.eos is not None and args.eos in ref:
            ref = ref[: ref.index(args.eos) + 1]
        return ref
    return list(greedy_decode(encoder, prompt, args.max_new_tokens, eos_token_id=args.eos).tokens)


def _print_engine_rounds(
    args: argparse.Namespace, summary: dict[str, Any], gen: Any, steps: list[Any], seconds: float, equal: bool
) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(summary["text"], markup=False, highlight=False, soft_wrap=True)
    if summary.get("sampling") is not None:
        console.print(f"sampling: {_sampling_label(summary)}", markup=False)
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
