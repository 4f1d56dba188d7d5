"""The reference target verifies trees: each node's row and state are its root path's, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specproof.contract.errors import CapacityError, InvalidSettingError, StaleSnapshotError
from specproof.engine.targets.reference import ReferenceConfig, ReferenceHybrid
from specproof.strategies import tree_parents

CONFIG = ReferenceConfig(d_model=32, ffn_dim=64, vocab_size=64, max_context=96)
MODEL = ReferenceHybrid(CONFIG)


def _path(parents: tuple[int, ...], node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


@given(
    context=st.lists(st.integers(0, 63), min_size=0, max_size=70),
    parents=tree_parents(max_nodes=7),
    data=st.data(),
)
def test_each_node_is_its_root_path_decoded_sequentially(
    context: list[int], parents: tuple[int, ...], data: st.DataObject
) -> None:
    tokens = data.draw(st.lists(st.integers(0, 63), min_size=len(parents), max_size=len(parents)))
    target = MODEL.__deepcopy__({})
    target.reset()
    target.forward(context)
    before = target.snapshot()
    logits, checkpoints = target.forward_tree(tokens, parents)
    assert target.snapshot() == before and target.processed == len(context)
    for node in range(len(tokens)):
        seq = MODEL.__deepcopy__({})
        seq.reset()
        seq.forward(context)
        rows = seq.forward([tokens[n] for n in _path(parents, node)])  # one chunk: the target is chunk-invariant
        assert np.array_equal(rows[-1], logits[node]), node
        target.restore(checkpoints[node])
        got, want = target.state_arrays(), seq.state_arrays()
        for name in want:
            assert np.array_equal(got[name], want[name]), (node, name)
        target.restore(before)


def test_bad_parents_are_refused_before_any_work() -> None:
    target = ReferenceHybrid(CONFIG)
    target.forward([1, 2])
    with pytest.raises(InvalidSettingError, match=r"parents\[1\]=1"):
        target.forward_tree([3, 4], [-1, 1])
    with pytest.raises(InvalidSettingError, match="2 tokens but 1 parents"):
        target.forward_tree([3, 4], [-1])
    assert target.processed == 2


def test_a_tree_deeper_than_the_room_left_is_refused() -> None:
    target = ReferenceHybrid(CONFIG)
    target.forward([i % 64 for i in range(94)])
    with pytest.raises(CapacityError, match="tree depth=3"):
        target.forward_tree([1, 2, 3], [-1, 0, 1])
    target.forward_tree([1, 2, 3], [-1, -1, 0])  # depth 2 fits


def test_a_tree_checkpoint_is_stale_once_the_context_below_it_changes() -> None:
    target = ReferenceHybrid(CONFIG)
    target.forward([1, 2, 3])
    _, checkpoints = target.forward_tree([4, 5], [-1, -1])
    target.restore(checkpoints[1])
    target.restore(target.snapshot())
    target.reset()
    target.forward([9, 9, 9])
    with pytest.raises(StaleSnapshotError):
        target.restore(checkpoints[0])
