"""Where the `tests` env spends its CPU: the README's test command under a sampling profiler, summarised.

    pip install py-spy
    python benchmarks/profile_tests.py --out prof.raw            # runs `pytest tests -n auto` under py-spy
    python benchmarks/profile_tests.py --summary prof.raw        # the summary of a profile already taken
    python benchmarks/profile_tests.py --out prof.raw -- tests/engine   # any pytest arguments after --

py-spy samples every process of the run (the xdist workers and the engines and CLIs they start) at
``--rate`` Hz and writes collapsed stacks; the summary gives each function's share of all samples
(self, then inclusive), each package's and test module's, and the shares of the families issue 39
follows: the reference target's forward, its construction, in-process certify runs and imports.
A profiled run is about 13% slower than a plain one; shares, not seconds, are what it measures.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
from pathlib import Path

_LINE = re.compile(r":\d+\)$")
_PROCESS = re.compile(r'process \d+:"[^"]*"(?=;|$)')  # its command line may hold ";" (xdist's worker's does)
_FILE = re.compile(r"\(([^:)]+)")
_TEST = re.compile(r"test_\w*\S* \(([^:]*?)(test_\w+)\.py")
FAMILIES = {  # a sample counts in a family when any frame of its stack starts with one of these
    "reference forward (ReferenceHybrid._run)": ("ReferenceHybrid._run ",),
    "reference construction (ReferenceHybrid.__init__)": ("ReferenceHybrid.__init__ ",),
    "in-process certify runs": ("certify (specproof/conformance/__init__.py)",),
    "imports": ("_find_and_load ",),
}


def read_stacks(path: Path) -> list[tuple[list[str], int]]:
    """``(frames, samples)`` per line of a py-spy ``raw`` file, line numbers dropped from the frames."""
    stacks = []
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if count.isdigit() and stack:
            processes = []
            while process := _PROCESS.match(stack):  # py-spy puts the process frames first
                processes.append(process.group())
                stack = stack[process.end() + 1 :]
            frames = [_LINE.sub(")", frame) for frame in stack.split(";")] if stack else []
            stacks.append((processes + frames, int(count)))
    return stacks


def summarise(stacks: list[tuple[list[str], int]], *, top: int) -> str:
    total = sum(n for _, n in stacks)
    if not total:
        return "no samples"
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    modules: collections.Counter[str] = collections.Counter()
    families: collections.Counter[str] = collections.Counter()
    packages: collections.Counter[str] = collections.Counter()  # where the time itself is spent
    for frames, n in stacks:
        own[frames[-1]] += n
        where = _FILE.search(frames[-1])
        packages[where.group(1).split("/")[0] if where else "(native or unknown)"] += n
        for frame in set(frames):
            inclusive[frame] += n
        test = next((m.group(1) + m.group(2) for f in frames if (m := _TEST.match(f))), "(outside a test function)")
        modules[test] += n
        for family, starts in FAMILIES.items():
            if any(frame.startswith(starts) for frame in frames):
                families[family] += n

    def table(title: str, counts: collections.Counter[str], rows: int) -> list[str]:
        return [f"== {title}"] + [f"{n / total:7.1%}  {name}" for name, n in counts.most_common(rows)]

    lines = [f"{total} samples"]
    lines += table("families (a sample may be in several)", families, len(FAMILIES))
    lines += table("the package each sample's innermost frame is in", packages, 12)
    lines += table("self", own, top)
    lines += table("inclusive", inclusive, top)
    lines += table("test modules", modules, top)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="run the tests under py-spy and write its raw stacks here")
    parser.add_argument("--summary", type=Path, help="summarise a raw profile already taken")
    parser.add_argument("--rate", type=int, default=20, help="samples per second per process (default 20)")
    parser.add_argument("--top", type=int, default=30, help="rows per table (default 30)")
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments (default: tests -n auto)")
    args = parser.parse_args(argv)
    if (args.out is None) == (args.summary is None):
        parser.error("give one of --out (profile a run) or --summary (read a profile)")
    if args.rate < 1 or args.top < 1:
        parser.error("--rate and --top must be at least 1")
    raw = args.summary
    if args.out is not None:
        spy = shutil.which("py-spy")
        if spy is None:
            parser.error("py-spy is not installed here: pip install py-spy")
        pytest_args = args.pytest_args or ["tests", "-n", "auto"]
        command = [spy, "record", "-r", str(args.rate), "--subprocesses", "-f", "raw", "-o", str(args.out), "--"]
        subprocess.run([*command, sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *pytest_args], check=False)
        raw = args.out
    if not raw.is_file():
        parser.error(f"{raw}: no such profile (py-spy writes it when the run ends)")
    print(summarise(read_stacks(raw), top=args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
