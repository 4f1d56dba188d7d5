"""The client side of tree drafts (capability ``trees``; docs/protocol.md, Trees) against a small Python engine
(``tests/_wire_fake_tree_engine.py``, a model that repeats the last token): the tree decoder's rounds and
output, the faults it names when an engine breaks the tree fields, a drafter's bad tree refused before it is
sent (the engine stays usable), bad settings refused up front, and the schemas of the tree fields.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import jsonschema
import pytest

from specproof.contract.errors import DrafterContractError, InvalidSettingError, SpecproofError
from specproof.contract.tree import TreeDraft
from specproof.wire import EngineProtocolError, ExecEngine, load_schema
from specproof.wire._trees import WireTreeDecoder

FAKE = Path(__file__).resolve().parents[1] / "_wire_fake_tree_engine.py"


def fake(mode: str) -> ExecEngine:
    return ExecEngine([sys.executable, str(FAKE), mode], timeout=10.0)


class Trees:
    """Every round: a decoy root (the pending token + 1), then the pending token with a child repeating it."""

    def __init__(self, tree: TreeDraft | None = None) -> None:
        self.tree = tree

    def propose_tree(self, context: Sequence[int], *, max_nodes: int, max_depth: int) -> TreeDraft:
        if self.tree is not None:
            return self.tree
        last = context[-1]
        if max_depth < 2:
            return TreeDraft(((last + 1) % 256, last), (-1, -1))
        return TreeDraft(((last + 1) % 256, last, last), (-1, -1, 1))


def test_the_tree_decoder_reports_each_round_and_the_output() -> None:
    with fake("ok") as engine:
        decoder = engine.tree_decoder(Trees(), max_nodes=4, max_depth=3)
        gen = decoder.generate([5, 9], 7)
        assert list(gen.tokens) == [9] * 7
        first = decoder.last_rounds[0]
        assert first.tree == TreeDraft((10, 9, 9), (-1, -1, 1))
        assert first.path == (1, 2) and first.accepted == (9, 9, 9) and first.emitted == (9, 9, 9)
        assert sum(len(r.emitted) for r in decoder.last_rounds) == 7
        assert decoder.last_rounds[-1].tree == TreeDraft((), ())  # the last round had no room for a draft
        assert gen.steps[0].draft == (9, 9) and gen.steps[0].accepted == (9, 9, 9)


@pytest.mark.parametrize(
    ("mode", "problem"),
    [
        ("other-tree", "but the suite sent [10, 9, 9]"),
        ("no-path", "a round record without parents and path in a tree request"),
        ("no-max-nodes", "a propose without max_nodes in a tree request"),
        ("short-argmax", "3 argmax rows for a tree of 3 nodes"),
        ("final-tokens", "are not the rounds' emitted tokens"),
    ],
)
def test_an_engine_breaking_the_tree_fields_is_a_protocol_fault_naming_it(mode: str, problem: str) -> None:
    with fake(mode) as engine:
        decoder = engine.tree_decoder(Trees(), max_nodes=4, max_depth=3)
        with pytest.raises(EngineProtocolError, match=r"docs/protocol\.md, Trees") as info:
            decoder.generate([5, 9], 7)
        assert problem in str(info.value)


def test_a_tree_past_the_round_limits_is_refused_before_it_is_sent() -> None:
    with fake("ok") as engine:
        too_wide = engine.tree_decoder(Trees(TreeDraft((1, 2, 3), (-1, -1, -1))), max_nodes=2, max_depth=3)
        with pytest.raises(DrafterContractError, match="3 nodes and depth 1; the round allows 2 nodes"):
            too_wide.generate([5, 9], 4)
        too_deep = engine.tree_decoder(Trees(TreeDraft((9, 9, 9), (-1, 0, 1))), max_nodes=8, max_depth=2)
        with pytest.raises(DrafterContractError, match="depth 3; the round allows 8 nodes and depth 2"):
            too_deep.generate([5, 9], 6)
        # the request was abandoned with a reset: the engine answers the next one
        assert list(engine.tree_decoder(Trees(), max_nodes=4, max_depth=3).generate([5, 9], 3).tokens) == [9] * 3


def test_bad_settings_are_refused_before_anything_is_sent() -> None:
    with fake("ok") as engine:
        for nodes in (0, 65, True):
            with pytest.raises(InvalidSettingError, match="max_nodes"):
                engine.tree_decoder(Trees(), max_nodes=nodes, max_depth=2)
        with pytest.raises(InvalidSettingError, match="max_depth"):
            engine.tree_decoder(Trees(), max_nodes=4, max_depth=-1)
        with pytest.raises(InvalidSettingError, match="no propose_tree"):
            engine.tree_decoder(object(), max_nodes=4, max_depth=2)
        with pytest.raises(InvalidSettingError, match="target must be None"):
            engine.tree_decoder(Trees(), max_nodes=4, max_depth=2, target=object())
        decoder = engine.tree_decoder(Trees(), max_nodes=4, max_depth=2)
        for prompt, n, eos, problem in (
            ([], 2, None, "empty"),
            ([256], 2, None, "256"),
            ([1], -1, None, "max_new_tokens"),
            ([1], 2, 300, "eos"),
        ):
            with pytest.raises(SpecproofError, match=problem):
                decoder.generate(prompt, n, eos_token_id=eos)
        assert list(decoder.generate([4], 2).tokens) == [4, 4]  # nothing was sent: the engine is fine
        # no tree_state: no per-node state to ask for, and no probe for tree.per-node-state
        assert not hasattr(engine, "tree_probe")
        with pytest.raises(InvalidSettingError, match="'tree_state' capability"):
            WireTreeDecoder(engine, Trees(), max_nodes=4, max_depth=2, node_state=True)


def test_the_tree_fields_schemas() -> None:
    jsonschema.validate(
        {"type": "draft", "id": 1, "round": 0, "tokens": [3, 4], "parents": [-1, 0]}, load_schema("draft")
    )
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"type": "draft", "id": 1, "tokens": [3], "parents": [-2]}, load_schema("draft"))
    propose = {"type": "propose", "id": 1, "round": 0, "context_length": 2, "k": 2, "max_nodes": 8}
    jsonschema.validate(propose, load_schema("propose"))
    generate = {"type": "generate", "id": 1, "prompt": [1], "max_new_tokens": 2, "tree": {"max_nodes": 64}}
    jsonschema.validate(generate, load_schema("generate"))
    for bad in ({"max_nodes": 65}, {}, {"max_nodes": 4, "width": 2}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**generate, "tree": bad}, load_schema("generate"))
    record = {
        "type": "round",
        "id": 1,
        "round": 0,
        "base": 0,
        "draft": [3],
        "parents": [-1],
        "argmax": [3, 3],
        "accepted": [3, 3],
        "path": [0],
        "processed": 2,
    }
    jsonschema.validate(record, load_schema("round"))
    node = {"type": "state", "id": 1, "processed": 3, "arrays": {}, "node": 0, "logits": "AAAAAA=="}
    jsonschema.validate(node, load_schema("state"))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**node, "node": 64}, load_schema("state"))
