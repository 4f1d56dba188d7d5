"""The bench's tree figures (``_trees``): trees beside chains, off unless asked for, lossless, in the schema."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from specproof.bench import BenchConfig
from specproof.bench._counting import default_decoder
from specproof.bench._protocol import BenchRun
from specproof.bench._trees import TreeFigures, tree_accepted
from specproof.bench._workloads import build_workloads
from specproof.bench.cli_support import tree_lines
from specproof.contract.errors import InvalidSettingError
from specproof.contract.tree import TreeDraft, chain_tree
from specproof.engine import NgramDrafter
from specproof.formats import load_schema


def _config(**over: Any) -> BenchConfig:
    fields: dict[str, Any] = dict(
        mode="quick",
        target="trained",
        companions=(),
        workloads=("code-edit",),
        prompt_chars=200,
        drafters=(),
        real_files=1,
        real_tokens=192,
        real_stride=32,
        real_min_prefix=64,
        peers=False,
        batch_sizes=(),
        trees=True,
        tree_shapes=("2x2x2", "dynamic:6"),
        tree_drafters=("model:trained-small",),
        tree_tokens=8,
    )
    fields.update(over)
    return BenchConfig(**fields)


def _run(config: BenchConfig) -> BenchRun:
    return BenchRun(
        config=config,
        workloads=tuple(build_workloads(config.workloads, prompt_chars=config.prompt_chars)),
        drafters=(),
        drafters_skipped=(),
        drafter_factory=NgramDrafter,
        decoder_factory=default_decoder,
        tick=lambda _m: None,
    )


def test_tree_accepted_is_the_deepest_matching_root_path() -> None:
    tree = TreeDraft((5, 7, 8, 9, 1), (-1, -1, 1, 2, 0))  # 7 -> 8 -> 9 matches beside a first root 5
    assert tree_accepted(tree, [7, 8, 9, 4]) == 3
    assert tree_accepted(tree, [5, 1, 2]) == 2
    assert tree_accepted(tree, [6, 8, 9]) == 0  # every branch rejected at the root
    assert tree_accepted(TreeDraft((7, 8), (-1, -1)), [8]) == 1  # a sibling that is not first
    assert tree_accepted(chain_tree([3, 4]), [3, 4]) == 2  # as deep as the continuation, no deeper


def test_trees_are_off_by_default_and_bad_settings_say_why() -> None:
    assert TreeFigures().measure(_run(_config(trees=False))) == {}
    assert TreeFigures().steps(_config(trees=False)) == 0
    assert not BenchConfig.quick().trees and not BenchConfig.full().trees
    with pytest.raises(InvalidSettingError, match="tree shape"):
        _config(tree_shapes=("2x",))
    with pytest.raises(InvalidSettingError, match="tree_drafters"):
        _config(tree_drafters=("ngram",))
    with pytest.raises(InvalidSettingError, match="tree_tokens"):
        _config(tree_tokens=0)


def test_a_target_without_forward_tree_is_a_skip_that_says_why() -> None:
    run = _run(_config())
    chain_only = object()
    run._pairs["trained"] = (chain_only, chain_only)  # type: ignore[assignment]
    trees = TreeFigures().measure(run)["trees"]
    assert trees["status"] == "skip" and "forward_tree" in trees["reason"]
    assert tree_lines({"trees": trees}) == [f"trees: not measured ({trees['reason']})"]


@pytest.mark.slow
def test_the_tree_figures_sit_beside_the_chain_lossless_and_in_the_schema() -> None:
    trees = json.loads(json.dumps(TreeFigures().measure(_run(_config()))))["trees"]
    assert trees["status"] == "ok" and trees["sampled"]["status"] == "ok"
    real = {c["shape"]: c for c in trees["real_contexts"]["cells"]}
    assert set(real) == {"chain", "2x2x2", "dynamic:6"}
    assert real["chain"]["limit"] <= 5 and real["2x2x2"]["limit"] <= 4
    for cell in real.values():
        assert 1 <= cell["tokens_per_round"] <= cell["limit"]
        assert cell["positions"] == 4
    assert real["chain"]["nodes_per_round"] <= 4 and real["dynamic:6"]["nodes_per_round"] <= 6
    decoding = {c["shape"]: c for c in trees["decoding"]["cells"]}
    assert set(decoding) == {"chain", "1x1x1x1", "2x2x2", "dynamic:6"}
    assert all(c["lossless"] and c["tokens_per_round"] >= 1 and c["cpu_speedup"] > 0 for c in decoding.values())
    # the chain declared as a tree accepts what the chain does
    assert decoding["1x1x1x1"]["tokens_per_round"] == decoding["chain"]["tokens_per_round"]
    jsonschema.validate(trees, load_schema("bench-2")["properties"]["trees"])
    lines = tree_lines({"trees": trees})
    assert any("2x2x2" in line for line in lines) and any("sampled at T = 0.7" in line for line in lines)
    sampled = trees["sampled"]
    sampled_real = {c["shape"]: c for c in sampled["real_contexts"]["cells"]}
    assert set(sampled_real) == {"chain", "2x2x2", "dynamic:6"} and sampled["temperature"] == 0.7
    for cell in sampled_real.values():
        assert 1 <= cell["tokens_per_round"] <= cell["limit"] and cell["positions"] == 4
        assert all(0 <= a <= 1 for a in cell["acceptance_by_depth"])
    sampled_decoding = {c["shape"]: c for c in sampled["decoding"]["cells"]}
    assert set(sampled_decoding) == {"chain", "2x2x2", "dynamic:6"}
    assert all(c["tokens_per_round"] >= 1 and c["cpu_speedup"] > 0 for c in sampled_decoding.values())


def test_trees_do_not_go_with_a_drafter_run(capsys: pytest.CaptureFixture[str]) -> None:
    from specproof.cli import main

    assert main(["bench", "--drafter", "ngram", "--trees"]) == 2
    assert "--trees does not go with --drafter" in capsys.readouterr().err
