"""Tree drafts over specproof-engine/1 (capability ``trees``; docs/protocol.md, Trees) on the native C++
engine: it passes the five tree checks over ``exec:`` on both rollbacks (the white-box per-node check
through capability ``tree_state``), its planted ``--bug tree-as-chain`` (the flattened order verified as a
chain) is rejected at quick on ``tree.per-node-state``, ``tree.greedy-lossless`` and
``tree.committed-state``, each node's reported state is its root path's (also past the engine's k), a
round whose winner is not the first sibling commits the winner's path, bad tree requests get errors
naming the problem, and an engine without the capability is never sent a tree: the tree checks skip it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from _assertions import by_invariant
from specproof.conformance import certify
from specproof.contract.errors import InvalidSettingError
from specproof.contract.tree import TreeDraft
from specproof.engine import greedy_decode
from specproof.plugins import load_target
from specproof.wire import ExecEngine, TcpEngine

pytestmark = pytest.mark.slow  # seconds per test: outside `tox -e quick`, always in `tox`

TREE_CHECKS = ("tree.committed-state", "tree.greedy-lossless", "tree.round-bounds", "tree.well-formed")
ALL_TREE_CHECKS = ("tree.per-node-state", *TREE_CHECKS)
PY_ENGINE = Path(__file__).resolve().parents[1] / "_wire_py_engine.py"


@pytest.fixture(scope="module")
def start(native: tuple[Path, Path]) -> Callable[..., ExecEngine]:
    binary, weights = native

    def make(*args: str) -> ExecEngine:
        return ExecEngine([str(binary), "--weights", str(weights), *args], timeout=30.0, load_target=load_target)

    return make


def tree_results(native: tuple[Path, Path], *args: str) -> dict[str, dict[str, object]]:
    binary, weights = native
    engine = " ".join(["exec:" + str(binary), "--weights", str(weights), *args])
    return by_invariant(certify("engine", engine=engine, profile="quick", only=("tree.*",), trees=True))


@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
def test_the_native_engine_passes_the_tree_checks_over_exec(native: tuple[Path, Path], rollback: str) -> None:
    results = tree_results(native, "--rollback", rollback)
    for check in ALL_TREE_CHECKS:
        assert results[check]["status"] == "pass", results[check]
        assert int(results[check]["exercised"]) > 0, results[check]  # type: ignore[call-overload]


def test_the_planted_tree_as_chain_bug_is_rejected_over_exec(native: tuple[Path, Path]) -> None:
    results = tree_results(native, "--bug", "tree-as-chain")
    assert results["tree.per-node-state"]["status"] == "fail", results["tree.per-node-state"]
    assert results["tree.greedy-lossless"]["status"] == "fail", results["tree.greedy-lossless"]
    assert results["tree.committed-state"]["status"] == "fail", results["tree.committed-state"]


class FixedTrees:
    """Drafts, at every round, a decoy root, then the true next token as its second sibling with the true
    token after it as its child (and a decoy under the decoy): the winner is never the first sibling."""

    def __init__(self, truth: Sequence[int]) -> None:
        self.truth = tuple(truth)

    def propose_tree(self, context: Sequence[int], *, max_nodes: int, max_depth: int) -> TreeDraft:
        ahead = self.truth[len(context) :]
        if max_depth < 2 or max_nodes < 4 or len(ahead) < 2:
            return TreeDraft((), ())
        decoy = (ahead[0] + 1) % 256
        return TreeDraft((decoy, ahead[0], ahead[1], ahead[0]), (-1, -1, 1, 0))


@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
def test_a_second_sibling_wins_and_its_path_is_committed(start: Callable[..., ExecEngine], rollback: str) -> None:
    prompt = [72, 101, 108, 108, 111, 32]
    oracle = load_target("trained")
    want = list(greedy_decode(oracle, prompt, 9).tokens)
    with start("--rollback", rollback) as engine:
        decoder = engine.tree_decoder(FixedTrees([*prompt, *want]), max_nodes=8, max_depth=4)
        gen = decoder.generate(prompt, 9)
        assert list(gen.tokens) == want
        first = decoder.last_rounds[0]
        assert first.path == (1, 2) and first.accepted == tuple(want[:3])
        assert gen.stats is not None and gen.stats.verify_forwards == len(decoder.last_rounds)
        assert gen.stats.replay_forwards == (len(decoder.last_rounds) if rollback == "replay" else 0)
        oracle.reset()
        oracle.forward([*prompt, *want][:-1])
        state = decoder.target.state_arrays()
        assert decoder.target.processed == len(prompt) + len(want) - 1
        for name, array in oracle.state_arrays().items():
            assert np.allclose(state[name], array, rtol=0, atol=engine.atol), name


def test_each_node_state_is_its_root_paths_also_past_the_engines_k(start: Callable[..., ExecEngine]) -> None:
    """The probe verifies the nodes within k (4) in one tree request and a deeper node after its ancestors."""
    context = [72, 101, 108, 108, 111]
    tokens, parents = (32, 119, 111, 114, 108, 100, 33), (-1, 0, 1, 2, 3, 4, 0)  # a chain of 6 and a sibling
    oracle = load_target("trained")
    with start() as engine:
        probe = engine.tree_probe()
        probe.forward(context)
        logits, checkpoints = probe.forward_tree(tokens, parents)
        assert logits.shape == (7, 256)
        for node, walk in enumerate(
            ([0], [0, 1], [0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5], [0, 6])
        ):
            oracle.reset()
            oracle.forward(context)
            row = oracle.forward([tokens[n] for n in walk])[-1]
            assert np.allclose(logits[node], row, rtol=0, atol=engine.atol), node
            probe.restore(checkpoints[node])
            assert probe.processed == len(context) + len(walk)
            for name, array in oracle.state_arrays().items():
                assert np.allclose(probe.state_arrays()[name], array, rtol=0, atol=engine.atol), (node, name)


def test_bad_tree_requests_get_errors_naming_them(start: Callable[..., ExecEngine]) -> None:
    with start() as engine:
        channel = engine._channel
        for extra, problem in (
            ({"tree": {"max_nodes": 0}}, "tree needs max_nodes, an integer in 1..64"),
            ({"tree": {"max_nodes": 4}, "drafts": "engine"}, 'a tree request needs drafts "suite"'),
            (
                {"tree": {"max_nodes": 4}, "sampling": {"temperature": 0.7, "seed": 1}, "scheme": "match"},
                'a tree request takes scheme "rejection"',
            ),
        ):
            rid = channel.new_id()
            message = {"type": "generate", "id": rid, "prompt": [1, 2], "max_new_tokens": 4, "drafts": "suite"}
            channel.send({**message, **extra}, "raw tree generate")
            answer = channel.receive(("error",), "raw tree generate")
            assert problem in answer["message"], answer
        for parents, problem in (([0, -1], "parents[0]=0 must be -1"), ([-1], "one parent per token")):
            rid = channel.new_id()
            message = {"type": "generate", "id": rid, "prompt": [1, 2], "max_new_tokens": 4, "drafts": "suite"}
            channel.send({**message, "tree": {"max_nodes": 4}}, "raw tree generate")
            propose = channel.receive(("propose",), "raw tree generate")
            assert propose["max_nodes"] == 4 and propose["k"] == 3
            channel.send({"type": "draft", "id": rid, "round": 0, "tokens": [5, 6], "parents": parents}, "raw draft")
            answer = channel.receive(("error",), "raw draft")
            assert problem in answer["message"], answer
        # the engine stays usable, and the client refuses a tree past the limits before sending it
        assert engine.greedy([1, 2], 3) == list(greedy_decode(load_target("trained"), [1, 2], 3).tokens)
        with pytest.raises(InvalidSettingError, match="max_nodes"):
            engine.tree_decoder(FixedTrees(()), max_nodes=65, max_depth=2)


def test_an_engine_without_the_capability_is_sent_no_tree_and_skipped() -> None:
    spec = f"exec:{sys.executable} {PY_ENGINE} ok"
    with ExecEngine([sys.executable, str(PY_ENGINE), "ok"], load_target=load_target) as engine:
        assert "trees" not in engine.capabilities and not hasattr(engine, "tree_decoder")
    results = by_invariant(certify("engine", engine=spec, profile="quick", only=("tree.*",), trees=True))
    for check in ALL_TREE_CHECKS:
        assert results[check]["status"] == "skip", results[check]
        assert "does not declare the `trees` capability" in str(results[check]["detail"]), results[check]


def test_a_round_with_no_room_for_a_draft_verifies_the_pending_token_alone(
    start: Callable[..., ExecEngine],
) -> None:
    """max_new_tokens 1: no room for a draft, so no propose; the round's tree is empty."""
    with start() as engine:
        decoder = engine.tree_decoder(FixedTrees(()), max_nodes=4, max_depth=4)
        gen = decoder.generate([1, 2, 3], 1)
        assert len(gen.tokens) == 1 and decoder.last_rounds[0].tree == TreeDraft((), ())
        assert decoder.last_rounds[0].accepted == tuple(gen.tokens)


def test_trees_over_tcp(native: tuple[Path, Path]) -> None:
    """Over ``tcp:`` the same tree rounds run and each node's state travels (a new connection, a new session)."""
    binary, weights = native
    prompt = [72, 101, 108, 108, 111, 32]
    oracle = load_target("trained")
    want = list(greedy_decode(oracle, prompt, 6).tokens)
    proc = subprocess.Popen(
        [binary, "--weights", weights, "--listen", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().rsplit(":", 1)[1])
        for _ in range(2):
            with TcpEngine("127.0.0.1", port, timeout=30.0, load_target=load_target) as engine:
                decoder = engine.tree_decoder(FixedTrees([*prompt, *want]), max_nodes=8, max_depth=4)
                assert list(decoder.generate(prompt, 6).tokens) == want
                probe = engine.tree_probe()
                probe.forward(prompt)
                logits, _ = probe.forward_tree([want[0], 7], [-1, -1])
                assert int(np.argmax(logits[0])) == want[1]
        with TcpEngine("127.0.0.1", port, timeout=30.0, load_target=load_target) as engine:
            engine.shutdown()
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
