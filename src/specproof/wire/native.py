"""The native C++ reference engine (``native/`` at the repository root) and the weights it loads.

- ``build_native()``: build it out of the source tree (cmake, else the C++ compiler directly);
  ``native_binary()``, ``native_build_dir()``, ``native_dir()``: where it is; ``NativeBuildError``
  and ``NativeToolchainError`` when it cannot be built;
- ``export_weights(path, target=, load_target=)``: a reference-family target's weights as
  safetensors (format ``WEIGHTS_FORMAT``), which engines in any language can load.

The command line is ``specproof native build|spec|export-weights`` (native/README.md).
"""

from specproof.wire._export import WEIGHTS_FORMAT, export_weights
from specproof.wire._native import (
    NativeBuildError,
    NativeToolchainError,
    build_native,
    native_binary,
    native_build_dir,
    native_dir,
)

__all__ = [
    "WEIGHTS_FORMAT",
    "NativeBuildError",
    "NativeToolchainError",
    "build_native",
    "export_weights",
    "native_binary",
    "native_build_dir",
    "native_dir",
]
