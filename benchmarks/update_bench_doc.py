"""Regenerate the bench figures in docs/bench.md from a recorded run.

    specproof bench --quick --json benchmarks/bench-quick.json
    python benchmarks/update_bench_doc.py            # rewrites the block between the markers

tests/project/test_docs.py fails when the page and the committed run disagree.
"""

from __future__ import annotations

import json
import pathlib
import sys

from specproof.bench._doc import figures_block, replace_block

ROOT = pathlib.Path(__file__).resolve().parents[1]
RUN = "benchmarks/bench-quick.json"
PAGE = ROOT / "docs" / "bench.md"


def main(argv: list[str]) -> int:
    run = argv[0] if argv else RUN
    result = json.loads((ROOT / run).read_text())
    PAGE.write_text(replace_block(PAGE.read_text(), figures_block(result, source=run)))
    print(f"docs/bench.md: bench figures regenerated from {run}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
