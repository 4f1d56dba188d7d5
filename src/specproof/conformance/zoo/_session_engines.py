"""Engines that keep their cache between requests: a correct one, two that shipped bugs, and unusual controls.

``SessionEngine`` is the correct control. It decodes with the built-in ``SpecDecoder``
on a small reference target it keeps between ``generate`` calls, and reuses the longest
common prefix of the new prompt with what the target has processed: it keeps a
snapshot of the recurrent state (conv, rec) at every 8th position of each prefill,
at the end of each prompt and at the end of each generation, restores the latest one at
or before the common prefix, re-feeds the rest, and drops the snapshots the re-feed
overwrote. Multi-turn (the last context plus a user turn) needs no restore at all;
regenerate and edits restore a snapshot; a prompt sharing nothing resets.

The members break exactly that reuse, the way real engines did:

- ``StalePrefixCache``: on a prefix hit shorter than the cache it moves the KV pointer
  back (``processed = common prefix``) but keeps the conv/rec state from the end of the
  last call (prefix caching for hybrid models that treated the recurrent state like KV);
- ``BlockCacheWithoutPrefix``: keeps the recurrent state after every 4-token block keyed by
  the block alone, so an equal block after a different prefix is served another prefix's state;
- ``SnapshotOnlyLastCall``: keeps recurrent snapshots only from the last request; a hit
  on a snapshot position of an older request (two call boundaries back) is served with the
  latest recurrent state it still has, ``processed`` cut to the hit (recurrent-state caches
  kept for the last batch only, while the prefix index lists every block).

Correct-but-unusual controls the session machine must pass: ``VaryingKSessionEngine``
(asks its drafter for a different k every round) and ``GreedyOnlySessionEngine`` (a
black box: ``generate``, ``vocab_size``, ``max_context`` and ``greedy()``, nothing else).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import attrs

from specproof.conformance.zoo._targets import small_reference
from specproof.contract.errors import InvalidSettingError
from specproof.contract.validation import int_at_least
from specproof.engine import (
    ContextView,
    DecodeSession,
    Generation,
    NgramDrafter,
    ReferenceHybrid,
    ReferenceSnapshot,
    SpecDecoder,
    greedy_decode,
)
from specproof.engine.conventions import check_prompt, component_name

__all__ = [
    "BlockCacheWithoutPrefix",
    "ContinuationOnlySessionEngine",
    "GreedyOnlySessionEngine",
    "NeverReusesPrefix",
    "OverclaimsPrefixReuse",
    "SessionEngine",
    "SnapshotOnlyLastCall",
    "StalePrefixCache",
    "VaryingKSessionEngine",
]

_CHUNK = 8  # prefill chunk: a snapshot at every multiple of it (prefix-cache block granularity)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class _ResumedSession(DecodeSession):
    """A ``DecodeSession`` over a target the engine has already positioned at ``prompt[:-1]``.

    ``DecodeSession.__init__`` resets the target and prefills; a caching engine has fed
    only the part past the common prefix itself, so this skips both and keeps the rest.
    """

    def __init__(self, decoder: SpecDecoder, prompt: Sequence[int], *, prefill_forwards: int) -> None:
        target = decoder.target
        self.decoder = decoder
        self._target_name = component_name(target)
        self._drafter_name = component_name(decoder.drafter)
        self._ctx = check_prompt(prompt, vocab_size=target.vocab_size, max_context=target.max_context)
        self._view = ContextView(self._ctx)
        self._rounds_done = 0
        self._pending_prefill = prefill_forwards
        if target.processed != len(self._ctx) - 1:
            raise InvalidSettingError(
                f"the target has processed {target.processed} tokens; a prompt of {len(self._ctx)} needs "
                f"{len(self._ctx) - 1}"
            )
        reset = getattr(decoder.drafter, "reset", None)
        if callable(reset):
            reset()


class SessionEngine:
    """A correct engine that keeps its cache between requests (the control the members break).

    ``SessionEngine(*, k=4, rollback="checkpoint", target=None, drafter=None)``: ``target``
    defaults to the zoo's small reference model, ``drafter`` to an ``NgramDrafter``; both
    are attributes, and ``drafter`` may be replaced between requests (the suite installs
    its scripted drafter there). ``reset()`` forgets the cache.
    """

    bug = "none (the correct control)"
    #: keeps its caches between requests and reports ``stats.prefix_reused`` (docs/contract.md, "Sessions")
    reuses_prefix = True

    def __init__(
        self,
        *,
        k: int = 4,
        rollback: str = "checkpoint",
        target: ReferenceHybrid | None = None,
        drafter: Any = None,
    ) -> None:
        int_at_least(k, name="k", minimum=0, where=type(self).__name__)
        if rollback not in ("checkpoint", "replay"):
            raise InvalidSettingError(f"{type(self).__name__} rollback={rollback!r} is not 'checkpoint' or 'replay'")
        self.target = small_reference() if target is None else target
        self.vocab_size: int = self.target.vocab_size
        self.max_context: int = self.target.max_context
        self.k = k
        self.rollback = rollback
        self.drafter: Any = NgramDrafter() if drafter is None else drafter
        self.name = f"specproof.zoo.{type(self).__name__}(k={k}, rollback={rollback})"
        self._cached: list[int] = []  # the tokens the target has processed, in order
        self._snapshots: dict[
            int, ReferenceSnapshot
        ] = {}  # position -> snapshot with processed == position, on _cached
        self._call = 0
        self._taken_in: dict[int, int] = {}  # position -> the call that took its snapshot
        self.target.reset()

    def __repr__(self) -> str:
        return f"<{self.name}; cached {len(self._cached)} tokens; bug: {self.bug}>"

    def reset(self) -> None:
        """Forget every cached token and snapshot."""
        self.target.reset()
        self._cached = []
        self._snapshots.clear()
        self._taken_in.clear()

    # ------------------------------------------------------------------ the cache

    def _snap(self) -> None:
        pos = self.target.processed
        self._snapshots[pos] = self.target.snapshot()
        self._taken_in[pos] = self._call

    def _drop_after(self, position: int) -> None:
        """Forget snapshots past ``position``: the next forward overwrites their KV slots."""
        for pos in [p for p in self._snapshots if p > position]:
            del self._snapshots[pos]
            self._taken_in.pop(pos, None)

    def _feed(self, tokens: Sequence[int]) -> int:
        """Feed ``tokens`` in chunks ending at multiples of ``_CHUNK``, snapshotting at each; the forwards used."""
        forwards = 0
        pos = self.target.processed
        i = 0
        while i < len(tokens):
            stop = min(len(tokens), i + _CHUNK - (pos + i) % _CHUNK)
            self.target.forward(list(tokens[i:stop]))
            forwards += 1
            i = stop
            if self.target.processed % _CHUNK == 0:
                self._snap()
        return forwards

    def _rewind(self, common: int) -> int:
        """Put the target at a position ``m <= common`` with the right state for ``_cached[:m]``; returns ``m``."""
        usable = [p for p in self._snapshots if p <= common]
        if not usable:
            self.target.reset()
            self._snapshots.clear()
            self._taken_in.clear()
            return 0
        m = max(usable)
        self.target.restore(self._snapshots[m])
        self._drop_after(m)
        return m

    def _position(self, prompt: list[int]) -> tuple[int, int]:
        """Make the target hold ``prompt[:-1]``, reusing the cache; returns the forwards used and the
        prompt tokens reused (not fed again)."""
        want = prompt[:-1]
        common = _common_prefix(self._cached, want)
        if common == len(self._cached) and self.target.processed == common:
            start = common  # the cache is a prefix of the prompt: just feed the rest (multi-turn)
        else:
            start = self._rewind(common)
        forwards = self._feed(want[start:])
        self._cached = list(want)
        self._snap()
        return forwards, start

    def _reported_reuse(self, reused: int, prompt: list[int]) -> int:
        """Hook: what ``stats.prefix_reused`` says (the correct engine tells the truth)."""
        return reused

    def _after_call(self) -> None:
        """Hook: called at the end of every ``generate`` (the correct engine keeps every snapshot)."""

    def _session(self, ctx: list[int], forwards: int) -> DecodeSession:
        """Hook: the decode session over the positioned target (a feature engine hands it its rows)."""
        return _ResumedSession(self._decoder(), ctx, prefill_forwards=forwards)

    def _finished(self, session: DecodeSession) -> None:
        """Hook: called with the finished session (a feature engine keeps its rows)."""

    def _run(self, session: DecodeSession, max_new_tokens: int, eos_token_id: int | None) -> Generation:
        """Hook: the call on the positioned decode session (an engine taking decode parameters passes them)."""
        return session.generate(max_new_tokens, eos_token_id=eos_token_id)

    def _decoder(self) -> SpecDecoder:
        return SpecDecoder(self.target, self.drafter, k=self.k, rollback=self.rollback)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ generation

    def generate(self, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None) -> Generation:
        ctx = check_prompt(prompt, vocab_size=self.vocab_size, max_context=self.max_context)
        self._call += 1
        forwards, reused = self._position(ctx)
        session = self._session(ctx, forwards)
        try:
            gen = self._run(session, max_new_tokens, eos_token_id)
        except BaseException:
            self.reset()  # the session restored its round, but be safe: start cold next time
            raise
        self._cached = list(session.context[:-1])
        self._snap()
        self._finished(session)
        self._after_call()
        if gen.stats is None:
            return gen
        return attrs.evolve(gen, stats=attrs.evolve(gen.stats, prefix_reused=self._reported_reuse(reused, ctx)))


class StalePrefixCache(SessionEngine):
    """On a prefix hit shorter than its cache, cuts the KV length but keeps the last call's conv/rec state.

    Shipped as: prefix caching for hybrid models that treated the recurrent state like
    KV blocks: the attention prefix is reused by pointer, the conv window and the
    delta-rule state are whatever the last request left.
    """

    bug = "a prefix hit moves processed back but keeps conv/rec state from the end of the last call"

    def _rewind(self, common: int) -> int:
        if common == 0:
            return super()._rewind(0)
        end = self.target.snapshot()
        self.target.restore(attrs.evolve(end, processed=common))
        self._drop_after(common)
        return common


class SnapshotOnlyLastCall(SessionEngine):
    """Keeps recurrent snapshots from the last request only; a hit on an older one restores the wrong state.

    Shipped as: recurrent-state caches kept for the last batch only, while the prefix
    index still lists every block it saw: a hit on a prefix whose snapshot came from an
    older request (the KV is still there) is served with the latest recurrent state
    still cached (the last request's), with the KV length cut to the hit. A hit shorter than every snapshot
    ever taken is a miss and re-prefills correctly, as do hits on the last request's.
    """

    bug = "snapshots kept only for the last request; a hit on an older one gets another request's recurrent state"

    def __init__(self, **kwargs: Any) -> None:
        self._forgotten: set[int] = set()  # positions the index lists whose arrays were dropped
        super().__init__(**kwargs)

    def reset(self) -> None:
        super().reset()
        self._forgotten.clear()

    def _drop_after(self, position: int) -> None:
        super()._drop_after(position)
        self._forgotten = {p for p in self._forgotten if p <= position}

    def _after_call(self) -> None:
        for pos in [p for p, call in self._taken_in.items() if call != self._call]:
            del self._snapshots[pos]
            del self._taken_in[pos]
            self._forgotten.add(pos)

    def _rewind(self, common: int) -> int:
        kept = [p for p in self._snapshots if p <= common]
        listed = [p for p in self._forgotten if p <= common]
        if not listed or not self._snapshots or (kept and max(kept) >= max(listed)):
            return super()._rewind(common)
        hit = max(listed)
        latest = self._snapshots[max(self._snapshots)]
        self.target.restore(attrs.evolve(latest, processed=hit))
        self._drop_after(hit)
        return hit


_BLOCK = 4  # the block a BlockCacheWithoutPrefix keys its states by


class BlockCacheWithoutPrefix(SessionEngine):
    """Caches the recurrent state after every block of 4 prompt tokens keyed by the block alone, not its prefix.

    Shipped as: a hidden-state (recurrent-state) block cache whose block hash covers the
    block's own tokens and position but not the chain of blocks before it: the KV of a prompt
    is computed (or paged in) right, but the conv/rec state after a block is served from the
    cache whenever an equal block was seen at that position. A prompt sharing its prefix with
    the one that filled the cache gets the state it would compute anyway; only an equal block
    after a *different* prefix meets another prefix's state.
    """

    bug = "recurrent states cached per 4-token block keyed without the block's prefix"

    def __init__(self, **kwargs: Any) -> None:
        self._blocks: dict[tuple[int, tuple[int, ...]], ReferenceSnapshot] = {}
        super().__init__(**kwargs)

    def reset(self) -> None:
        super().reset()
        self._blocks.clear()

    def _feed(self, tokens: Sequence[int]) -> int:
        """Feed ``tokens`` block by block; after each whole block, its cached state if any (the bug), else
        cache the state it reached; a snapshot at every multiple of ``_CHUNK`` as the control does."""
        forwards = 0
        start = self.target.processed
        fed = [*self._cached[:start], *(int(t) for t in tokens)]
        i = 0
        while i < len(tokens):
            pos = self.target.processed
            stop = min(len(tokens), i + _BLOCK - pos % _BLOCK)
            self.target.forward(list(tokens[i:stop]))
            forwards += 1
            i = stop
            end = self.target.processed
            if end % _BLOCK == 0:
                key = (end, tuple(fed[end - _BLOCK : end]))
                hit = self._blocks.get(key)
                if hit is None:
                    self._blocks[key] = self.target.snapshot()
                else:
                    now = self.target.snapshot()
                    self.target.restore(attrs.evolve(now, conv_state=hit.conv_state, rec_state=hit.rec_state))
            if end % _CHUNK == 0:
                self._snap()
        return forwards


class NeverReusesPrefix(SessionEngine):
    """Advertises prefix reuse, yet re-prefills every prompt from scratch (and says so: ``prefix_reused`` 0).

    Shipped as: a session or prefix cache switched on in the engine's capabilities while
    the hybrid model's path silently bypasses it (a recurrent-state cache the scheduler
    never consults): every answer is right, every multi-turn request pays a full prefill.
    """

    bug = "advertises sessions but never reuses a cached prefix, even when the prompt continues the last context"

    def _rewind(self, common: int) -> int:
        return super()._rewind(0)

    def _position(self, prompt: list[int]) -> tuple[int, int]:
        self.target.reset()
        self._cached = []
        self._snapshots.clear()
        self._taken_in.clear()
        return super()._position(prompt)


class OverclaimsPrefixReuse(SessionEngine):
    """Reports every prompt token but the pending one as served from its caches, whatever it reused.

    Shipped as: a cache-hit counter incremented by the prompt's length on a lookup, not by
    what the lookup matched: the figures engine authors tune their prefix caches by lie.
    """

    bug = "stats.prefix_reused counts the whole prompt, more than any earlier request processed"

    def _reported_reuse(self, reused: int, prompt: list[int]) -> int:
        return len(prompt) - 1


class ContinuationOnlySessionEngine(SessionEngine):
    """Correct: keeps no snapshots, so it reuses its cache only when the prompt continues the last context.

    Any other prompt (a regenerate, an edit) is re-prefilled from scratch: less reuse than the
    control, honestly reported.
    """

    bug = "none (a correct engine that reuses only multi-turn continuations)"

    def _rewind(self, common: int) -> int:
        return super()._rewind(0)


class _CyclingK:
    """A drafter wrapper that asks the wrapped drafter for a different k every round (k, 1, k-1, 2, ...)."""

    def __init__(self, inner: Any, k: int) -> None:
        self.inner = inner
        self.schedule = [v for pair in zip(range(k, 0, -1), range(1, k + 1)) for v in pair] or [0]
        self.calls = 0
        self.name = f"CyclingK({component_name(inner)})"

    def propose(self, context: Sequence[int], k: int) -> Sequence[int]:
        k_round = min(k, self.schedule[self.calls % len(self.schedule)])
        self.calls += 1
        return self.inner.propose(context, k_round)

    def reset(self) -> None:
        self.calls = 0
        reset = getattr(self.inner, "reset", None)
        if callable(reset):
            reset()


class VaryingKSessionEngine(SessionEngine):
    """Correct: a session engine whose draft length changes every round (``k`` is the largest it uses)."""

    bug = "none (a correct engine with a different k every round)"

    def _run(self, session: DecodeSession, max_new_tokens: int, eos_token_id: int | None) -> Generation:
        """Hook: the call on the positioned decode session (an engine taking decode parameters passes them)."""
        return session.generate(max_new_tokens, eos_token_id=eos_token_id)

    def _decoder(self) -> SpecDecoder:
        return SpecDecoder(self.target, _CyclingK(self.drafter, self.k), k=self.k, rollback=self.rollback)  # type: ignore[arg-type]


class GreedyOnlySessionEngine:
    """Correct black box: a ``SessionEngine`` behind ``generate``, ``vocab_size``, ``max_context`` and ``greedy()``.

    No ``target``, ``drafter``, ``k``, ``rollback`` or ``reset``: the suite can judge it
    only by its tokens against its own ``greedy(prompt, max_new_tokens)``, computed on a
    private copy of the model it does not decode on.
    """

    bug = "none (a correct black-box engine exposing only greedy())"

    def __init__(self) -> None:
        self._engine = SessionEngine()
        self._oracle = copy.deepcopy(self._engine.target)
        self.vocab_size: int = self._engine.vocab_size
        self.max_context: int = self._engine.max_context
        self.name = f"specproof.zoo.{type(self).__name__}"

    def __repr__(self) -> str:
        return f"<{self.name}>"

    def generate(self, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None) -> Generation:
        gen = self._engine.generate(prompt, max_new_tokens, eos_token_id=eos_token_id)
        return attrs.evolve(gen, steps=None)

    def greedy(self, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
        return [int(t) for t in greedy_decode(self._oracle, prompt, max_new_tokens).tokens]


# ------------------------------------------------------------------ zero-argument factories (for the lead's registry)


def session_engine() -> SessionEngine:
    """The correct session engine (k=4, checkpoint rollback, an n-gram drafter)."""
    return SessionEngine()


def session_engine_replay() -> SessionEngine:
    """The correct session engine with replay rollback."""
    return SessionEngine(rollback="replay")


def stale_prefix_cache() -> StalePrefixCache:
    return StalePrefixCache()


def snapshot_only_last_call() -> SnapshotOnlyLastCall:
    return SnapshotOnlyLastCall()


def varying_k_session_engine() -> VaryingKSessionEngine:
    return VaryingKSessionEngine()


def greedy_only_session_engine() -> GreedyOnlySessionEngine:
    return GreedyOnlySessionEngine()


def continuation_only_session_engine() -> ContinuationOnlySessionEngine:
    return ContinuationOnlySessionEngine()


def never_reuses_prefix() -> NeverReusesPrefix:
    return NeverReusesPrefix()


def overclaims_prefix_reuse() -> OverclaimsPrefixReuse:
    return OverclaimsPrefixReuse()
