"""Finding and building the native C++ engine (sources in ``native/`` at the repository root).

The build never writes into the source tree: it goes to
``$SPECPROOF_NATIVE_BUILD_DIR``, else ``~/.cache/specproof/native/<hash of the sources and
their folder>/``, so a changed source is a new folder (never a stale binary), a read-only checkout
builds, and two checkouts of the same sources never share a CMake cache (CMake refuses a build
folder configured from another source folder).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from specproof.engine import SpecproofError

__all__ = [
    "NativeBuildError",
    "NativeToolchainError",
    "build_native",
    "native_binary",
    "native_build_dir",
    "native_dir",
]

_TAIL = 3000  # characters of the compiler's output kept in an error


class NativeBuildError(SpecproofError):
    """The native engine's sources are missing or its build failed (the compiler's output is in the message)."""


class NativeToolchainError(NativeBuildError):
    """No C++ toolchain: neither cmake nor a compiler (``g++``, ``c++``, ``$CXX``) is on PATH."""


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


def _sources(src: Path) -> list[Path]:
    return sorted([*(p for p in (src / "src").glob("*") if p.is_file()), src / "CMakeLists.txt"])


def native_build_dir() -> Path:
    """Where the build goes: ``$SPECPROOF_NATIVE_BUILD_DIR``, else a cache folder named by the sources' hash."""
    env = os.environ.get("SPECPROOF_NATIVE_BUILD_DIR")
    if env:
        return Path(env)
    src = native_dir()
    digest = hashlib.sha256(str(src.resolve()).encode() + b"\0")
    for path in _sources(src):
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "specproof" / "native" / digest.hexdigest()[:16]


def native_binary() -> Path:
    """The engine binary of the current sources (it exists once ``build_native()`` has run)."""
    return native_build_dir() / "specproof-engine"


def _run(argv: list[str], *, quiet: bool, what: str) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise NativeBuildError(f"{what}: cannot run {argv[0]}: {exc}") from exc
    if not quiet and done.stdout:
        print(done.stdout, end="")
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip()
        raise NativeBuildError(
            f"{what} failed (exit status {done.returncode}): {' '.join(argv[:3])} ...\n{output[-_TAIL:]}"
        )


def build_native(*, quiet: bool = False) -> Path:
    """Build the engine with cmake (or the C++ compiler directly when cmake is missing); returns the binary.

    ``NativeToolchainError`` when there is no toolchain; ``NativeBuildError`` (with the compiler's
    output) when the build fails. The binary appears only once complete (built aside, then renamed).
    """
    src = native_dir()
    if not (src / "src" / "main.cpp").is_file():
        raise NativeBuildError(
            f"no native engine sources under {src} (set SPECPROOF_NATIVE_DIR to the checkout's native/ folder)"
        )
    cmake = shutil.which("cmake")
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cmake and not cxx:
        raise NativeToolchainError("neither cmake nor a C++ compiler (g++, c++, $CXX) is on PATH")
    out = native_build_dir()
    out.mkdir(parents=True, exist_ok=True)
    binary = out / "specproof-engine"
    what = f"building the native engine from {src} in {out}"
    if cmake:
        build = out / "cmake"
        _run([cmake, "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release"], quiet=quiet, what=what)
        _run([cmake, "--build", str(build), "-j", "2"], quiet=quiet, what=what)
        made = build / "specproof-engine"
    else:
        assert cxx is not None
        fd, tmp = tempfile.mkstemp(dir=out, prefix=".specproof-engine.")
        os.close(fd)
        made = Path(tmp)
        try:
            _run(
                [
                    cxx,
                    "-std=c++17",
                    "-O3",
                    "-ffp-contract=off",
                    "-Wall",
                    "-pthread",
                    "-o",
                    tmp,
                    str(src / "src" / "main.cpp"),
                ],
                quiet=quiet,
                what=what,
            )
        except BaseException:
            made.unlink(missing_ok=True)
            raise
    if not made.is_file():
        raise NativeBuildError(f"{what}: the build reported success but made no {made}")
    fd, tmp = tempfile.mkstemp(dir=out, prefix=".specproof-engine.")
    os.close(fd)
    shutil.copy2(made, tmp)
    os.replace(tmp, binary)
    return binary
