"""The bench's shape (docs/bench.md, "How the bench is built"): one measurement module per kind of figure,
none importing the pipeline or another measurement, and no module of the package over 500 lines."""

from __future__ import annotations

import ast
import pathlib

import attrs

from specproof.bench import BenchConfig
from specproof.bench._pipeline import MEASUREMENTS, plan_size

BENCH = pathlib.Path(__file__).resolve().parents[2] / "src" / "specproof" / "bench"
MAX_LINES = 500


def _bench_imports(path: pathlib.Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specproof.bench."):
            found.add(node.module.rsplit(".", 1)[1])
    return found


def _measurement_modules() -> set[str]:
    return {type(m).__module__.rsplit(".", 1)[1] for m in MEASUREMENTS}


def test_each_measurement_is_its_own_module_and_never_climbs_back_to_the_pipeline() -> None:
    modules = _measurement_modules()
    assert "_pipeline" not in modules and "_batches" in modules
    for name in modules:
        climbs = _bench_imports(BENCH / f"{name}.py") & (modules | {"_pipeline"})
        assert not climbs, f"{name} imports {sorted(climbs)}: a measurement reads the run, nothing above it"


def test_no_bench_module_is_over_the_size_limit() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in BENCH.glob("*.py")}
    assert "_measure.py" not in sizes
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}


def test_the_progress_plan_is_the_sum_of_the_measurements_steps() -> None:
    config = BenchConfig.quick()
    steps = [m.steps(config) for m in MEASUREMENTS]
    assert plan_size(config) == sum(steps) and all(s >= 0 for s in steps)
    assert plan_size(config) - plan_size(attrs.evolve(config, batch_sizes=())) == 3  # one step per batch size
