"""Tree drafts over the wire (capability ``trees``; docs/protocol.md, Trees): a ``generate`` with ``tree``
asks for every round's draft as a token tree, the engine verifies it in one forward and reports the
accepted root path.

``WireTreeDecoder`` gives a wire engine the interface the tree checks drive (``TreeSpecDecoder``'s:
``generate``, ``last_rounds``, ``target``): ``WireEngine.tree_decoder(drafter, max_nodes=, max_depth=)``
makes one where the handshake declares ``trees``. Its ``target`` is a ``WireTreeTarget``: the engine's
state as its ``state`` messages report it, and ``forward_tree``, which hands a round's tree to the engine
(the engine verifies it; nothing is computed here), so a probe of the committed state that wraps
``forward_tree`` sees the state each round starts from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from specproof.contract import Generation, Step, StopReason
from specproof.contract.errors import DrafterContractError, InvalidSettingError
from specproof.contract.sampling import SamplingParams
from specproof.contract.tree import MAX_TREE_NODES, TreeDraft
from specproof.contract.validation import int_at_least
from specproof.engine import TreeRound
from specproof.engine.conventions import check_eos_token, check_prompt, check_sampling_params, component_name
from specproof.wire._channel import Channel, request_text
from specproof.wire._errors import EngineProtocolError, EngineRequestError
from specproof.wire._limits import check_array_shape
from specproof.wire._requests import _stats
from specproof.wire._state_view import WireTargetView, decode_float32

__all__ = [
    "SAMPLED_TREES",
    "TREES",
    "TREE_STATE",
    "WireSampledTreeDecoder",
    "WireTreeDecoder",
    "WireTreeProbe",
    "WireTreeTarget",
]

#: the capability: the engine takes ``generate.tree`` and verifies tree drafts
TREES = "trees"
#: the capability: with ``generate.tree.node_state`` the engine sends each draft node's state and logits row
TREE_STATE = "tree_state"
#: the capability: a tree ``generate`` may carry ``sampling`` (recursive rejection sampling over siblings)
SAMPLED_TREES = "sampled_trees"


@attrs.frozen
class NodeState:
    """One draft node's state as the engine reported it (``state.node``): the context and the node's root
    path processed, whole arrays, and the node's logits row."""

    processed: int
    arrays: dict[str, npt.NDArray[np.float32]]
    logits: npt.NDArray[np.float32]


class WireTreeTarget:
    """The engine as the tree decoder's target: ``processed`` and ``state_arrays()`` from the last
    ``state`` message (capability ``state``; else nothing to read: ``state_arrays()`` is empty), and
    ``forward_tree(tokens, parents)``, which sends the round's tree as its ``draft``."""

    def __init__(self, channel: Channel, view: WireTargetView | None, vocab_size: int, max_context: int) -> None:
        self._channel, self._view = channel, view
        self.vocab_size, self.max_context = vocab_size, max_context
        #: the propose waiting for its draft: (request id, round, request text); None between rounds
        self.pending: tuple[int, int, str] | None = None
        self.processed = 0

    def state_arrays(self) -> dict[str, npt.NDArray[np.float32]]:
        return self._view.state_arrays() if self._view is not None else {}

    def forward_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> None:
        """Send the tree as the waiting propose's draft (a round with no propose takes the empty tree)."""
        if self.pending is None:
            if tokens:
                raise InvalidSettingError("a tree for a round the engine did not ask a draft for")
            return
        rid, round_, request = self.pending
        self.pending = None
        message = {"type": "draft", "id": rid, "round": round_, "tokens": list(tokens), "parents": list(parents)}
        self._channel.send(message, request)


class WireTreeDecoder:
    """Greedy tree speculative decoding by a wire engine with capability ``trees``: the suite's ``drafter``
    (``propose_tree(context, *, max_nodes, max_depth)``) drafts every round's tree, within ``max_nodes`` and
    ``max_depth`` and the round's ``k``; the engine verifies it and commits the winning path."""

    def __init__(
        self, engine: Any, drafter: object, *, max_nodes: int, max_depth: int, node_state: bool = False
    ) -> None:
        if TREES not in engine.capabilities:
            raise InvalidSettingError(f"engine {engine.label} does not declare the '{TREES}' capability")
        if node_state and TREE_STATE not in engine.capabilities:
            raise InvalidSettingError(f"engine {engine.label} does not declare the '{TREE_STATE}' capability")
        if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or not 1 <= max_nodes <= MAX_TREE_NODES:
            raise InvalidSettingError(f"WireTreeDecoder max_nodes={max_nodes!r} must be an int in 1..{MAX_TREE_NODES}")
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 0:
            raise InvalidSettingError(f"WireTreeDecoder max_depth={max_depth!r} must be an int >= 0")
        if not callable(getattr(drafter, "propose_tree", None)):
            raise InvalidSettingError(f"drafter {component_name(drafter)} has no propose_tree(context, ...) method")
        self.engine, self.drafter = engine, drafter
        self.max_nodes, self.max_depth = max_nodes, max_depth
        self.node_state = bool(node_state)
        #: with ``node_state``: each round's draft nodes' states (round -> node -> state)
        self.last_node_states: list[dict[int, NodeState]] = []
        view = getattr(engine, "target", None) if engine.send_state else None
        self._view: WireTargetView | None = view
        self.target: Any = WireTreeTarget(engine._channel, view, engine.vocab_size, engine.max_context)
        self._wire_target = self.target
        self.name = f"{engine.name} (trees: max_nodes={max_nodes}, max_depth={max_depth})"
        self.last_rounds: tuple[TreeRound, ...] = ()

    def __repr__(self) -> str:
        return self.name

    @property
    def no_sampling_reason(self) -> str | None:
        """Why this decoder's engine is never sent a sampled tree (None: it may be)."""
        if SAMPLED_TREES in self.engine.capabilities:
            return None
        return (
            f"engine {self.engine.label} does not declare the '{SAMPLED_TREES}' capability: it verifies trees "
            "greedily only, so no sampled tree is sent to it (docs/protocol.md, Trees)"
        )

    def generate(self, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None) -> Generation:
        return self._generate(prompt, max_new_tokens, eos_token_id, None)

    def _generate(
        self, prompt: Sequence[int], max_new_tokens: int, eos_token_id: int | None, sampling: SamplingParams | None
    ) -> Generation:
        channel: Channel = self.engine._channel
        engine = self.engine
        # bad input is refused here, before anything is sent (the engine would answer an error)
        tokens = check_prompt(prompt, vocab_size=engine.vocab_size, max_context=engine.max_context)
        max_new_tokens = int_at_least(max_new_tokens, name="max_new_tokens", minimum=0)
        check_eos_token(eos_token_id, vocab_size=engine.vocab_size)
        rid = channel.new_id()
        request = request_text("generate", rid, tokens, max_new_tokens) + " with tree drafts"
        if sampling is not None:
            request += f", sampling {sampling.describe()}"
        channel.send(
            {
                "type": "generate",
                "id": rid,
                "prompt": tokens,
                "max_new_tokens": int(max_new_tokens),
                "eos_token_id": None if eos_token_id is None else int(eos_token_id),
                "drafts": "suite",
                "state": self._view is not None,
                "tree": {"max_nodes": self.max_nodes, **({"node_state": True} if self.node_state else {})},
                **({"sampling": sampling.to_json()} if sampling is not None else {}),
            },
            request,
        )
        if self._view is not None:
            self._view.begin_request()
        reset = getattr(self.drafter, "reset", None)
        if callable(reset):
            reset()
        rounds = _TreeRounds(self, channel, rid, request, tokens, int(max_new_tokens), eos_token_id)
        generation = rounds.run()
        self.last_rounds = tuple(rounds.rounds)
        self.last_node_states = rounds.node_states
        return generation


class WireSampledTreeDecoder(WireTreeDecoder):
    """A ``WireTreeDecoder`` whose ``generate`` also takes ``sampling=`` (capability ``sampled_trees``): the
    engine verifies each round's tree by recursive rejection sampling over siblings (docs/contract.md,
    "Sampled trees"); a seeded request gives one output."""

    def __init__(
        self, engine: Any, drafter: object, *, max_nodes: int, max_depth: int, node_state: bool = False
    ) -> None:
        super().__init__(engine, drafter, max_nodes=max_nodes, max_depth=max_depth, node_state=node_state)
        reason = self.no_sampling_reason
        if reason is not None:
            raise InvalidSettingError(reason)

    def generate(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        *,
        eos_token_id: int | None = None,
        sampling: SamplingParams | None = None,
    ) -> Generation:
        check_sampling_params(sampling)
        return self._generate(prompt, max_new_tokens, eos_token_id, sampling)


class _TreeRounds:
    """The messages answering one tree ``generate``, read until its ``final``."""

    def __init__(
        self,
        decoder: WireTreeDecoder,
        channel: Channel,
        rid: int,
        request: str,
        prompt: list[int],
        max_new_tokens: int,
        eos: int | None,
    ) -> None:
        self.decoder, self.channel, self.rid, self.request = decoder, channel, rid, request
        self.ctx, self.max_new_tokens, self.eos = list(prompt), max_new_tokens, eos
        self.rounds: list[TreeRound] = []
        self.steps: list[Step] = []
        self.out: list[int] = []
        self.states = 0
        self.sent: TreeDraft | None = None  # the tree sent for the round in progress
        self.node_states: list[dict[int, NodeState]] = []

    def run(self) -> Generation:
        # every round emits a token: at most a state, a propose and a round per round, a state at the end
        budget = 3 * (max(0, self.max_new_tokens) + 1) + 2
        if self.decoder.node_state:  # and a state message per draft node of every round
            budget += (max(0, self.max_new_tokens) + 1) * self.decoder.max_nodes
        while True:
            budget -= 1
            if budget < 0:
                self._fault(
                    f"more messages than {self.max_new_tokens} new tokens allow (3 per round and a final state)"
                )
            msg = self.channel.receive(("round", "state", "propose", "final", "error"), self.request)
            self.channel.check_id(msg, self.rid, self.request)
            kind = msg["type"]
            if kind == "state":
                self._state(msg)
            elif kind == "propose":
                self._propose(msg)
            elif kind == "round":
                self._round(msg)
            elif kind == "error":
                raise EngineRequestError(
                    f"engine {self.channel.label}, {self.request}: the engine answered with an error: {msg['message']}"
                )
            else:
                return self._final(msg)

    def _fault(self, problem: str) -> None:
        self.channel.fault(f"{problem} (docs/protocol.md, Trees)", self.request)

    def _state(self, msg: dict[str, Any]) -> None:
        if "node" in msg:
            self._node_state(msg)
            return
        view = self.decoder._view
        if view is None:
            self._fault("a state message, but the request asked for none")
        assert view is not None
        self.states += 1
        try:
            view.update(msg)
        except EngineProtocolError as exc:
            self.channel.fault(str(exc), self.request)
        self.decoder._wire_target.processed = view.processed

    def _node_state(self, msg: dict[str, Any]) -> None:
        tree, node = self.sent, int(msg["node"])
        if not self.decoder.node_state or tree is None:
            self._fault("a state message for a tree node, but the round asked for none")
        assert tree is not None
        while len(self.node_states) <= len(self.rounds):
            self.node_states.append({})
        held = self.node_states[len(self.rounds)]
        if node >= len(tree) or node in held or "logits" not in msg:
            self._fault(f"state.node={node}: not a new node of the round's tree of {len(tree)}, or no logits")
        view = WireTargetView(self.decoder.engine.vocab_size, self.decoder.engine.max_context, self.decoder.name)
        view.begin_request()
        vocab = self.decoder.engine.vocab_size
        try:
            view.update(msg)
            check_array_shape("logits", [vocab], msg["logits"])
            _, logits = decode_float32(msg["logits"], [vocab], "state.logits")
        except EngineProtocolError as exc:
            self.channel.fault(str(exc), self.request)
        held[node] = NodeState(processed=msg["processed"], arrays=view.state_arrays(), logits=logits)

    def _propose(self, msg: dict[str, Any]) -> None:
        if "max_nodes" not in msg:
            self._fault("a propose without max_nodes in a tree request")
        if msg["context_length"] != len(self.ctx):
            self._fault(f"propose.context_length={msg['context_length']}, but the context holds {len(self.ctx)} tokens")
        decoder = self.decoder
        max_nodes = min(decoder.max_nodes, int(msg["max_nodes"]))
        max_depth = min(decoder.max_depth, int(msg["k"]))
        target = decoder._wire_target
        target.pending = (self.rid, int(msg["round"]), self.request)
        try:
            raw = decoder.drafter.propose_tree(tuple(self.ctx), max_nodes=max_nodes, max_depth=max_depth)  # type: ignore[attr-defined]
            tree = raw if isinstance(raw, TreeDraft) else TreeDraft(*raw)
            tree.check(decoder.engine.vocab_size)
            if len(tree) > max_nodes or tree.depth > max_depth:
                raise DrafterContractError(
                    f"drafter {component_name(decoder.drafter)} returned a tree of {len(tree)} nodes and depth "
                    f"{tree.depth}; the round allows {max_nodes} nodes and depth {max_depth} (tree.well-formed)"
                )
        except BaseException:
            target.pending = None
            self._abandon()
            raise
        self.sent = tree
        decoder.target.forward_tree(list(tree.tokens), list(tree.parents))  # sends the draft
        if target.pending is not None:
            self._fault("the tree decoder's target did not send the round's tree")

    def _abandon(self) -> None:
        """The drafter raised while the engine waits for a draft: a ``reset`` in its place; read up to the
        engine's error for the request, so the engine stays usable."""
        channel = self.channel
        try:
            channel.send({"type": "reset", "id": channel.new_id()}, self.request)
            while True:
                answer = channel.receive(("round", "state", "error", "ok", "final"), self.request)
                if answer["type"] == "error" and answer.get("id") in (self.rid, None):
                    break
        except EngineProtocolError:
            pass

    def _round(self, msg: dict[str, Any]) -> None:
        if msg["round"] != len(self.rounds):
            self._fault(f"round record {msg['round']} arrived after {len(self.rounds)} rounds")
        if "parents" not in msg or "path" not in msg:
            self._fault("a round record without parents and path in a tree request")
        tree, self.sent = self.sent, None
        if tree is None:  # a round with no propose (no room for a draft): the empty tree
            tree = TreeDraft((), ())
            self.decoder.target.forward_tree([], [])
        if tuple(msg["draft"]) != tree.tokens or tuple(msg["parents"]) != tree.parents:
            self._fault(
                f"round {msg['round']} reports the tree {msg['draft']} / parents {msg['parents']}, but the suite "
                f"sent {list(tree.tokens)} / {list(tree.parents)}"
            )
        if len(msg["argmax"]) != len(tree) + 1:
            self._fault(f"round {msg['round']}: {len(msg['argmax'])} argmax rows for a tree of {len(tree)} nodes")
        accepted = tuple(int(t) for t in msg["accepted"])
        remaining = self.max_new_tokens - len(self.out)
        emitted = list(accepted[:remaining])
        if self.eos is not None and self.eos in emitted:
            emitted = emitted[: emitted.index(self.eos) + 1]
        path = tuple(int(n) for n in msg["path"])
        self.rounds.append(TreeRound(base=msg["base"], tree=tree, path=path, accepted=accepted, emitted=tuple(emitted)))
        path_tokens = tuple(tree.tokens[n] for n in path if 0 <= n < len(tree))
        self.steps.append(
            Step(
                base=msg["base"],
                draft=path_tokens,
                argmax=(*path_tokens, accepted[-1]),
                accepted=accepted,
                processed=msg["processed"],
            )
        )
        self.out.extend(emitted)
        self.ctx.extend(emitted)

    def _final(self, msg: dict[str, Any]) -> Generation:
        if self.decoder._view is not None and self.states != len(self.rounds) + 1:
            self._fault(
                f"the request asked for the state (one state message before every round and one after the "
                f"last), but the engine sent {self.states} for {len(self.rounds)} rounds"
            )
        if list(msg["tokens"]) != self.out:
            self._fault(f"final.tokens {msg['tokens']} are not the rounds' emitted tokens {self.out}")
        stop: StopReason = msg["stop_reason"]
        return Generation(tokens=self.out, stop_reason=stop, steps=tuple(self.steps), stats=_stats(msg.get("stats")))


class _OneTree:
    """Drafts ``tree`` in the first round, nothing after."""

    def __init__(self, tree: TreeDraft) -> None:
        self.tree: TreeDraft | None = tree

    def propose_tree(self, context: Sequence[int], *, max_nodes: int, max_depth: int) -> TreeDraft:
        tree, self.tree = self.tree, None
        return tree if tree is not None else TreeDraft((), ())


class WireTreeProbe:
    """A wire engine's per-node tree state as a tree target (capability ``tree_state``), for the white-box
    ``tree.per-node-state``: ``forward(tokens)`` extends the context (nothing is sent yet),
    ``forward_tree(tokens, parents)`` runs a tree request over it and returns every node's logits row and a
    checkpoint — the state the engine reported for it — which ``restore`` makes ``state_arrays()``.

    The nodes no deeper than the engine's ``k`` are verified in one tree request; a deeper node (a tree
    deeper than the engine drafts) in a request of its own, its ancestors' tokens appended to the prompt.
    """

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.vocab_size: int = engine.vocab_size
        self.max_context: int = engine.max_context
        self._context: list[int] = []
        self._held: NodeState | None = None

    @property
    def processed(self) -> int:
        return self._held.processed if self._held is not None else len(self._context)

    def reset(self) -> None:
        self._context, self._held = [], None

    def forward(self, tokens: Sequence[int]) -> None:
        self._context.extend(int(t) for t in tokens)
        self._held = None

    def restore(self, checkpoint: object) -> None:
        if not isinstance(checkpoint, NodeState):
            raise InvalidSettingError(f"WireTreeProbe.restore: {checkpoint!r} is not one of its checkpoints")
        self._held = checkpoint

    def state_arrays(self) -> dict[str, npt.NDArray[np.float32]]:
        if self._held is None:
            raise InvalidSettingError("WireTreeProbe holds no node's state: restore a checkpoint of forward_tree")
        return self._held.arrays

    def forward_tree(
        self, tokens: Sequence[int], parents: Sequence[int]
    ) -> tuple[npt.NDArray[np.float32], list[NodeState]]:
        if not self._context:
            raise InvalidSettingError("WireTreeProbe.forward_tree: forward a context first (a tree hangs under it)")
        tree = TreeDraft(tokens, parents).check(self.vocab_size)
        k = int(self._engine.k)
        shallow = [i for i in range(len(tree)) if tree.depths[i] <= k]
        index = {old: new for new, old in enumerate(shallow)}
        states: dict[int, NodeState] = {}
        if shallow:
            sub = TreeDraft(
                [tree.tokens[i] for i in shallow],
                [index[p] if p >= 0 else -1 for p in (tree.parents[i] for i in shallow)],
            )
            got = self._run(self._context, sub)
            states.update({old: got[new] for old, new in index.items()})
        for i in range(len(tree)):
            if i not in states:  # deeper than the engine's k: the node alone after its ancestors
                ancestors = [tree.tokens[a] for a in tree.path(i)[:-1]]
                states[i] = self._run([*self._context, *ancestors], TreeDraft((tree.tokens[i],), (-1,)))[0]
        logits = np.stack([states[i].logits for i in range(len(tree))]) if len(tree) else np.zeros((0, self.vocab_size))
        return logits.astype(np.float32), [states[i] for i in range(len(tree))]

    def _run(self, prompt: list[int], tree: TreeDraft) -> dict[int, NodeState]:
        decoder = WireTreeDecoder(
            self._engine, _OneTree(tree), max_nodes=max(1, len(tree)), max_depth=tree.depth, node_state=True
        )
        decoder.generate(prompt, tree.depth + 1)
        first = decoder.last_node_states[0] if decoder.last_node_states else {}
        if set(first) != set(range(len(tree))):
            raise EngineProtocolError(
                f"engine {self._engine.label}: asked for the state of the {len(tree)} nodes of a tree, it sent "
                f"{sorted(first)} (docs/protocol.md, Trees)"
            )
        return first


class TreeMethods:
    """``WireEngine``'s tree half: ``tree_decoder`` (capability ``trees``) and ``tree_probe`` (with
    ``tree_state`` too), set only when the handshake declares them, so the tree checks skip an engine
    without them saying it does not verify trees (docs/protocol.md, Trees)."""

    capabilities: frozenset[str]

    @property
    def label(self) -> str:  # WireEngine's: the engine's name and spec, for messages
        raise NotImplementedError

    def _offer_trees(self) -> None:
        if TREES in self.capabilities:
            self.tree_decoder = self._tree_decoder
        if TREES in self.capabilities and TREE_STATE in self.capabilities:
            # for the white-box ``tree.per-node-state``: each node's state
            self.tree_probe = lambda: WireTreeProbe(self)  # type: ignore[arg-type]

    def _tree_decoder(
        self, drafter: object, *, max_nodes: int, max_depth: int, target: object = None
    ) -> WireTreeDecoder:
        """A greedy tree decoder whose rounds this engine verifies (capability ``trees``); ``target`` must be
        None: the engine's own model verifies the trees (it exposes no ``tree_target``)."""
        if target is not None:
            raise InvalidSettingError(f"engine {self.label} verifies trees on its own model: target must be None")
        if SAMPLED_TREES in self.capabilities:  # its generate takes sampling=: tree.sampled-distribution runs
            return WireSampledTreeDecoder(self, drafter, max_nodes=max_nodes, max_depth=max_depth)
        return WireTreeDecoder(self, drafter, max_nodes=max_nodes, max_depth=max_depth)  # type: ignore[arg-type]
