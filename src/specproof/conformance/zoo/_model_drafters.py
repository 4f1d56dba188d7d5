"""Model drafters: ``ModelDrafter`` over a small draft model, with one rollback bug each.

A draft model runs ahead over its own draft every round; before the next proposal it must
be rolled back to the accepted prefix (KV *and* conv / recurrent state) and take in the
bonus token. A drafter that gets this wrong never breaks losslessness (the target checks
every token), it silently proposes worse drafts, so only ``drafter.deterministic`` sees it:
called along a decoding, it proposes something other than a fresh drafter asked once on
the same context.

The bugs' draft model is ``trained-small`` (the ``trained`` fixture's draft model: conv and
attention blocks, 256 byte ids, so it fits the default certification target's vocabulary)
or, where a bug needs a recurrent block as well, ``reference:layers=conv+attn+gdn``.
The correct members differ from the built-in ``ModelDrafter`` (checkpoint rollback) and
must pass: replay-only rollback, a re-prefill every call, a draft model on transformers /
MLX (skipped without the extra).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from specproof.engine.drafters.model import ModelDrafter
from specproof.plugins import load_target

__all__ = [
    "DRAFT_MODEL",
    "GDN_DRAFT_MODEL",
    "DraftKVOnlyRollback",
    "DraftNoRollback",
    "DraftResetKeepsModel",
    "ReprefillDrafter",
    "model_drafter_checkpoint",
    "model_drafter_hf",
    "model_drafter_kv_only_rollback",
    "model_drafter_kv_only_rollback_gdn",
    "model_drafter_mlx",
    "model_drafter_no_rollback",
    "model_drafter_reprefill",
    "model_drafter_replay",
    "model_drafter_reset_keeps_state",
]

DRAFT_MODEL = "trained-small"
GDN_DRAFT_MODEL = "reference:d_model=32,layers=conv+attn+gdn,max_context=1024"


class DraftNoRollback(ModelDrafter):
    """``drafter.deterministic``: after a rejection the draft model is not rolled back at all.

    Its KV cache and conv state keep the rejected draft tokens, and the bonus token is fed
    after them. Shipped as: a draft-model loop that only ever appends (the draft model's cache
    is "reused across rounds" without trimming), which costs acceptance after every rejection.
    """

    bug = "the draft model is never rolled back after a rejected draft"

    def _rollback_to(self, position: int) -> None:
        if position == len(self._fed):
            return
        _, row = self._saved[position]
        del self._fed[position:]  # the bookkeeping forgets the draft; the model does not
        self._row = row
        for p in [p for p in self._saved if p > position]:
            del self._saved[p]


class DraftKVOnlyRollback(ModelDrafter):
    """``drafter.deterministic``: trims the draft model's KV cache but leaves its conv state.

    ``processed`` (the KV length) goes back to the accepted prefix, as a trimmable attention
    cache allows; the short-conv window (and a recurrent block's state, if restored
    correctly) keeps the rejected draft tokens. Shipped as: "trim the prompt cache" on a
    hybrid, where only the attention layers are trimmable.
    """

    bug = "rollback trims the KV cache, not the conv state"

    def _rollback_to(self, position: int) -> None:
        if position == len(self._fed):
            return
        state, row = self._saved[position]
        now = self.model.snapshot()
        # the saved state's KV length and recurrent state, with the conv window of the run-ahead draft
        self.model.restore(attrs.evolve(state, conv_state=now.conv_state))  # type: ignore[misc, attr-defined]
        del self._fed[position:]
        self._row = row
        for p in [p for p in self._saved if p > position]:
            del self._saved[p]


class DraftResetKeepsModel(ModelDrafter):
    """``drafter.deterministic``: ``reset()`` clears the bookkeeping but not the draft model.

    The next generation's prefill is fed on top of the previous generation's KV and conv
    state. Shipped as: an engine that resets its own caches between requests and forgets the
    draft model's.
    """

    bug = "reset() keeps the previous generation's draft-model state"

    def reset(self) -> None:
        if not hasattr(self, "_fed"):
            super().reset()  # the constructor's reset is a real one
            return
        model_reset = self.model.reset
        self.model.reset = lambda: None  # type: ignore[method-assign]
        try:
            super().reset()
        finally:
            self.model.reset = model_reset  # type: ignore[method-assign]


class ReprefillDrafter(ModelDrafter):
    """Correct, different: no rollback at all; every proposal resets the model and prefills the context.

    Costs a full prefill per proposal (the cost ``ModelDrafter`` avoids), proposes the same drafts.
    """

    bug = "none (correct: re-prefills every call)"

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        self.model.reset()
        self._fed, self._row, self._saved = [], None, {}
        return super().propose(context, k)


def model_drafter_no_rollback() -> DraftNoRollback:
    return DraftNoRollback(load_target(DRAFT_MODEL), name="specproof.zoo.DraftNoRollback")


def model_drafter_kv_only_rollback() -> DraftKVOnlyRollback:
    return DraftKVOnlyRollback(load_target(DRAFT_MODEL), name="specproof.zoo.DraftKVOnlyRollback")


def model_drafter_kv_only_rollback_gdn() -> DraftKVOnlyRollback:
    """The same bug on a draft model with a Gated DeltaNet block too (its recurrent state is restored)."""
    return DraftKVOnlyRollback(load_target(GDN_DRAFT_MODEL), name="specproof.zoo.DraftKVOnlyRollback(gdn)")


def model_drafter_reset_keeps_state() -> DraftResetKeepsModel:
    return DraftResetKeepsModel(load_target(DRAFT_MODEL), name="specproof.zoo.DraftResetKeepsModel")


def model_drafter_checkpoint() -> ModelDrafter:
    """The correct control: the built-in ``ModelDrafter`` (checkpoint rollback) on the same draft model."""
    return ModelDrafter(load_target(DRAFT_MODEL), rollback="checkpoint", name="specproof.zoo.ModelDrafter")


def model_drafter_replay() -> ModelDrafter:
    """Correct, different: replay-only rollback (snapshot after the catch-up, accepted tokens re-fed)."""
    return ModelDrafter(load_target(DRAFT_MODEL), rollback="replay", name="specproof.zoo.ModelDrafter(replay)")


def model_drafter_reprefill() -> ReprefillDrafter:
    return ReprefillDrafter(load_target(DRAFT_MODEL), name="specproof.zoo.ReprefillDrafter")


def model_drafter_hf() -> ModelDrafter:
    """Correct, different: the draft model is transformers' LFM2 (``hf:lfm2-tiny``, checkpoint rollback)."""
    return ModelDrafter(load_target("hf:lfm2-tiny"), name="specproof.zoo.ModelDrafter(hf:lfm2-tiny)")


def model_drafter_mlx() -> ModelDrafter:
    """Correct, different: the draft model is mlx-lm's LFM2 (``mlx:lfm2-tiny``, replay rollback)."""
    return ModelDrafter(load_target("mlx:lfm2-tiny"), name="specproof.zoo.ModelDrafter(mlx:lfm2-tiny)")
