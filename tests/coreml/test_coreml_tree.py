"""``bundle export --tree N``: a ``verify_tree`` function verifies a token tree in one forward.

Its rows and per-node states equal the bundle's own sequential decoding of each root path bit for bit
(the tree program computes the same ops per node) and follow the family's source ``forward_tree``
within the evaluator's source tolerance; ``certify target --trees`` runs every tree check on it at
quick through ``coreml-eval:`` and passes; a bundle whose conv windows come from the flattened order
(or that verifies the tree as a chain) fails them; ``bundle inspect`` says which function verifies a
tree and why the chain functions do not.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from specproof import cli
from specproof.coreml._inspect import RuleResult, TensorInfo
from specproof.coreml._tree_inspect import tree_rules, tree_verdict

PARENTS = (-1, 0, 0, 1, 1, 2, 5, -1)  # two roots, siblings at three depths, a branch deeper than the first
TOKENS = (104, 101, 32, 120, 111, 97, 98, 66)
PROMPT = tuple(b"The quick brown")
NODES = 8


def _t(name: str, dims: tuple[object, ...], dtype: str = "FLOAT16") -> TensorInfo:
    return TensorInfo(name=name, kind="input", dtype=dtype, shape_kind="fixed", dims=dims)


_IDS = _t("input_ids", (1, NODES), "INT32")
_LOGITS = _t("logits", (1, NODES, 256), "FLOAT32")


def test_inspect_verdict_needs_parents_and_per_node_state_on_a_hybrid() -> None:
    chain = tree_verdict([_IDS, _t("position", (1,), "INT32")], [_LOGITS], ["conv_state"], _IDS)
    assert not chain.verifies_tree and "one chain per forward" in chain.detail and "B forwards" in chain.why
    mask = _t("tree_mask", (NODES, NODES))
    masked = tree_verdict([_IDS, mask], [_LOGITS], ["conv_state"], _IDS)
    assert not masked.verifies_tree and "recurrent state (conv_state) cannot" in masked.detail
    parents = _t("parents", (NODES,), "INT32")
    no_states = tree_verdict([_IDS, parents], [_LOGITS, _t("node_keys", (2, NODES, 2, 4))], ["conv_state"], _IDS)
    assert not no_states.verifies_tree and "conv_state per node" in no_states.detail
    outs = [_LOGITS, _t("node_keys", (2, NODES, 2, 4)), _t("node_conv_state", (NODES, 2, 32, 2))]
    full = tree_verdict([_IDS, parents], outs, ["conv_state"], _IDS)
    assert full.verifies_tree and full.nodes == NODES and "node_conv_state" in full.detail


def test_inspect_verdict_accepts_a_mask_alone_without_recurrent_state() -> None:
    """Correct but different: an attention-only model verifies a tree from a mask; no parents needed."""
    verdict = tree_verdict([_IDS, _t("attention_mask", (1, NODES, 64))], [_LOGITS], [], _IDS)
    assert verdict.verifies_tree and verdict.nodes is None


def test_a_tree_function_is_excused_from_writing_state_only_when_it_returns_per_node_state() -> None:
    failed = RuleResult(id="states-threaded", passed=False, detail="never written", why="stale")
    parents = _t("parents", (NODES,), "INT32")
    no = tree_verdict([_IDS, parents], [_LOGITS], ["conv_state"], _IDS)
    assert tree_rules([failed], no) == [failed]
    outs = [_LOGITS, _t("node_keys", (2, NODES, 2, 4)), _t("node_conv_state", (NODES, 2, 32, 2))]
    (rule,) = tree_rules([failed], tree_verdict([_IDS, parents], outs, ["conv_state"], _IDS))
    assert rule.passed and "commits nothing" in rule.detail


# --------------------------------------------------------------------------- exported bundles

ct = pytest.importorskip("coremltools")

from specproof.contract.errors import CapacityError, InvalidSettingError, TokenRangeError  # noqa: E402
from specproof.coreml import export_tree, family_target, inspect_bundle  # noqa: E402
from specproof.engine.targets.coreml_eval import SOURCE_RTOL  # noqa: E402
from specproof.engine.targets.coreml_eval_tree import CoreMLEvalTreeTarget, load_spec  # noqa: E402
from specproof.formats import validate  # noqa: E402

#: family -> (layout, gdn form of the chain function): a cheap export of each, two layouts
FAMILY = {"lfm2-moe": ("all-mlstate", "unrolled"), "qwen3.6-moe": ("kv-mlstate", "loop")}


@pytest.fixture(autouse=True)
def _bundle_command(monkeypatch: pytest.MonkeyPatch) -> None:
    if "specproof._cli.bundle" not in cli.COMMANDS:
        monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, "specproof._cli.bundle"))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tree")


def _bundle(root: Path, family: str, *, planted: str = "") -> Path:
    path = root / f"{family}-{planted or 'ok'}.mlpackage"
    if not path.exists():
        layout, gdn = FAMILY[family]
        export_tree(
            path, family_target(family), nodes=NODES, layout=layout, gdn=gdn, target_spec=f"family:{family}",
            _planted=planted or None,
        )  # fmt: skip
    return path


def _root_path(node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = PARENTS[node]
    return path[::-1]


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILY))
def test_each_node_is_its_root_path_decoded_and_follows_the_source(root: Path, family: str) -> None:
    target = load_spec(str(_bundle(root, family)))
    assert isinstance(target, CoreMLEvalTreeTarget) and target.max_tree_nodes == NODES
    target.forward(list(PROMPT))
    logits, checkpoints = target.forward_tree(list(TOKENS), list(PARENTS))
    assert target.processed == len(PROMPT) and target.function_calls["verify_tree"] == 1
    for node in range(NODES):
        ref = copy.deepcopy(target)
        ref.reset()
        ref.forward(list(PROMPT))
        rows = [ref.forward([TOKENS[n]])[0] for n in _root_path(node)]
        assert np.array_equal(logits[node], rows[-1]), node  # bit for bit: the same ops per node
        target.restore(checkpoints[node])
        mine, theirs = target.state_arrays(), ref.state_arrays()
        assert mine.keys() == theirs.keys() and all(np.array_equal(mine[k], theirs[k]) for k in mine), node
    source = family_target(family)
    source.forward(list(PROMPT))
    expected, _ = source.forward_tree(list(TOKENS), list(PARENTS))
    error = np.abs(expected - logits).max(axis=1) / np.abs(expected).max(axis=1)
    assert error.max() < SOURCE_RTOL / 10, error  # measured 0.6% at most: fp16 against float32


@pytest.mark.slow
def test_the_tree_target_refuses_bad_trees_before_running(root: Path) -> None:
    target = load_spec(str(_bundle(root, "lfm2-moe")))
    assert isinstance(target, CoreMLEvalTreeTarget)
    with pytest.raises(CapacityError, match="at most 8"):
        target.forward_tree([1] * (NODES + 1), [-1] * (NODES + 1))
    with pytest.raises(InvalidSettingError, match=r"parents\[1\]=1"):
        target.forward_tree([1, 2], [-1, 1])
    with pytest.raises(TokenRangeError, match=r"tokens\[1\]=256"):
        target.forward_tree([1, 256], [-1, 0])
    logits, checkpoints = target.forward_tree([], [])
    assert logits.shape == (0, 256) and checkpoints == []
    target.forward([1] * (target.max_context - 2))
    with pytest.raises(CapacityError, match="tree depth=3"):
        target.forward_tree([1, 2, 3], [-1, 0, 1])
    assert target.function_calls["verify_tree"] == 0


def _certify(path: Path, *extra: str) -> int:
    return cli.main(["certify", "target", "--target", f"coreml-eval:{path}", "--trees", "--profile", "quick", *extra])


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILY))
def test_certify_trees_passes_at_quick(
    root: Path, family: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report.json"
    code = _certify(_bundle(root, family), "--only", "tree.*", "--report", str(report))
    assert code == 0, capsys.readouterr().out[-3000:]
    results = json.loads(report.read_text(encoding="utf-8"))["results"]
    exercised = {r["id"] for r in results if r["status"] == "pass" and r["exercised"] > 0}
    for check in ("per-node-state", "committed-state", "greedy-lossless", "round-bounds", "well-formed"):
        assert {f"checkpoint-tree.{check}", f"replay-tree.{check}"} <= exercised, check


@pytest.mark.slow
@pytest.mark.parametrize(("family", "planted"), [("lfm2-moe", "tree-conv-flattened"), ("qwen3.6-moe", "tree-as-chain")])
def test_a_planted_tree_export_bug_fails_per_node_state(
    root: Path, family: str, planted: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _bundle(root, family, planted=planted)
    capsys.readouterr()
    assert _certify(path, "--only", "tree.per-node-state") == 1
    assert "logits row is not its root path's" in capsys.readouterr().out


@pytest.mark.slow
def test_inspect_says_which_function_verifies_a_tree(root: Path) -> None:
    report = inspect_bundle(_bundle(root, "qwen3.6-moe"), k=4)
    assert validate("bundle-inspect-1", report.to_json()) == []
    by_name = {f.name: f for f in report.functions}
    assert set(by_name) == {"main", "verify_tree"} and by_name["main"].default
    assert report.to_json()["tree_functions"] == ["verify_tree"]
    tree, chain = by_name["verify_tree"].tree, by_name["main"].tree
    assert tree is not None and tree.verifies_tree and tree.nodes == NODES
    assert "node_rec_state" in tree.detail and "node_conv_state" in tree.detail
    assert chain is not None and not chain.verifies_tree and "one chain per forward" in chain.detail
    assert by_name["main"].qualifies  # the chain function still verifies K drafts
    assert report.metadata["specproof.tree"] == f"verify_tree:{NODES}"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--tree", "1"], "--tree 1"),
        (["--tree", "65"], "in [2, 64]"),
        (["--tree", "8", "--max-context", "6"], "max_context=6"),
        (["--tree", "4", "--last-token-only"], "not with --last-token-only"),
        (["--tree", "8", "--positions", "seed"], "not with --positions seed"),
    ],
)
def test_bad_tree_options_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    out = tmp_path / "x.mlpackage"
    assert cli.main(["bundle", "export", str(out), "--family", "lfm2-moe", *extra]) == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_export_tree_validates_nodes(tmp_path: Path) -> None:
    target = family_target("lfm2-moe", max_context=6)
    for bad in (True, 1.5, 0):
        with pytest.raises(InvalidSettingError, match="node count"):
            export_tree(tmp_path / "x.mlpackage", target, nodes=bad, k=2)  # type: ignore[arg-type]
    with pytest.raises(InvalidSettingError, match="max_context=6"):
        export_tree(tmp_path / "x.mlpackage", target, nodes=7, k=2)
