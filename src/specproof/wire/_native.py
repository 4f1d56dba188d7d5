"""Finding and building the native C++ engine (``native/`` at the repository root)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from specproof.engine import SpecproofError

__all__ = ["NativeBuildError", "build_native", "native_binary", "native_dir"]


class NativeBuildError(SpecproofError):
    """The native engine's sources are missing or its build failed."""


def native_dir() -> Path:
    """The engine's folder: ``$SPECPROOF_NATIVE_DIR``, else ``native/`` of the source checkout this
    package runs from (an editable install), else ``./native`` (an installed wheel run from a checkout)."""
    env = os.environ.get("SPECPROOF_NATIVE_DIR")
    if env:
        return Path(env)
    beside = Path(__file__).resolve().parents[3] / "native"
    if (beside / "src" / "main.cpp").is_file():
        return beside
    here = Path.cwd() / "native"
    return here if (here / "src" / "main.cpp").is_file() else beside


def native_binary() -> Path:
    """Where the build puts the engine: ``native/build/specproof-engine``."""
    return native_dir() / "build" / "specproof-engine"


def build_native(*, quiet: bool = False) -> Path:
    """Build the engine with cmake (or g++ directly when cmake is missing); returns the binary."""
    src = native_dir()
    if not (src / "src" / "main.cpp").is_file():
        raise NativeBuildError(
            f"no native engine sources under {src} (set SPECPROOF_NATIVE_DIR to the checkout's native/ folder)"
        )
    build = src / "build"
    out = None if not quiet else subprocess.DEVNULL
    try:
        if shutil.which("cmake"):
            subprocess.run(
                ["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release"], check=True, stdout=out
            )
            subprocess.run(["cmake", "--build", str(build), "-j", "2"], check=True, stdout=out)
        else:
            cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
            if not cxx:
                raise NativeBuildError("neither cmake nor a C++ compiler (g++, c++, $CXX) is on PATH")
            build.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                [
                    cxx,
                    "-std=c++17",
                    "-O3",
                    "-ffp-contract=off",
                    "-Wall",
                    "-o",
                    str(native_binary()),
                    str(src / "src" / "main.cpp"),
                ],
                check=True,
                stdout=out,
            )
    except (OSError, subprocess.CalledProcessError) as exc:
        raise NativeBuildError(f"building the native engine in {src} failed: {exc}") from exc
    return native_binary()
