"""``python -m specproof.wire``: export-weights, build-native, native-spec."""

from __future__ import annotations

import argparse
import shlex
import sys

from specproof.engine import SpecproofError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specproof.wire", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    exp = sub.add_parser("export-weights", help="write a reference target's weights as safetensors")
    exp.add_argument("out", help="the .safetensors file to write")
    exp.add_argument("--target", default="trained", help="the target spec (default: trained)")
    sub.add_parser(
        "build-native",
        help="build the engine under ~/.cache/specproof/native/ (cmake, or g++ directly); print its path",
    )
    spec = sub.add_parser(
        "native-spec", help="build the engine and export the weights if needed; print the exec: engine spec"
    )
    spec.add_argument("--weights", default=None, help="weights file (default: trained.safetensors beside the binary)")
    spec.add_argument("engine_args", nargs=argparse.REMAINDER, help="extra engine arguments, e.g. --bug stale-conv")
    args = parser.parse_args(argv)
    from specproof import wire
    from specproof.plugins import load_target

    try:
        if args.command == "export-weights":
            print(wire.export_weights(args.out, target=args.target, load_target=load_target))
        elif args.command == "build-native":
            print(wire.build_native())
        else:
            binary = wire.native_binary()
            if not binary.is_file():
                wire.build_native(quiet=True)
            weights = args.weights or str(binary.parent / "trained.safetensors")
            import os

            if not os.path.isfile(weights):
                wire.export_weights(weights, load_target=load_target)
            extra = [a for a in args.engine_args if a != "--"]
            print("exec:" + shlex.join([str(binary), "--weights", weights, *extra]))
    except SpecproofError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
