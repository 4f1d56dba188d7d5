"""Fixtures shared by the wire tests: the native engine, built and exported once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from specproof.plugins import load_target
from specproof.wire.native import NativeBuildError, NativeToolchainError, build_native, export_weights, native_binary


@pytest.fixture(scope="session")
def native(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(engine binary, weights file): built and exported once per session. Without a C++ toolchain
    the tests skip saying so; a failed build with a toolchain present fails them."""
    binary = native_binary()  # named by the sources' hash: a changed source is a new binary
    if not binary.is_file():
        try:
            build_native(quiet=True)
        except NativeToolchainError as exc:
            pytest.skip(f"no C++ toolchain to build the native engine: {exc}")
        except NativeBuildError as exc:
            pytest.fail(f"the native engine does not build: {exc}")
    weights = tmp_path_factory.mktemp("native") / "trained.safetensors"
    export_weights(weights, target="trained", load_target=load_target)
    return binary, weights
