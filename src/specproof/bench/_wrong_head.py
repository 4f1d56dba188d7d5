"""A consistently wrong feature head, for showing what the acceptance gate catches.

``ChainedHead`` drafts with the packaged MTP (or EAGLE) head of the ``trained`` fixture, written
against the head's public kernels (``FeatureHead.fuse`` / ``step`` / ``logits``) rather than
``HeadDrafter``'s internals. With ``chain="output"`` it is the correct head: each chained step
reads the previous step's output hidden state, and it proposes exactly what ``mtp:trained``
proposes. With ``chain="target"`` it makes the mistake of vLLM PR #36531: every chained step
reads the *target's* last hidden state (the feature of the last real position) instead of the
previous step's output. The first draft token is unchanged; the later ones are worse.

That drafter is correct-but-different to every conformance invariant (its drafts are a
deterministic function of the context, the engine's output stays lossless); only its acceptance
falls, and ``specproof bench --drafter ... --gate BASELINE`` is the check that sees it
(docs/benchmarks-guide.md, "Gating a drafter's acceptance"). The two are plug-in specs:

- ``specproof.bench:mtp_chain_reads_target``: the wrong head;
- ``specproof.bench:mtp_chain_reads_output``: the same code with the correct chain (a control).

The drafter computes the features itself, with its own copy of the ``trained`` target fed
incrementally (restarted when the context diverges), as ``HeadDrafter`` does without features.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Literal

import numpy as np

from specproof.contract.errors import InvalidSettingError
from specproof.fixtures import load_head_drafter, load_trained_target

__all__ = ["ChainedHead", "mtp_chain_reads_output", "mtp_chain_reads_target"]

Chain = Literal["output", "target"]
_CHAINS: Final = ("output", "target")
_F32 = np.float32


class ChainedHead:
    """A greedy feature head over the ``trained`` target whose chain reads ``chain``'s hidden state.

    ``chain="output"``: the previous step's output (correct); ``chain="target"``: the target's
    hidden state at the last real position, for every chained step (vLLM PR #36531).
    """

    feature_target_spec: Final = "trained"

    def __init__(self, kind: str = "mtp", *, chain: Chain = "target") -> None:
        if chain not in _CHAINS:
            raise InvalidSettingError(f"ChainedHead chain={chain!r} is not one of {', '.join(_CHAINS)}")
        self.head: Any = load_head_drafter(kind, "trained").head
        self.kind = kind
        self.chain: Chain = chain
        self.name = f"specproof.bench.ChainedHead({kind}:trained, chain reads the {chain})"
        self._target: Any = None  # the trained target (a ReferenceHybrid: forward_with_features), made on first use
        self.reset()

    def __repr__(self) -> str:
        return f"ChainedHead(kind={self.kind!r}, chain={self.chain!r})"

    def reset(self) -> None:
        self._cache = self.head.new_cache()
        self._out = np.zeros((self.head.max_context, self.head.d_model), _F32)
        self._toks: list[int] = []  # the context tokens the head's real positions consumed
        self._n = 0  # real head positions held
        self._ftoks: list[int] = []  # the tokens the own target has been fed
        self._frows: dict[int, np.ndarray] = {}
        if self._target is not None:
            self._target.reset()

    def _features(self, context: Sequence[int]) -> dict[int, np.ndarray]:
        """The target's features of ``context[:-1]``, from the drafter's own target fed incrementally."""
        layers = tuple(self.head.feature_layers)
        if self._target is None:
            self._target = load_trained_target()
            self._target.reset()
        want = [int(t) for t in context[:-1]]
        if want[: len(self._ftoks)] != self._ftoks:  # diverged: start the own target again
            self._target.reset()
            self._ftoks, self._frows = [], {}
        new = want[len(self._ftoks) :]
        if new:
            _, feats, _ = self._target.forward_with_features(new, layers)
            for layer in layers:
                rows = np.asarray(feats[layer], dtype=_F32)
                old = self._frows.get(layer)
                self._frows[layer] = rows if old is None else np.concatenate((old, rows))
            self._ftoks.extend(new)
        return self._frows

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        m = len(context)
        head = self.head
        if k <= 0 or m < 2 or m - 1 > head.max_context:
            return []
        k = min(int(k), head.max_context - (m - 1) + 1)
        feats = self._features(context)
        agree = 0  # head position i consumed (feature i, token i + 1): reusable while the tokens agree
        limit = min(len(self._toks), m)
        while agree < limit and self._toks[agree] == int(context[agree]):
            agree += 1
        reuse = min(self._n, max(agree - 1, 0))
        if reuse < m - 1:
            toks = [int(t) for t in context[reuse + 1 : m]]
            self._out[reuse : m - 1] = head.step(self._cache, reuse, toks, head.fuse(feats, reuse, m - 1))
        self._n = m - 1
        self._toks = [int(t) for t in context]
        last = self._out[m - 2]
        target_last = head.fuse(feats, m - 2, m - 1)[0]  # the target's hidden state at the last real position
        draft = [int(np.argmax(head.logits(last)[0]))]
        pos = m - 1
        while len(draft) < k:  # chain positions past the real ones: overwritten by the next call
            hidden = last if self.chain == "output" else target_last
            last = head.step(self._cache, pos, [draft[-1]], hidden[None, :])[0]
            draft.append(int(np.argmax(head.logits(last)[0])))
            pos += 1
        return draft


def mtp_chain_reads_target() -> ChainedHead:
    """The MTP head with vLLM PR #36531's mistake: chained steps read the target's last hidden state."""
    return ChainedHead("mtp", chain="target")


def mtp_chain_reads_output() -> ChainedHead:
    """The MTP head with the correct chain, through the same code: proposes what ``mtp:trained`` does."""
    return ChainedHead("mtp", chain="output")
