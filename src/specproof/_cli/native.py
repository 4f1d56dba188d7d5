"""``specproof native build|spec|export-weights``: the C++ reference engine in ``native/`` and its weights.

``build`` prints the binary's path; ``spec`` builds it and exports the ``trained`` weights when
needed, then prints the ``exec:`` engine spec ``certify engine --engine`` takes; ``export-weights``
writes a reference-family target's weights as safetensors (for engines in any language).
"""

from __future__ import annotations

import argparse
import os
import shlex


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "native",
        help="build the C++ reference engine, print its exec: spec, or export weights for it",
        description=(
            "The C++ reference engine (native/, built under ~/.cache/specproof/native/ or "
            "$SPECPROOF_NATIVE_BUILD_DIR) and the safetensors weights engines in other languages load."
        ),
    )
    nsub = p.add_subparsers(dest="native_command", metavar="ACTION", required=True)
    build = nsub.add_parser(
        "build",
        help="build the engine (cmake, or g++ directly) and print its path",
        description="Build the engine out of the source tree and print the binary's path.",
    )
    build.set_defaults(func=run_build)
    spec = nsub.add_parser(
        "spec",
        help="build the engine and export the weights if needed; print the exec: engine spec",
        description=(
            "Print the exec: spec of the native engine, building it and exporting the trained weights "
            'first when they are missing: specproof certify engine --engine "$(specproof native spec)".'
        ),
    )
    spec.add_argument(
        "--weights", default=None, metavar="FILE", help="weights file (default: trained.safetensors beside the binary)"
    )
    spec.add_argument(
        "engine_args", nargs=argparse.REMAINDER, help="extra engine arguments after --, e.g. -- --bug stale-conv"
    )
    spec.set_defaults(func=run_spec)
    export = nsub.add_parser(
        "export-weights",
        help="write a reference target's weights as safetensors",
        description="Write a reference-family target's weights as safetensors (format specproof-weights/1).",
    )
    export.add_argument("out", help="the .safetensors file to write")
    export.add_argument("--target", default="trained", metavar="SPEC", help="the target spec (default: trained)")
    export.set_defaults(func=run_export)


def run_build(args: argparse.Namespace) -> int:
    from specproof.wire.native import build_native

    print(build_native())
    return 0


def run_spec(args: argparse.Namespace) -> int:
    from specproof.plugins import load_target
    from specproof.wire.native import build_native, export_weights, native_binary

    binary = native_binary()
    if not binary.is_file():
        build_native(quiet=True)
    weights = args.weights or str(binary.parent / "trained.safetensors")
    if not os.path.isfile(weights):
        export_weights(weights, load_target=load_target)
    extra = [a for a in args.engine_args if a != "--"]
    print("exec:" + shlex.join([str(binary), "--weights", weights, *extra]))
    return 0


def run_export(args: argparse.Namespace) -> int:
    from specproof.plugins import load_target
    from specproof.wire.native import export_weights

    print(export_weights(args.out, target=args.target, load_target=load_target))
    return 0
