"""Sampled token trees over specproof-engine/1 (capability ``sampled_trees``; docs/protocol.md, Trees) on the
native C++ engine: ``tree.sampled-distribution`` passes at quick over ``exec:`` on both rollbacks (and with
the engine's default chain scheme ``match``: trees are sampled by recursive rejection all the same), its
planted ``--bug tree-sampled-stale-residual`` (no residual update after a rejected sibling) is rejected there
at quick, a seeded sampled tree request gives one output, bad sampled tree requests get errors naming the
problem, and an engine without the capability is never sent a sampled tree: the check skips saying why.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from _assertions import by_invariant
from specproof.conformance import certify
from specproof.conformance._tree_sampled_runs import SuiteTreeSampler
from specproof.contract.errors import InvalidSettingError
from specproof.contract.sampling import SamplingParams
from specproof.plugins import load_target
from specproof.wire import ExecEngine

pytestmark = pytest.mark.slow  # seconds per test: outside `tox -e quick`, always in `tox`

CHECK = "tree.sampled-distribution"
SAMPLING = "temperature=0.8,top_p=0.95"
HIDE = Path(__file__).resolve().parents[1] / "_wire_hide_capability.py"


def sampled_tree_result(native: tuple[Path, Path], *args: str, wrap: tuple[str, ...] = ()) -> dict[str, object]:
    binary, weights = native
    engine = " ".join(["exec:" + " ".join((*wrap, str(binary))), "--weights", str(weights), *args])
    results = by_invariant(
        certify("engine", engine=engine, profile="quick", only=(CHECK,), trees=True, sampling=SAMPLING)
    )
    return results[CHECK]


@pytest.mark.parametrize(
    "args", [("--rollback", "checkpoint"), ("--rollback", "replay"), ("--scheme", "match")], ids=" ".join
)
def test_the_native_engine_passes_the_sampled_tree_check_over_exec(
    native: tuple[Path, Path], args: tuple[str, ...]
) -> None:
    result = sampled_tree_result(native, *args)
    assert result["status"] == "pass", result
    assert int(result["exercised"]) > 0, result  # type: ignore[call-overload]


def test_the_planted_stale_residual_bug_is_rejected_over_exec(native: tuple[Path, Path]) -> None:
    result = sampled_tree_result(native, "--bug", "tree-sampled-stale-residual")
    assert result["status"] == "fail", result
    assert "the token is one of its children's" in str(result["detail"]) or "PIT" in str(result["detail"]), result


def test_an_engine_without_the_capability_is_sent_no_sampled_tree_and_skipped(native: tuple[Path, Path]) -> None:
    result = sampled_tree_result(native, wrap=(sys.executable, str(HIDE), "sampled_trees"))
    assert result["status"] == "skip", result
    assert "does not declare the 'sampled_trees' capability" in str(result["detail"]), result


@pytest.fixture(scope="module")
def start(native: tuple[Path, Path]) -> Callable[..., ExecEngine]:
    binary, weights = native

    def make(*args: str) -> ExecEngine:
        return ExecEngine([str(binary), "--weights", str(weights), *args], timeout=30.0, load_target=load_target)

    return make


def test_a_seeded_sampled_tree_request_gives_one_output(start: Callable[..., ExecEngine]) -> None:
    prompt = [72, 101, 108, 108, 111, 32]
    params = SamplingParams(temperature=0.8, top_p=0.95)
    with start() as engine:
        decoder = engine.tree_decoder(SuiteTreeSampler(load_target("trained")), max_nodes=10, max_depth=3)
        runs = [list(decoder.generate(prompt, 12, sampling=params.with_seed(seed)).tokens) for seed in (5, 5, 6)]
        assert runs[0] == runs[1] and len(runs[0]) == 12
        assert runs[2] != runs[0]  # the seed reaches the engine
        with pytest.raises(InvalidSettingError, match="SamplingParams"):
            decoder.generate(prompt, 4, sampling={"temperature": 0.8})  # type: ignore[arg-type]


def test_bad_sampled_tree_requests_get_errors_naming_them(start: Callable[..., ExecEngine]) -> None:
    with start() as engine:
        channel = engine._channel
        rid = channel.new_id()
        message = {"type": "generate", "id": rid, "prompt": [1, 2], "max_new_tokens": 4, "drafts": "suite"}
        extra = {"tree": {"max_nodes": 4}, "sampling": {"temperature": 0.7, "seed": 1}, "scheme": "match"}
        channel.send({**message, **extra}, "raw sampled tree generate")
        answer = channel.receive(("error",), "raw sampled tree generate")
        assert 'a tree request takes scheme "rejection"' in answer["message"], answer
        rid = channel.new_id()
        extra = {"tree": {"max_nodes": 4}, "sampling": {"temperature": -1}}
        channel.send({**message, "id": rid, **extra}, "raw sampled tree generate")
        answer = channel.receive(("error",), "raw sampled tree generate")
        assert "sampling.temperature" in answer["message"], answer
