"""Batched engines: requests, capabilities, per-step outputs and the ``BatchEngine`` protocol.

docs/contract.md ("Batches") is the reference. The shape is a step-level scheduler, as
vLLM's ``LLMEngine`` (``add_request`` / ``step`` / ``abort_request``) and llama.cpp's server
slots: the suite adds requests, steps the engine one verify round at a time and may add,
cancel or preempt requests between steps. ``run_batch`` is the one-call form on top of it.

A single-request ``Engine`` is untouched by this module: a batched engine is a second
protocol an engine may implement beside it, declared by ``batch_capabilities``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from numbers import Integral
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

import attrs

from specproof.contract._decode_params import DecodeParams
from specproof.contract._records import Generation, Step
from specproof.contract.errors import InvalidSettingError, SpecproofError
from specproof.contract.sampling import SamplingParams

if TYPE_CHECKING:  # pragma: no cover
    from specproof.contract._protocols import Drafter

__all__ = [
    "PREEMPTION_MODES",
    "BatchCapabilities",
    "BatchEngine",
    "BatchRequest",
    "RequestOutput",
    "run_alone",
    "run_batch",
]

PreemptionMode = Literal["snapshot", "recompute"]
PREEMPTION_MODES: tuple[str, ...] = ("snapshot", "recompute")
"""Evict a request's slot and resume it by restoring its saved state, or by re-prefilling its tokens."""


def _token_tuple(values: object) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise InvalidSettingError(f"BatchRequest prompt={values!r} must be a sequence of token ids")
    out = []
    for i, tok in enumerate(values):
        if isinstance(tok, bool) or not isinstance(tok, Integral) or int(tok) < 0:
            raise InvalidSettingError(f"BatchRequest prompt[{i}]={tok!r} is not a token id")
        out.append(int(tok))
    if not out:
        raise InvalidSettingError("BatchRequest prompt is empty: a request needs at least one token")
    return tuple(out)


def _check_request_id(instance: object, attribute: object, value: str) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidSettingError(f"BatchRequest request_id={value!r} must be a non-empty string")


def _check_max_new(instance: object, attribute: object, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, Integral) or int(value) < 0:
        raise InvalidSettingError(f"BatchRequest max_new_tokens={value!r} must be an integer >= 0")


def _check_eos(instance: object, attribute: object, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, Integral) or int(value) < 0):
        raise InvalidSettingError(f"BatchRequest eos_token_id={value!r} must be a token id or None")


def _check_sampling(instance: object, attribute: object, value: SamplingParams | None) -> None:
    if value is not None and not isinstance(value, SamplingParams):
        raise InvalidSettingError(f"BatchRequest sampling={value!r} must be a SamplingParams or None (greedy)")


def _check_decode(instance: object, attribute: object, value: DecodeParams | None) -> None:
    if value is not None and not isinstance(value, DecodeParams):
        raise InvalidSettingError(f"BatchRequest decode={value!r} must be a DecodeParams or None (no processors)")


def _check_drafter(instance: object, attribute: object, value: Drafter | None) -> None:
    if value is not None and not callable(getattr(value, "propose", None)):
        raise InvalidSettingError(f"BatchRequest drafter={value!r} has no propose(context, k) method")


@attrs.frozen(kw_only=True)
class BatchRequest:
    """One request of a batch: everything its solo ``generate`` call would have been given.

    ``sampling``: None is greedy; its ``seed`` is the request's own (None: the engine's entropy).
    ``drafter``: this request's drafter where the suite drafts (None: the engine's own), so
    neighbours can draft differently (nothing, ``k`` tokens, a scripted mix). ``decode``: the request's
    processors and stops (docs/contract.md, "Decode state"), its own state whatever it is batched with.
    """

    request_id: str = attrs.field(validator=_check_request_id)
    prompt: tuple[int, ...] = attrs.field(converter=_token_tuple)
    max_new_tokens: int = attrs.field(validator=_check_max_new)
    eos_token_id: int | None = attrs.field(default=None, validator=_check_eos)
    sampling: SamplingParams | None = attrs.field(default=None, validator=_check_sampling)
    drafter: Drafter | None = attrs.field(default=None, validator=_check_drafter, eq=False)
    decode: DecodeParams | None = attrs.field(default=None, validator=_check_decode)


def _positive(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, Integral) or int(value) < 1:
        raise InvalidSettingError(f"BatchCapabilities {attribute.name}={value!r} must be an integer >= 1")


def _str_tuple(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


def _int_tuple(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def _check_modes(instance: object, attribute: object, value: tuple[str, ...]) -> None:
    unknown = [m for m in value if m not in PREEMPTION_MODES]
    if unknown:
        raise InvalidSettingError(f"BatchCapabilities preemption={value!r}: {unknown} not in {PREEMPTION_MODES}")


@attrs.frozen(kw_only=True)
class BatchCapabilities:
    """What a batched engine declares (docs/contract.md, "Batches").

    ``max_batch``: rows in one verify step; ``slots``: requests holding state at once (a
    request beyond them waits); ``continuous_arrivals``: ``add_request`` between steps joins
    the running batch; ``preemption``: the modes ``preempt`` takes; ``schedulable``: ``step(only=)``
    runs just the named requests; ``per_slot_state``: ``slot_state(request_id)`` reads a running
    request's device state (white-box); ``batch_invariant_seeding``: a seeded request's output is
    the same whatever it is batched with; ``sampling``: its requests may sample (``BatchRequest.sampling``
    at temperature > 0; False: greedy only, and the batch checks that sample skip it, saying so).
    """

    max_batch: int = attrs.field(validator=_positive)
    slots: int = attrs.field(validator=_positive)
    continuous_arrivals: bool = False
    preemption: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple, validator=_check_modes)
    schedulable: bool = False
    per_slot_state: bool = False
    batch_invariant_seeding: bool = False
    sampling: bool = True


@attrs.frozen(kw_only=True)
class RequestOutput:
    """What one ``step`` did for one request: the round's ``step`` record and the tokens it emitted.

    ``finished`` holds the request's whole ``Generation`` (as its solo ``generate`` returns it)
    once it stopped, else None; ``slot`` is the slot it ran in (None where the engine hides it).
    """

    request_id: str
    step: Step | None
    new_tokens: tuple[int, ...] = attrs.field(converter=_int_tuple)
    finished: Generation | None = None
    slot: int | None = None


@runtime_checkable
class BatchEngine(Protocol):
    """A step-level scheduler over many requests (docs/contract.md, "Batches").

    ``add_request`` queues a request (it joins at the next ``step``); ``step(only=None)`` runs one
    verify round for every running request (``only``: just those, where ``schedulable``) and returns
    one ``RequestOutput`` per request it advanced; ``abort_request`` cancels one and frees its slot,
    returning what it had emitted; ``preempt`` evicts one (``mode`` in ``preemption``) and it
    resumes at a later step; ``has_unfinished_requests`` says whether any request is still queued,
    running or preempted.
    """

    batch_capabilities: BatchCapabilities

    def add_request(self, request: BatchRequest) -> None: ...

    def step(self, *, only: Collection[str] | None = None) -> list[RequestOutput]: ...

    def abort_request(self, request_id: str) -> Generation: ...

    def preempt(self, request_id: str, *, mode: PreemptionMode) -> None: ...

    def has_unfinished_requests(self) -> bool: ...


def run_batch(engine: BatchEngine, requests: Sequence[BatchRequest], *, max_steps: int) -> dict[str, Generation]:
    """Add every request, step until none is unfinished and return each request's ``Generation``.

    ``max_steps`` bounds the loop: an engine still unfinished after it raises ``SpecproofError``
    (an engine that never finishes is a liveness failure, not a hang).
    """
    for request in requests:
        engine.add_request(request)
    done: dict[str, Generation] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            if out.finished is not None:
                done[out.request_id] = out.finished
    if engine.has_unfinished_requests():
        raise SpecproofError(f"the batch did not finish within max_steps={max_steps} steps")
    return done


def run_alone(engine: BatchEngine, request: BatchRequest, *, max_steps: int) -> Generation:
    """Run ``request`` by itself on ``engine`` (``step(only=...)``): its solo run, as ``generate`` is.

    An engine that does not finish it within ``max_steps`` steps raises ``SpecproofError``.
    """
    engine.add_request(request)
    for _ in range(max_steps):
        for out in engine.step(only=(request.request_id,)):
            if out.request_id == request.request_id and out.finished is not None:
                return out.finished
    raise SpecproofError(f"request {request.request_id!r} did not finish within max_steps={max_steps} steps")
