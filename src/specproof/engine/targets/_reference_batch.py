"""A slot pool over the reference hybrid: the batched target the batched decoder verifies with.

Each slot is one ``ReferenceHybrid`` built from the same config and weights, so it holds that
request's own KV cache, conv state and recurrent state; slots are handed out through a free
list and cleared (``reset``) when freed. ``forward_batch`` runs one verify step over rows of
different lengths: the result is padded to the widest row with a mask, and each row is computed
by its slot's own forward over its valid tokens only, which is exactly the forward a solo run of
that request makes. That is why the pool is batch-invariant bit for bit (docs/contract.md,
"Batches"): no row's arithmetic depends on its neighbours, on the batch size or on padding, and
padded positions never reach any state.

Only the reference target's public API is used (``forward``, ``forward_with_checkpoints``,
``snapshot``/``restore``, ``reset``, ``state_arrays``).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from specproof.contract.errors import InvalidSettingError
from specproof.contract.validation import int_at_least
from specproof.engine.targets.reference import ReferenceHybrid, ReferenceSnapshot

__all__ = ["BatchForward", "ReferenceSlotPool", "SwappedSlot"]


@attrs.frozen
class BatchForward:
    """One verify step's result: ``logits[b, i]`` for row ``b``'s ``i``-th token where ``mask[b, i]``
    (zeros elsewhere), and per row the checkpoints after each of its valid tokens (None unless asked)."""

    logits: np.ndarray
    mask: np.ndarray
    checkpoints: tuple[tuple[object, ...], ...] | None

    def row(self, b: int) -> np.ndarray:
        """Row ``b``'s valid logits."""
        return self.logits[b, self.mask[b]]


@attrs.frozen
class SwappedSlot:
    """A preempted request's slot memory, moved out of the pool: the slot device and its state then."""

    device: ReferenceHybrid = attrs.field(repr=False)
    saved: ReferenceSnapshot


class ReferenceSlotPool:
    """``slots`` reference-hybrid slots sharing ``target``'s config and weights, reused through a free list.

    The free list is a stack: the slot freed last is handed out next, so a request meets the slot
    its predecessor just left (the A, B, A reuse pattern) as soon as possible.
    """

    def __init__(self, target: ReferenceHybrid, *, slots: int) -> None:
        if not isinstance(target, ReferenceHybrid):
            raise InvalidSettingError(
                f"ReferenceSlotPool needs a ReferenceHybrid to copy its weights from, got {type(target).__name__}"
            )
        self.slots = int_at_least(slots, name="slots", minimum=1, where="ReferenceSlotPool")
        self._template = target
        self.vocab_size = target.vocab_size
        self.max_context = target.max_context
        self._devices = [self._fresh_device() for _ in range(self.slots)]
        self._spares: list[ReferenceHybrid] = []
        self._free = list(reversed(range(self.slots)))
        self._busy: set[int] = set()

    def __repr__(self) -> str:
        return f"ReferenceSlotPool(slots={self.slots}, free={len(self._free)})"

    @property
    def template(self) -> ReferenceHybrid:
        """The target whose config and weights every slot copies (no slot decodes on it)."""
        return self._template

    def _fresh_device(self) -> ReferenceHybrid:
        return ReferenceHybrid(self._template.config, weights=self._template.weights)

    # ------------------------------------------------------------------ the free list

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def acquire(self) -> int:
        """A cleared slot from the free list (``InvalidSettingError`` when none is free)."""
        if not self._free:
            raise InvalidSettingError(f"every one of the pool's {self.slots} slots is in use")
        slot = self._free.pop()
        self._busy.add(slot)
        return slot

    def release(self, slot: int) -> None:
        """Clear ``slot`` (empty KV, zero conv and recurrent state) and put it back on the free list."""
        self._check_busy(slot)
        self.clear(slot)
        self._busy.discard(slot)
        self._free.append(slot)

    def clear(self, slot: int) -> None:
        """Empty ``slot``'s state; every earlier snapshot of it becomes stale."""
        self._devices[slot].reset()

    def device(self, slot: int) -> ReferenceHybrid:
        """The slot's own target: what per-slot prefill, snapshot, restore and rollback act on."""
        self._check_busy(slot)
        return self._devices[slot]

    def state_arrays(self, slot: int) -> dict[str, np.ndarray]:
        """Copies of the slot's four device states (KV cut to the valid prefix)."""
        return self.device(slot).state_arrays()

    def _check_busy(self, slot: int) -> None:
        if slot not in self._busy:
            raise InvalidSettingError(f"slot {slot!r} is not held by a request (held: {sorted(self._busy)})")

    # ------------------------------------------------------------------ preemption by snapshot

    def evict(self, slot: int) -> SwappedSlot:
        """Move ``slot``'s memory out of the pool (swap-out) and free the slot for another request."""
        device = self.device(slot)
        swapped = SwappedSlot(device=device, saved=device.snapshot())
        self._devices[slot] = self._spares.pop() if self._spares else self._fresh_device()
        self._busy.discard(slot)
        self._free.append(slot)
        return swapped

    def resume(self, swapped: SwappedSlot) -> int:
        """Put a swapped-out memory back into a free slot and restore its saved state; returns the slot.

        ``restore`` refuses a snapshot whose KV prefix was overwritten since (a stale one)."""
        slot = self.acquire()
        self._devices[slot].reset()
        self._spares.append(self._devices[slot])
        self._devices[slot] = swapped.device
        swapped.device.restore(swapped.saved)
        return slot

    # ------------------------------------------------------------------ one verify step

    def forward_batch(self, rows: Sequence[tuple[int, Sequence[int]]], *, checkpoints: bool) -> BatchForward:
        """Feed each ``(slot, tokens)`` row after its slot's processed tokens, in one step.

        Rows may differ in length (0 included); the logits are padded to the widest row and
        ``mask`` marks the valid positions. Each row is its slot's own forward over its valid
        tokens, so padding writes no state and no row depends on another.
        """
        slots = [slot for slot, _ in rows]
        if len(set(slots)) != len(slots):
            raise InvalidSettingError(f"forward_batch: a slot appears twice in one step ({slots})")
        lengths = [len(tokens) for _, tokens in rows]
        width = max(lengths, default=0)
        logits = np.zeros((len(rows), width, self.vocab_size), np.float32)
        mask = np.zeros((len(rows), width), bool)
        cks: list[tuple[object, ...]] = []
        for b, (slot, tokens) in enumerate(rows):
            valid = self._row_forward(slot, tokens, width=width, checkpoints=checkpoints, cks=cks)
            logits[b, : len(tokens)] = valid
            mask[b, : len(tokens)] = True
        return BatchForward(logits=logits, mask=mask, checkpoints=tuple(cks) if checkpoints else None)

    def _row_forward(
        self, slot: int, tokens: Sequence[int], *, width: int, checkpoints: bool, cks: list[tuple[object, ...]]
    ) -> np.ndarray:
        """One row of a verify step: the slot's forward over its valid tokens (``width``: the padded
        width, unused here; a pool that computes padded rows overrides this)."""
        device = self.device(slot)
        if checkpoints:
            out, row_cks = device.forward_with_checkpoints(list(tokens))
            cks.append(tuple(row_cks))
            return out
        return device.forward(list(tokens))
