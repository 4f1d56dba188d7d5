"""``CoreMLEvalTreeTarget``: a ``coreml-eval:`` target whose bundle has a tree-verify function, so it verifies
a token tree in one forward (``forward_tree``; docs/contract.md, "Trees"; docs/coreml.md, "Trees").

The tree function (the one with a ``parents`` input; ``bundle export --tree N`` names it ``verify_tree``)
takes ``input_ids`` ``[1, N]``, ``parents`` ``[N]`` and ``position`` ``[1]`` beside the states, which it
reads and never writes, and returns ``logits`` ``[1, N, vocab]`` and per node what a host commits: the
node's KV rows (``node_keys``/``node_values`` ``[n_attn, N, n_kv, head_dim]``) and its states after it
(``node_conv_state`` ``[N, *conv_state]``, ``node_rec_state`` ``[N, *rec_state]``). This target is that
host: it pads a smaller tree with roots (children of the context nobody descends from), and builds each
node's checkpoint from the state before the tree, the node's root path's KV rows written at their
positions and the node's own states.

Like ``coreml_eval``, this module is the evaluator side: it imports nothing of the exporter.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from specproof.contract.errors import CapacityError, InvalidSettingError, TargetContractError, TokenRangeError
from specproof.engine.targets.coreml_eval import (
    KV_STATES,
    PARENTS,
    UNIFIED_KV,
    CoreMLEvalSnapshot,
    CoreMLEvalTarget,
)
from specproof.engine.targets.coreml_eval import load_spec as load_chain_spec
from specproof.engine.targets.mil_eval import MilEvaluator, load_program

__all__ = [
    "NODE_KEYS",
    "NODE_STATE",
    "NODE_VALUES",
    "PARENTS",
    "TREE_FUNCTION",
    "CoreMLEvalTreeTarget",
    "load_spec",
    "open_target",
    "tree_function_names",
]

TREE_FUNCTION: Final = "verify_tree"
NODE_KEYS: Final = "node_keys"
NODE_VALUES: Final = "node_values"
NODE_STATE: Final = "node_{}"  # node_conv_state, node_rec_state: a state's value after each node


def tree_function_names(program: Any) -> list[str]:
    """The functions of a loaded program that take ``parents`` (tree functions)."""
    return [name for name, fn in program.functions.items() if PARENTS in fn.inputs]


def _check_parents(parents: Sequence[int], n: int) -> tuple[int, ...]:
    if isinstance(parents, (str, bytes)):
        raise InvalidSettingError(f"CoreMLEvalTreeTarget.forward_tree: parents must be a sequence of ints: {parents!r}")
    out = list(parents)
    if len(out) != n:
        raise InvalidSettingError(f"CoreMLEvalTreeTarget.forward_tree: {n} tokens but {len(out)} parents")
    for i, p in enumerate(out):
        if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or not -1 <= p < i:
            raise InvalidSettingError(
                f"CoreMLEvalTreeTarget.forward_tree: parents[{i}]={p!r} must be -1 (the context) or a node in [0, {i})"
            )
    return tuple(int(p) for p in out)


def _paths(parents: tuple[int, ...]) -> list[list[int]]:
    """Each node's root path (root first)."""
    paths: list[list[int]] = []
    for i, p in enumerate(parents):
        paths.append([*(paths[p] if p >= 0 else []), i])
    return paths


class CoreMLEvalTreeTarget(CoreMLEvalTarget):
    """A ``CoreMLEvalTarget`` that also verifies token trees of up to ``max_tree_nodes`` nodes in one call."""

    def __init__(self, path: str | Path, **options: Any) -> None:
        super().__init__(path, **options)
        program = load_program(self.path)
        names = tree_function_names(program)
        if len(names) != 1:
            raise InvalidSettingError(
                f"coreml-eval {str(self.path)!r}: {len(names)} tree functions {names}; one is read"
            )
        self._tree = MilEvaluator(self.path, function=names[0], program=program)
        spec = self._tree.input_specs
        shape = spec.get("input_ids", ((),))[0]
        if len(shape) != 2 or not isinstance(shape[1], (int, np.integer)) or tuple(spec[PARENTS][0]) != (shape[1],):
            raise InvalidSettingError(
                f"coreml-eval {str(self.path)!r}: tree function {names[0]!r} needs input_ids [1, N] and parents [N] "
                f"(got {list(shape)} and {list(spec[PARENTS][0])})"
            )
        #: the most nodes one ``forward_tree`` call verifies (the tree function's fixed N)
        self.max_tree_nodes = int(shape[1])
        wanted = [NODE_KEYS, NODE_VALUES, *(NODE_STATE.format(n) for n in ("conv_state", "rec_state") if self._has(n))]
        missing = [n for n in wanted if n not in self._tree.output_names]
        if missing or "logits" not in self._tree.output_names:
            raise InvalidSettingError(
                f"coreml-eval {str(self.path)!r}: tree function {names[0]!r} lacks outputs {['logits', *missing]}"
            )

    def _has(self, state: str) -> bool:
        return state in self._ev.states or state in self._io_values

    def forward_tree(
        self, tokens: Sequence[int], parents: Sequence[int]
    ) -> tuple[npt.NDArray[np.float32], list[object]]:
        """Every node's logits row and checkpoint (restorable) from one call of the tree function; the target's
        own state is left as it was. More nodes than ``max_tree_nodes`` or a path past ``max_context`` is a
        ``CapacityError``, a bad tree an ``InvalidSettingError``, each before anything runs."""
        n = len(list(tokens))
        tree = _check_parents(parents, n)
        paths = _paths(tree)
        depth = max((len(p) for p in paths), default=0)
        if n > self.max_tree_nodes:
            raise CapacityError(
                f"CoreMLEvalTreeTarget.forward_tree: {n} nodes; the bundle's tree function takes at most "
                f"{self.max_tree_nodes} (bundle export --tree N)"
            )
        base = self.processed
        checked = [*self._check_tokens(list(tokens)), *([0] * (self.max_tree_nodes - n))]
        fed = [*tree, *([-1] * (self.max_tree_nodes - n))]
        if base + depth > self.max_context:
            raise CapacityError(
                f"CoreMLEvalTreeTarget.forward_tree: processed={base} + tree depth={depth} exceeds "
                f"max_context={self.max_context}; nothing was changed"
            )
        if n == 0:
            return np.zeros((0, self.vocab_size), np.float32), []
        out = self._call_tree(checked, fed, base)
        logits = np.asarray(out["logits"], np.float32)
        if logits.shape != (1, self.max_tree_nodes, self.vocab_size):
            raise TargetContractError(f"coreml-eval: tree logits shape {logits.shape}")
        before = self.snapshot()
        return np.ascontiguousarray(logits[0, :n]), [self._checkpoint(before, out, p) for p in paths]

    def _check_tokens(self, tokens: Sequence[int]) -> list[int]:
        """The tokens as ints, or ``TokenRangeError`` naming the first that is not an id of the vocabulary (a
        tree's capacity is its depth, checked apart)."""
        if isinstance(tokens, str):
            raise TokenRangeError("CoreMLEvalTreeTarget.forward_tree: tokens must be a sequence of ints, got str")
        out = []
        for i, t in enumerate(tokens):
            if (type(t) is not int and not isinstance(t, np.integer)) or not 0 <= t < self.vocab_size:
                raise TokenRangeError(
                    f"CoreMLEvalTreeTarget.forward_tree: tokens[{i}]={t!r} is not a token id in [0, {self.vocab_size})"
                )
            out.append(int(t))
        return out

    def _call_tree(self, tokens: list[int], parents: list[int], base: int) -> dict[str, np.ndarray]:
        ev = self._tree
        ev.states = dict(self._ev.states)  # read, never written back here: a copy of the mapping
        self.function_calls[ev.function] += 1
        return ev(
            input_ids=np.array([tokens], np.int32),
            parents=np.array(parents, np.int32),
            position=np.array([base], np.int32),
            **self._io_values,
        )

    def _checkpoint(self, before: CoreMLEvalSnapshot, out: dict[str, np.ndarray], path: list[int]) -> object:
        """The state after ``path``: the state before the tree, the path's KV rows at their positions, the
        last node's states."""
        states = dict(before.states)
        base = before.processed
        rows = slice(base, base + len(path))
        keys = np.asarray(out[NODE_KEYS], np.float16)[:, path]  # [n_attn, depth, n_kv, hd]
        values = np.asarray(out[NODE_VALUES], np.float16)[:, path]
        if UNIFIED_KV in states:
            kv = states[UNIFIED_KV].copy()
            kv[0, :, :, rows], kv[1, :, :, rows] = keys.transpose(0, 2, 1, 3), values.transpose(0, 2, 1, 3)
            states[UNIFIED_KV] = kv
        else:
            for name, new in zip(KV_STATES, (keys, values), strict=True):
                cache = states[name].copy()
                cache[:, :, rows] = new.transpose(0, 2, 1, 3)
                states[name] = cache
        for name in ("conv_state", "rec_state"):
            if name in states:
                states[name] = np.asarray(out[NODE_STATE.format(name)], np.float16)[path[-1]].copy()
        return CoreMLEvalSnapshot(processed=base + len(path), states=states, target_id=self._id)

    def describe(self) -> str:
        return f"{super().describe()} tree={self._tree.function}:{self.max_tree_nodes}"


def open_target(path: str | Path, **options: Any) -> CoreMLEvalTarget:
    """The evaluator target of the bundle at ``path``: a ``CoreMLEvalTreeTarget`` when it has a tree function."""
    p = Path(path)
    if p.exists() and tree_function_names(load_program(p)):
        return CoreMLEvalTreeTarget(p, **options)
    return CoreMLEvalTarget(p, **options)


def load_spec(args: str) -> CoreMLEvalTarget:
    """The ``coreml-eval:`` target spec (``coreml_eval.load_spec``'s options), a tree target for a tree bundle."""
    return load_chain_spec(args, open_target=open_target)
