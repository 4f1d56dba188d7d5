"""The docs the code points at exist in the repository, and the README's layout lists every package."""

from __future__ import annotations

import pathlib
import re

import specproof

ROOT = pathlib.Path(specproof.__file__).parent
README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_no_source_points_at_a_design_document_outside_the_repository() -> None:
    offenders = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py") if "DESIGN.md" in p.read_text()]
    assert offenders == [], f"point at docs/contract.md instead: {offenders}"


def test_readme_layout_lists_every_package() -> None:
    block = re.search(r"## Layout and dependencies\n\n```\n(.*?)```", README.read_text(), re.S)
    assert block is not None, "README has no layout block"
    listed = set(re.findall(r"^src/specproof/(\w+)/", block.group(1), re.M))
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages, "no package found"
    assert packages - listed == set(), f"packages missing from the README layout: {sorted(packages - listed)}"


CONTRACT = pathlib.Path(__file__).resolve().parents[1] / "docs" / "contract.md"


def _contract_record_example() -> dict[str, object]:
    text = CONTRACT.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    (block,) = [b for b in blocks if "def generation_record" in b]
    namespace: dict[str, object] = {}
    exec(compile(block, str(CONTRACT), "exec"), namespace)  # the documented code, as a user copies it
    return namespace


def test_contract_record_example_passes_engine_cost_one_token_prompt_included() -> None:
    """docs/contract.md's Step/Stats example, rebuilt from real decodings (checkpoint and replay, prompts of
    one and several tokens), passes engine.cost: `Stats(prefill_forwards=1)` as once shown failed it on a
    one-token prompt. And the check can fail: the old constant 1 is caught."""
    import attrs

    from specproof.conformance import get
    from specproof.conformance.checks import check_cost
    from specproof.engine import NgramDrafter, SpecDecoder
    from specproof.engine.targets import load_target

    example = _contract_record_example()
    round_record, generation_record = example["round_record"], example["generation_record"]
    inv = get("engine.cost")
    for rollback in ("checkpoint", "replay"):
        for prompt in ([5], [5, 9, 5, 9, 5]):
            gen = SpecDecoder(load_target("reference"), NgramDrafter(), k=3, rollback=rollback).generate(prompt, 24)
            steps = [
                round_record(s.base, list(s.draft), list(s.argmax), list(s.accepted), s.processed)  # type: ignore[operator]
                for s in gen.steps
            ]
            rebuilt = generation_record(  # type: ignore[operator]
                prompt,
                list(gen.tokens),
                steps,
                replay_forwards=gen.stats.replay_forwards,
                stop_reason=gen.stop_reason,
            )
            assert rebuilt.stats.drafted > 0, "the example must be exercised on rounds with drafts"
            found = check_cost(inv, rebuilt, rollback=rollback, prompt_length=len(prompt))
            assert found == [], (rollback, prompt, [v.explanation for v in found])
            if len(prompt) == 1:
                wrong = attrs.evolve(rebuilt, stats=attrs.evolve(rebuilt.stats, prefill_forwards=1))
                assert check_cost(inv, wrong, rollback=rollback, prompt_length=1)


BENCH_PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "bench.md"
BENCH_RUN = "benchmarks/bench-quick.json"


def test_bench_figures_in_the_docs_are_generated_from_the_committed_run() -> None:
    """docs/bench.md's figures block is exactly what benchmarks/update_bench_doc.py renders from the committed
    run file (a valid specproof-bench/2 result), names that run, and is consistent row by row:
    efficiency = speedup / tok/round, no verify-cost figure beside it."""
    import json

    from specproof.bench._doc import BEGIN, END, figures_block
    from specproof.contract.schemas import validate

    run = json.loads((BENCH_PAGE.parents[1] / BENCH_RUN).read_text())
    assert validate("bench-2", run) == []
    text = BENCH_PAGE.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    block = text[text.index(BEGIN) : text.index(END) + len(END)]
    assert block == figures_block(run, source=BENCH_RUN), "run `python benchmarks/update_bench_doc.py`"
    assert BENCH_RUN in block and run["platform"]["recorded_utc"] in block
    rows = [line.split("|")[1:-1] for line in block.splitlines() if line.startswith("| ") and "workload" not in line]
    assert len(rows) == len(run["cells"]) > 0
    for cells in rows:
        tpr, speedup, efficiency = float(cells[3]), float(cells[7].rstrip("x ")), float(cells[8])
        assert abs(efficiency - speedup / tpr) <= 0.011, cells
    assert "verify cost" not in block
