"""The speculative decoder: draft, verify, accept, roll back (docs/contract.md, "The decode convention")."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Literal, overload

import attrs
import numpy as np

from specproof.contract import (
    DECODE_FEATURES,
    DecodeParams,
    Drafter,
    Generation,
    Stats,
    Step,
    StopReason,
    Target,
    TokenLogprob,
)
from specproof.contract.errors import (
    DecodeError,
    InvalidSettingError,
    SpecproofError,
    TokenRangeError,
    UnsupportedParameterError,
)
from specproof.contract.sampling import SAMPLING_SCHEMES, SamplingParams
from specproof.contract.validation import int_at_least
from specproof.engine._features import FeatureStore, drafter_feature_layers, forward_features
from specproof.engine._processors import RequestProcessors
from specproof.engine._sampling import match_accept_tokens, rejection_accept_tokens, target_distribution
from specproof.engine.conventions import (
    check_draft,
    check_eos_token,
    check_logits,
    check_prompt,
    check_proposal_rows,
    check_sampling_params,
    component_name,
)

__all__ = [
    "ROLLBACK_STRATEGIES",
    "ContextView",
    "DecodeSession",
    "SpecDecoder",
    "Verdict",
    "greedy_accept",
    "longest_accepted_prefix",
    "sampled_accept",
]

Rollback = Literal["checkpoint", "replay"]
Scheme = Literal["rejection", "match"]
ROLLBACK_STRATEGIES: tuple[str, ...] = ("checkpoint", "replay")


def longest_accepted_prefix(draft: Sequence[int], argmax: Sequence[int]) -> int:
    """``j``: the length of the longest prefix where ``draft[i] == argmax[i]``."""
    j = 0
    while j < len(draft) and draft[j] == argmax[j]:
        j += 1
    return j


@attrs.frozen
class Verdict:
    """What an acceptance rule made of one verify forward.

    ``argmax``: the target's greedy token at each fed position; ``accepted_prefix``: how many draft
    tokens were kept; ``accepted``: those plus the target's own next token; ``emitted``: ``accepted``
    cut to the tokens still wanted and at the first ``eos``; ``keep``: how many fed tokens the target
    must hold after the round (``len(emitted)``).
    """

    argmax: list[int]
    accepted_prefix: int
    accepted: list[int]
    emitted: list[int]

    @property
    def keep(self) -> int:
        return len(self.emitted)


def greedy_accept(draft: Sequence[int], logits: np.ndarray, *, remaining: int, eos: int | None) -> Verdict:
    """The lossless greedy rule: keep the draft's longest prefix that matches the target's argmax."""
    argmax = [int(i) for i in np.argmax(logits, axis=1)]  # first maximum: lowest index wins a tie
    j = longest_accepted_prefix(draft, argmax)
    accepted = [*draft[:j], argmax[j]]
    emitted = accepted[:remaining]
    if eos is not None and eos in emitted:
        emitted = emitted[: emitted.index(eos) + 1]
    return Verdict(argmax=argmax, accepted_prefix=j, accepted=accepted, emitted=emitted)


@attrs.frozen
class _Sampler:
    """One sampled request: its parameters, its own random generator and the acceptance scheme."""

    params: SamplingParams
    rng: np.random.Generator
    scheme: Scheme


def sampled_accept(
    draft: Sequence[int],
    q: np.ndarray,
    logits: np.ndarray,
    sampler: _Sampler,
    *,
    remaining: int,
    eos: int | None,
) -> Verdict:
    """The lossless sampled rules (docs/contract.md, "Sampling"): rejection sampling against the draft's
    ``q`` rows, or sample-and-match; ``argmax`` still records the target's greedy tokens."""
    argmax = [int(i) for i in np.argmax(logits, axis=1)]
    p = np.stack([target_distribution(row, sampler.params) for row in logits])
    if sampler.scheme == "match":
        j, token = match_accept_tokens(draft, p, sampler.rng)
    else:
        j, token = rejection_accept_tokens(draft, q, p, sampler.rng)
    accepted = [*draft[:j], token]
    emitted = accepted[:remaining]
    if eos is not None and eos in emitted:
        emitted = emitted[: emitted.index(eos) + 1]
    return Verdict(argmax=argmax, accepted_prefix=j, accepted=accepted, emitted=emitted)


class ContextView(Sequence[int]):
    """A read-only, zero-copy view of the decoder's context, handed to drafters.

    Copying the context every round would make each round cost O(len(context));
    the view keeps a proposal's cost independent of the context length and stops
    a drafter from mutating the decoder's history.
    """

    __slots__ = ("_tokens",)

    def __init__(self, tokens: list[int]) -> None:
        self._tokens = tokens

    def __len__(self) -> int:
        return len(self._tokens)

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: int | slice) -> int | list[int]:
        return self._tokens[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self._tokens)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ContextView):
            return self._tokens == other._tokens
        if isinstance(other, (list, tuple)):
            return self._tokens == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ContextView(len={len(self._tokens)}, tail={self._tokens[-8:]})"


class _StatsCounter:
    """Mutable counters folded into an immutable ``Stats`` at the end of a call."""

    def __init__(self, k: int) -> None:
        self.rounds = 0
        self.emitted = 0
        self.prefill = 0
        self.verify = 0
        self.replay = 0
        self.drafted = 0
        self.accepted = 0
        self.attempts = [0] * k
        self.accepts = [0] * k

    def count_round(self, drafted: int, accepted: int) -> None:
        """One verify round: ``drafted`` draft tokens, the first ``accepted`` of them kept."""
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        for p in range(drafted):
            self.attempts[p] += 1
            if p < accepted:
                self.accepts[p] += 1

    def freeze(self) -> Stats:
        return Stats(
            rounds=self.rounds,
            emitted=self.emitted,
            prefill_forwards=self.prefill,
            verify_forwards=self.verify,
            replay_forwards=self.replay,
            drafted=self.drafted,
            accepted=self.accepted,
            position_attempts=tuple(self.attempts),
            position_accepts=tuple(self.accepts),
        )


class SpecDecoder:
    """Lossless speculative decoding over any ``Target`` and ``Drafter``, greedy or sampled.

    ``generate(..., sampling=SamplingParams(...))`` samples (docs/contract.md, "Sampling") with
    ``scheme="rejection"`` (accept a draft token with probability ``min(1, p/q)``, else draw from
    the residual; a drafter without ``propose_sampled`` has a one-hot ``q``) or ``"match"`` (the
    target samples every position; a draft token is kept when equal). Each request has its own
    generator, seeded by ``sampling.seed``.

    ``rollback="checkpoint"`` restores the state checkpoint the verify forward
    returned for the last kept position (no extra forward); ``"replay"`` restores a
    snapshot taken before verify and re-feeds the kept tokens (one extra forward,
    only in rounds that reject a draft token).

    ``decode=DecodeParams(...)`` applies the request's logits processors per draft position and its stops
    (docs/contract.md, "Decode state"); ``processor_states`` then holds the committed processor state after
    each round of the last call, and ``Generation.logprobs`` each emitted token's logprob on its processed
    verify row where ``decode.logprobs`` asks.
    """

    decode_features: tuple[str, ...] = DECODE_FEATURES  # docs/contract.md, "Decode state": all of them
    processors_class: type[RequestProcessors] = RequestProcessors

    def __init__(
        self,
        target: Target,
        drafter: Drafter,
        *,
        k: int = 4,
        rollback: Rollback = "checkpoint",
        scheme: Scheme = "rejection",
    ) -> None:
        self.k = int_at_least(k, name="k", minimum=0, where="SpecDecoder")
        if scheme not in SAMPLING_SCHEMES:
            raise InvalidSettingError(f"SpecDecoder scheme={scheme!r} is not one of {SAMPLING_SCHEMES}")
        self.scheme: Scheme = scheme
        if rollback not in ROLLBACK_STRATEGIES:
            raise InvalidSettingError(f"SpecDecoder rollback={rollback!r} is not one of {ROLLBACK_STRATEGIES}")
        if rollback == "checkpoint" and not callable(getattr(target, "forward_with_checkpoints", None)):
            raise InvalidSettingError(
                f"target {component_name(target)} has no forward_with_checkpoints; use rollback='replay'"
            )
        if not callable(getattr(drafter, "propose", None)):
            raise InvalidSettingError(f"drafter {component_name(drafter)} has no propose(context, k) method")
        self.target = target
        self.drafter = drafter
        # a feature drafter (docs/contract.md, "Feature drafters") gets the accepted positions' hidden states
        self.feature_layers = drafter_feature_layers(drafter, target)
        self.rollback: Rollback = rollback
        self.name = f"specproof.SpecDecoder(k={self.k}, rollback={rollback})"
        # docs/contract.md, "Sampling": generate takes sampling=, and one seed gives one output
        self.seeded = True
        self.processor_states: list[dict[str, object]] = []

    def __repr__(self) -> str:
        return (
            f"SpecDecoder(target={component_name(self.target)}, drafter={component_name(self.drafter)}, "
            f"k={self.k}, rollback={self.rollback!r}, scheme={self.scheme!r})"
        )

    def start(self, prompt: Sequence[int]) -> DecodeSession:
        """Reset the target and drafter and prefill ``prompt[:-1]``; returns a session to decode from."""
        return DecodeSession(self, prompt)

    def generate(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        *,
        eos_token_id: int | None = None,
        sampling: SamplingParams | None = None,
        decode: DecodeParams | None = None,
    ) -> Generation:
        session = self.start(prompt)
        gen = session.generate(max_new_tokens, eos_token_id=eos_token_id, sampling=sampling, decode=decode)
        self.processor_states = session.processor_states
        return gen


def _score_prompt(
    processors: RequestProcessors | None, rows: np.ndarray | None, ctx: Sequence[int]
) -> tuple[TokenLogprob, ...] | None:
    """A call's prompt logprobs where its ``DecodeParams`` ask: the prefill's ``rows``, so only on a session's first
    call before any ``extend`` (``rows`` None: an ``UnsupportedParameterError``)."""
    if processors is None or processors.params.prompt_logprobs is None:
        return None
    if rows is None:
        raise UnsupportedParameterError(
            "decode prompt_logprobs is answered on a session's first generate call only, before any extend "
            "(the prompt's rows are the prefill's)"
        )
    return tuple(processors.score_prompt(rows, ctx))


def _generation(
    out: list[int],
    stop: StopReason,
    steps: list[Step],
    stats: Stats,
    processors: RequestProcessors | None,
    logprobs: list[TokenLogprob],
    prompt_logprobs: tuple[TokenLogprob, ...] | None,
) -> Generation:
    """A call's ``Generation``, with the logprobs its ``DecodeParams`` asked for."""
    asked = processors is not None and processors.params.logprobs is not None
    gen = Generation(
        tokens=out, stop_reason=stop, steps=tuple(steps), stats=stats, logprobs=logprobs if asked else None
    )
    return gen if prompt_logprobs is None else attrs.evolve(gen, prompt_logprobs=prompt_logprobs)


class DecodeSession:
    """One conversation: ``ctx`` and a target that has processed all of it but the last token.

    ``generate`` may be called repeatedly, and ``extend`` appends user tokens between
    turns (multi-turn); the decode convention holds between every call.
    """

    # the accepted positions' features when the drafter reads them; None otherwise (and in subclasses
    # that position the target themselves and skip __init__)
    _features: FeatureStore | None = None
    _sampler: _Sampler | None = None  # the current call's sampler; None: greedy
    _processors: RequestProcessors | None = None  # the current call's decode state; None: no DecodeParams
    processor_states: list[dict[str, object]]  # the committed processor state after each round of this call
    _logprobs: list[TokenLogprob]  # this call's emitted tokens' logprobs (when its DecodeParams ask for them)

    def __init__(self, decoder: SpecDecoder, prompt: Sequence[int]) -> None:
        self.decoder = decoder
        target = decoder.target
        self._target_name = component_name(target)
        self._drafter_name = component_name(decoder.drafter)
        self._ctx = check_prompt(prompt, vocab_size=target.vocab_size, max_context=target.max_context)
        self._view = ContextView(self._ctx)
        self._rounds_done = 0
        self._pending_prefill = 0
        self.processor_states = []
        layers = drafter_feature_layers(decoder.drafter, target)  # the drafter may have been swapped since
        self._features = FeatureStore(layers) if layers is not None else None
        target.reset()
        reset = getattr(decoder.drafter, "reset", None)
        # a drafter that learns across calls (history_dependent) keeps its session: reset() would forget it
        if callable(reset) and getattr(decoder.drafter, "history_dependent", False) is not True:
            reset()
        self._prompt_rows: np.ndarray | None = np.zeros((0, target.vocab_size))  # the prefill's rows (prompt logprobs)
        self._feed(self._ctx[:-1], what="prefill")

    @property
    def context(self) -> tuple[int, ...]:
        return tuple(self._ctx)

    def _feed(self, tokens: Sequence[int], *, what: str) -> None:
        if not tokens:
            return
        target = self.decoder.target
        if self._features is not None:
            logits, feats, _ = forward_features(target, tokens, self._features.layers, checkpoints=False, what=what)
            self._features.append(feats, len(tokens))
        else:
            logits = target.forward(list(tokens))
        check_logits(logits, rows=len(tokens), vocab_size=target.vocab_size, target=self._target_name, round_index=None)
        self._prompt_rows = np.asarray(logits, dtype=np.float64) if what == "prefill" else None
        self._pending_prefill += 1
        if target.processed != len(self._ctx) - 1:
            raise SpecproofError(
                f"target {self._target_name} reports processed={target.processed} after {what}, "
                f"expected {len(self._ctx) - 1} (target.processed)"
            )

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens (a user turn) to the context and feed all but the new last one."""
        target = self.decoder.target
        new = list(tokens)
        for i, tok in enumerate(new):
            if isinstance(tok, bool) or not isinstance(tok, (int, np.integer)) or not 0 <= int(tok) < target.vocab_size:
                raise TokenRangeError(f"extend tokens[{i}]={tok!r} is not a token id in [0, {target.vocab_size})")
        if not new:
            return
        if len(self._ctx) + len(new) > target.max_context:
            raise InvalidSettingError(
                f"extending a context of {len(self._ctx)} tokens by {len(new)} passes max_context={target.max_context}"
            )
        to_feed = [self._ctx[-1], *new[:-1]]
        self._ctx.extend(int(t) for t in new)
        self._feed(to_feed, what="extend")

    def generate(
        self,
        max_new_tokens: int,
        *,
        eos_token_id: int | None = None,
        max_rounds: int | None = None,
        sampling: SamplingParams | None = None,
        decode: DecodeParams | None = None,
    ) -> Generation:
        """Decode up to ``max_new_tokens`` more tokens; returns this call's tokens, steps and stats.

        ``max_rounds`` stops after that many rounds (``max_rounds=1`` runs exactly one
        round, as fuzzers that drive rounds one at a time need); the stop reason is
        then ``max_new_tokens``. ``sampling``: sample (a fresh generator seeded by its ``seed``
        for this call); None: greedy. ``decode``: this call's processors and stops.
        """
        check_sampling_params(sampling)
        self._sampler = (
            None
            if sampling is None
            else _Sampler(params=sampling, rng=np.random.default_rng(sampling.seed), scheme=self.decoder.scheme)
        )
        decoder = self.decoder
        target = decoder.target
        max_new_tokens = int_at_least(max_new_tokens, name="max_new_tokens", minimum=0)
        check_eos_token(eos_token_id, vocab_size=target.vocab_size)
        self._processors = decoder.processors_class.for_call(decode, self._ctx, eos_token_id, target.vocab_size)
        self.processor_states = []
        self._logprobs = []
        prompt_logprobs = _score_prompt(self._processors, self.__dict__.pop("_prompt_rows", None), self._ctx)
        counter = _StatsCounter(decoder.k)
        counter.prefill, self._pending_prefill = self._pending_prefill, 0
        out: list[int] = []
        steps: list[Step] = []
        stop: StopReason = "max_new_tokens"
        if max_rounds is not None:
            max_rounds = int_at_least(max_rounds, name="max_rounds", minimum=1)
        while len(out) < max_new_tokens and (max_rounds is None or len(steps) < max_rounds):
            room = target.max_context - target.processed
            if room < 1:
                stop = "context_full"
                break
            remaining = max_new_tokens - len(out)
            k_eff = min(decoder.k, remaining - 1, room - 1)
            try:
                step, emitted = self._round(k_eff, remaining, eos_token_id, counter)
            except DecodeError as err:
                err.partial = self._partial(out, steps, counter)
                raise
            steps.append(step)
            out.extend(emitted)
            if eos_token_id is not None and emitted[-1] == eos_token_id:
                stop = "eos"
                break
            if self._processors is not None and self._processors.finished is not None:
                stop = self._processors.finished
                break
        else:
            stop = "max_new_tokens"
        counter.emitted = len(out)
        return _generation(out, stop, steps, counter.freeze(), self._processors, self._logprobs, prompt_logprobs)

    def _partial(self, out: list[int], steps: list[Step], counter: _StatsCounter) -> Generation:
        counter.emitted = len(out)
        return Generation(tokens=out, stop_reason="error", steps=tuple(steps), stats=counter.freeze())

    def _round(self, k_eff: int, remaining: int, eos: int | None, counter: _StatsCounter) -> tuple[Step, list[int]]:
        """One round: propose, verify, accept, roll back, record (docs/contract.md, "The decode convention")."""
        target = self.decoder.target
        round_index = self._rounds_done
        base = target.processed
        before = target.snapshot()
        try:
            draft, q = self._propose(k_eff, base, round_index)
            fed = [self._ctx[-1], *draft]
            logits, checkpoints, feats = self._verify(fed, round_index)
            counter.verify += 1
            processors = self._processors
            raw = logits
            if processors is not None:  # each row processed with the state advanced through the draft before it
                logits, eos = processors.verify_rows(logits, draft), None
            if self._sampler is None:
                verdict = greedy_accept(draft, logits, remaining=remaining, eos=eos)
            else:
                verdict = sampled_accept(draft, q, logits, self._sampler, remaining=remaining, eos=eos)
            if processors is not None:  # cut at the first stop; commit only what is emitted
                verdict = attrs.evolve(verdict, emitted=processors.settle(verdict.emitted, draft=draft))
                self.processor_states.append(processors.state())
                if processors.params.logprobs is not None:  # scored on the processed rows, cut with the tokens
                    self._logprobs.extend(processors.score(logits, verdict.emitted, raw=raw, q=q))
            feats = self._roll_back(fed, verdict.keep, checkpoints, before, feats, round_index, counter)
            if feats is not None and self._features is not None:
                self._features.append(feats, verdict.keep)  # the kept positions only, never a rejected one
            if target.processed != base + verdict.keep:
                raise SpecproofError(
                    f"target {self._target_name} reports processed={target.processed} after round {round_index}, "
                    f"expected {base + verdict.keep} (target.processed)"
                )
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise self._abort(exc, base, before, round_index) from exc
        return self._record(base, draft, verdict, counter), verdict.emitted

    def _propose(self, k_eff: int, base: int, round_index: int) -> tuple[list[int], np.ndarray]:
        """The drafter's checked proposal of at most ``k_eff`` tokens (none when ``k_eff`` is 0) and its
        ``q`` rows (one-hot for a deterministic drafter or a greedy call)."""
        vocab = self.decoder.target.vocab_size
        if k_eff <= 0:
            return [], np.zeros((0, vocab))
        decoder = self.decoder
        store = self._features
        kwargs: dict[str, object] = {}
        if store is not None:
            if len(store) != base:
                raise SpecproofError(
                    f"the engine holds {len(store)} feature rows for {base} processed positions "
                    f"in round {round_index} (engine.features)"
                )
            kwargs["features"] = store.view()
        sampler = self._sampler
        sampled = getattr(decoder.drafter, "propose_sampled", None)
        q: np.ndarray | None = None
        if sampler is not None and callable(sampled):
            proposal = sampled(self._view, k_eff, sampling=sampler.params, rng=sampler.rng, **kwargs)
            raw, q = proposal.tokens, proposal.q
        else:
            raw = decoder.drafter.propose(self._view, k_eff, **kwargs)
        draft = check_draft(raw, k=k_eff, vocab_size=vocab, drafter=self._drafter_name, round_index=round_index)
        if q is None:
            q = np.zeros((len(draft), vocab))
            q[np.arange(len(draft)), draft] = 1.0
        else:
            q = check_proposal_rows(q, draft, vocab_size=vocab, drafter=self._drafter_name, round_index=round_index)
        return draft, q

    def _verify(
        self, fed: list[int], round_index: int
    ) -> tuple[np.ndarray, list[object] | None, dict[int, np.ndarray] | None]:
        """One target forward over ``fed``: checked logits, the checkpoints (checkpoint rollback) and the
        features (feature drafters)."""
        decoder = self.decoder
        target = decoder.target
        store = self._features
        checkpoints: list[object] | None = None
        feats: dict[int, np.ndarray] | None = None
        if store is not None:
            logits, feats, checkpoints = forward_features(
                target, fed, store.layers, checkpoints=decoder.rollback == "checkpoint", what=f"round {round_index}"
            )
            if decoder.rollback == "checkpoint" and (checkpoints is None or len(checkpoints) != len(fed)):
                raise SpecproofError(
                    f"target {self._target_name} returned {0 if checkpoints is None else len(checkpoints)} "
                    f"checkpoints for a forward of {len(fed)} tokens in round {round_index} (target.checkpoints)"
                )
        elif decoder.rollback == "checkpoint":
            logits, checkpoints = target.forward_with_checkpoints(fed)  # type: ignore[attr-defined]
            if len(checkpoints) != len(fed):
                raise SpecproofError(
                    f"target {self._target_name} returned {len(checkpoints)} checkpoints for a forward of "
                    f"{len(fed)} tokens in round {round_index} (target.checkpoints)"
                )
        else:
            logits = target.forward(fed)
        logits = check_logits(
            logits, rows=len(fed), vocab_size=target.vocab_size, target=self._target_name, round_index=round_index
        )
        return logits, checkpoints, feats

    def _roll_back(
        self,
        fed: list[int],
        keep: int,
        checkpoints: list[object] | None,
        before: object,
        feats: dict[int, np.ndarray] | None,
        round_index: int,
        counter: _StatsCounter,
    ) -> dict[int, np.ndarray] | None:
        """Bring the target back to ``keep`` tokens of ``fed`` when a draft token was rejected; returns the
        kept positions' features (recomputed by the replay forward when there is one)."""
        if keep >= len(fed):
            return feats
        target = self.decoder.target
        store = self._features
        if checkpoints is not None:
            target.restore(checkpoints[keep - 1])
            return feats
        target.restore(before)
        if store is not None:  # the replay forward recomputes the kept positions' features
            _, feats, _ = forward_features(
                target, fed[:keep], store.layers, checkpoints=False, what=f"round {round_index} replay"
            )
        else:
            target.forward(fed[:keep])
        counter.replay += 1
        return feats

    def _abort(self, exc: BaseException, base: int, before: object, round_index: int) -> DecodeError:
        """The ``DecodeError`` for a failed round, after putting the target (and features) back as before it."""
        store = self._features
        if store is not None and len(store) > base:
            store.truncate(base)
        try:
            self.decoder.target.restore(before)
            restored = "the target was restored to its state before the round"
        except Exception as restore_exc:  # the target is broken beyond repair: say so
            restored = f"restoring the target failed too ({restore_exc!r}); its state is undefined"
        return DecodeError(
            f"round {round_index} failed: {exc} ({type(exc).__name__}); {restored}",
            partial=Generation(tokens=(), stop_reason="error"),
            round_index=round_index,
        )

    def _record(self, base: int, draft: list[int], verdict: Verdict, counter: _StatsCounter) -> Step:
        """Count the round, extend the context by what it emitted and return its ``Step``."""
        counter.count_round(len(draft), verdict.accepted_prefix)
        self._ctx.extend(verdict.emitted)
        self._rounds_done += 1
        return Step(
            base=base,
            draft=draft,
            argmax=verdict.argmax,
            accepted=verdict.accepted,
            processed=self.decoder.target.processed,
        )
