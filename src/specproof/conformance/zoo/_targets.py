"""Broken targets: a small ``ReferenceHybrid`` behind a wrapper that gets one thing wrong.

``ZooTarget`` is the correct control: it delegates every call to the wrapped
reference model and passes every target invariant. Each subclass overrides one
method with one bug of a kind real backends shipped; a target subject also runs
the built-in engine on it, so most of these are caught twice.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np
import numpy.typing as npt

from specproof.engine.targets.reference import ReferenceConfig, ReferenceHybrid, ReferenceSnapshot

__all__ = [
    "MaskLeaksNextToken",
    "PadsVocab",
    "ProcessedIsLastIndex",
    "ResetKeepsConv",
    "ZOO_CONFIG",
    "CapacityWraps",
    "CheckpointsOffByOne",
    "ChunkedForwardDiffers",
    "RestoreForgetsConv",
    "RestoreForgetsRec",
    "ZooTarget",
    "small_reference",
]

FloatArray = npt.NDArray[np.float32]

# Small enough that a certification run over it takes seconds, yet every block kind
# (short conv, attention with GQA, Gated DeltaNet) and all four device states are there.
ZOO_CONFIG = ReferenceConfig(
    vocab_size=64,
    d_model=32,
    layers=("conv", "attn", "gdn", "conv"),
    n_heads=2,
    n_kv_heads=1,
    head_dim=16,
    ffn_dim=64,
    gdn_heads=2,
    gdn_key_dim=8,
    gdn_value_dim=8,
    max_context=256,
    seed=11,
)


def small_reference(*, max_context: int | None = None, seed: int | None = None) -> ReferenceHybrid:
    """The zoo's reference model: ``ZOO_CONFIG``, optionally with another ``max_context`` or seed."""
    config = ZOO_CONFIG
    if max_context is not None:
        config = attrs.evolve(config, max_context=max_context)
    if seed is not None:
        config = attrs.evolve(config, seed=seed)
    return ReferenceHybrid(config)


class ZooTarget:
    """A correct target: every call goes to a wrapped ``ReferenceHybrid`` unchanged.

    Subclasses change one method; ``bug`` names it (and ends up in ``name``).
    """

    bug = "none (the correct control)"

    def __init__(self, inner: ReferenceHybrid | None = None) -> None:
        self.inner = small_reference() if inner is None else inner
        self.vocab_size: int = self.inner.vocab_size
        self.max_context: int = self.inner.max_context
        self.tie_tolerance = 0.0  # the wrapped reference is exactly batch-invariant
        self.name = f"specproof.zoo.{type(self).__name__}"

    def __repr__(self) -> str:
        return f"<{self.name} processed={self.processed}; bug: {self.bug}>"

    @property
    def processed(self) -> int:
        return self.inner.processed

    def forward(self, tokens: Sequence[int]) -> FloatArray:
        return self.inner.forward(tokens)

    def forward_with_checkpoints(self, tokens: Sequence[int]) -> tuple[FloatArray, list[object]]:
        return self.inner.forward_with_checkpoints(tokens)

    def snapshot(self) -> object:
        return self.inner.snapshot()

    def restore(self, snapshot: object) -> None:
        self.inner.restore(snapshot)

    def reset(self) -> None:
        self.inner.reset()

    def state_arrays(self) -> dict[str, FloatArray]:
        return self.inner.state_arrays()

    def describe(self) -> str:
        return f"{self.name} (bug: {self.bug}) over {self.inner.describe()}"


def _bfloat16(x: FloatArray) -> FloatArray:
    """Round float32 values to bfloat16 precision (8 significant bits), round-half-to-even."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


class ChunkedForwardDiffers(ZooTarget):
    """``target.chunk-invariance``: a forward of q > 1 tokens returns logits at bfloat16 precision.

    Shipped as: a backend with one kernel for the one-token decode step (fp32) and a
    faster batched "prefill" kernel (bf16/fp16 accumulation) that the verify forward
    also uses, so verify logits are not the decode logits and ties break differently.
    """

    bug = "q > 1 forwards run a reduced-precision (bfloat16) kernel"

    def forward(self, tokens: Sequence[int]) -> FloatArray:
        logits = self.inner.forward(tokens)
        return _bfloat16(logits) if len(logits) > 1 else logits

    def forward_with_checkpoints(self, tokens: Sequence[int]) -> tuple[FloatArray, list[object]]:
        logits, checkpoints = self.inner.forward_with_checkpoints(tokens)
        return (_bfloat16(logits) if len(logits) > 1 else logits), checkpoints


class RestoreForgetsConv(ZooTarget):
    """``target.restore``: ``restore`` puts back ``processed`` and the recurrent state, not ``conv_state``.

    Shipped as: transformers' LFM2 cache cropping (prompt-lookup decoding), which
    rewound the attention cache and ignored the short-convolution window.
    """

    bug = "restore leaves conv_state as it is"

    def restore(self, snapshot: object) -> None:
        if isinstance(snapshot, ReferenceSnapshot):
            current = self.inner.snapshot()
            snapshot = attrs.evolve(snapshot, conv_state=current.conv_state)
        self.inner.restore(snapshot)


class RestoreForgetsRec(ZooTarget):
    """``target.restore``: ``restore`` puts back ``processed`` and ``conv_state``, not the delta-rule ``rec_state``.

    Shipped as: caches that treat the recurrent state as "append-only like KV" and
    only move the length pointer back (the reason mlx-lm refuses an untrimmable cache).
    """

    bug = "restore leaves rec_state as it is"

    def restore(self, snapshot: object) -> None:
        if isinstance(snapshot, ReferenceSnapshot):
            current = self.inner.snapshot()
            snapshot = attrs.evolve(snapshot, rec_state=current.rec_state)
        self.inner.restore(snapshot)


class CapacityWraps(ZooTarget):
    """``target.capacity``: a forward past ``max_context`` is accepted instead of raising.

    The wrapper advertises ``max_context`` = half the wrapped model's room and never
    checks it, so positions past the promised capacity are silently written, as an
    unchecked ring-buffer index on a device writes over the oldest KV slots.
    """

    bug = "no capacity check: forwards past max_context silently succeed"

    def __init__(self, inner: ReferenceHybrid | None = None) -> None:
        super().__init__(small_reference(max_context=2 * ZOO_CONFIG.max_context) if inner is None else inner)
        self.max_context = self.inner.max_context // 2


class CheckpointsOffByOne(ZooTarget):
    """``target.checkpoints``: ``checkpoints[i]`` is the state after ``i`` tokens, not ``i + 1``.

    Shipped as: a checkpointing kernel that saves the state *before* each position
    is folded in (the off-by-one behind "caches rewound by one entry too many").
    """

    bug = "checkpoint i is the snapshot after i tokens"

    def forward_with_checkpoints(self, tokens: Sequence[int]) -> tuple[FloatArray, list[object]]:
        before = self.inner.snapshot()
        logits, checkpoints = self.inner.forward_with_checkpoints(tokens)
        return logits, [before, *checkpoints[:-1]]


class PadsVocab(ZooTarget):
    """``target.shape``: logits have the padded vocabulary's width (a multiple of 128), not ``vocab_size``.

    Shipped as: exports that keep the embedding matrix padded for tensor cores (rows up
    to a multiple of 64 or 128) and forget to slice the logits back to the tokenizer's
    vocabulary; argmax may then pick an id the tokenizer does not have.
    """

    bug = "logits are [q, padded vocab] wide"

    def _pad(self, logits: FloatArray) -> FloatArray:
        width = -(-self.vocab_size // 128) * 128
        if width == self.vocab_size:
            width += 128
        out = np.zeros((logits.shape[0], width), dtype=logits.dtype)
        out[:, : logits.shape[1]] = logits
        return out

    def forward(self, tokens: Sequence[int]) -> FloatArray:
        return self._pad(self.inner.forward(tokens))

    def forward_with_checkpoints(self, tokens: Sequence[int]) -> tuple[FloatArray, list[object]]:
        logits, checkpoints = self.inner.forward_with_checkpoints(tokens)
        return self._pad(logits), checkpoints


class ProcessedIsLastIndex(ZooTarget):
    """``target.processed``: ``processed`` is the index of the last cached position (count - 1).

    Shipped as: a KV cache exposing its write pointer's last written slot where callers
    expect the number of cached tokens (the ``cache_position[-1]`` vs ``seq_len`` mix-up).
    """

    bug = "processed reports the last position's index, one less than the count"

    @property
    def processed(self) -> int:
        return max(self.inner.processed - 1, 0)


class MaskLeaksNextToken(ZooTarget):
    """``target.causality``: in a forward of q > 1 tokens, row i also sees token i + 1.

    Shipped as: a causal mask built with ``<=`` against positions shifted by one (or a
    sliding-window kernel with an off-by-one right edge), so a verify row peeks at the
    next draft token; one-token decode steps are unaffected.
    """

    bug = "the causal mask lets row i attend to token i + 1"

    def _leak(self, logits: FloatArray, tokens: Sequence[int]) -> FloatArray:
        out = np.array(logits, copy=True)
        for i in range(len(tokens) - 1):
            out[i, int(tokens[i + 1]) % out.shape[1]] += 0.5
        return out

    def forward(self, tokens: Sequence[int]) -> FloatArray:
        return self._leak(self.inner.forward(tokens), tokens)

    def forward_with_checkpoints(self, tokens: Sequence[int]) -> tuple[FloatArray, list[object]]:
        logits, checkpoints = self.inner.forward_with_checkpoints(tokens)
        return self._leak(logits, tokens), checkpoints


class DriftsFromSource(ZooTarget):
    """``target.matches-source``: a converted model that computes another function, consistently with itself.

    Shipped as: a conversion that keeps one MoE expert where the source keeps two, or loads a bias vector
    from the wrong layer: every row differs from the source model's the same way at every position, so
    chunk invariance, checkpoints and greedy against its own oracle all pass. It names the model it was
    converted from (``source_spec``), which ``target.matches-source`` compares it with.
    """

    bug = "logits of tokens 0-3 raised by 0.5 at every position (another function than its source)"
    source_spec = "specproof.conformance.zoo:small_reference"

    @staticmethod
    def _drift(logits: FloatArray) -> FloatArray:
        out = np.array(logits, copy=True)
        out[..., :4] += 0.5
        return out

    def forward(self, tokens: Sequence[int]) -> FloatArray:
        return self._drift(self.inner.forward(tokens))

    def forward_with_checkpoints(self, tokens: Sequence[int]) -> tuple[FloatArray, list[object]]:
        logits, checkpoints = self.inner.forward_with_checkpoints(tokens)
        return self._drift(logits), checkpoints


class ResetKeepsConv(ZooTarget):
    """``stateful.rollback-machine``: ``reset()`` zeroes ``processed`` and the recurrent state, not ``conv_state``.

    Shipped as: a cache "clear" that resets the attention cache and the SSM state but
    not the short-convolution window, so a new conversation on a reused target starts
    with the last one's conv window. Every check on a fresh target passes; only a
    target reused across conversations (the rollback machine's) shows it.
    """

    bug = "reset() keeps conv_state"

    def reset(self) -> None:
        conv = np.array(self.inner._conv_state, copy=True)
        self.inner.reset()
        self.inner._conv_state[...] = conv
