"""Input checks shared by the decoder, the greedy oracle and the CLI."""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral

import numpy as np

from specproof.contract.errors import (
    DrafterContractError,
    EmptyPromptError,
    InvalidSettingError,
    PromptTooLongError,
    TargetContractError,
    TokenRangeError,
)
from specproof.contract.sampling import SamplingParams

__all__ = [
    "component_name",
    "check_draft",
    "draft_sequence_problem",
    "check_logits",
    "check_proposal_rows",
    "check_prompt",
    "check_eos_token",
    "check_sampling_params",
]


def component_name(obj: object) -> str:
    """A short, stable name for a plugged-in component, for error messages."""
    name = getattr(obj, "name", None)
    if isinstance(name, str) and name:
        return name
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _is_int(value: object) -> bool:
    return isinstance(value, Integral) and not isinstance(value, (bool, np.bool_))


def check_prompt(prompt: Sequence[int], *, vocab_size: int, max_context: int) -> list[int]:
    """Return the prompt as a list of ints, or raise naming the bad position."""
    if isinstance(prompt, (str, bytes)):
        raise TokenRangeError(f"prompt must be a sequence of token ids, got {type(prompt).__name__}")
    tokens = list(prompt)
    if not tokens:
        raise EmptyPromptError("prompt is empty: a generation needs at least one token (the pending one)")
    for i, tok in enumerate(tokens):
        if not _is_int(tok) or not 0 <= int(tok) < vocab_size:
            raise TokenRangeError(f"prompt[{i}]={tok!r} is not a token id in [0, {vocab_size})")
    if len(tokens) > max_context:
        raise PromptTooLongError(f"prompt has {len(tokens)} tokens but the target's max_context is {max_context}")
    return [int(t) for t in tokens]


def check_eos_token(eos_token_id: int | None, *, vocab_size: int) -> None:
    """Raise ``TokenRangeError`` unless ``eos_token_id`` is None or a token id in ``[0, vocab_size)``."""
    if eos_token_id is not None and not (
        isinstance(eos_token_id, (int, np.integer)) and 0 <= int(eos_token_id) < vocab_size
    ):
        raise TokenRangeError(f"eos_token_id={eos_token_id!r} is not a token id in [0, {vocab_size})")


def check_sampling_params(sampling: object) -> None:
    """Raise ``InvalidSettingError`` unless ``sampling`` is a ``SamplingParams`` or None (greedy)."""
    if sampling is not None and not isinstance(sampling, SamplingParams):
        raise InvalidSettingError(f"sampling={sampling!r} must be a SamplingParams or None")


def draft_sequence_problem(draft: object) -> str | None:
    """Why ``draft`` is not a sequence of ids a drafter may return, or None.

    The one rule the decoder and the drafter checks share: a list, tuple, 1-D array or other
    sized iterable; never a string, bytes, None or a one-shot generator.
    """
    if isinstance(draft, (str, bytes)) or not hasattr(draft, "__len__") or not hasattr(draft, "__iter__"):
        return f"returned {type(draft).__name__}, not a sequence of token ids"
    if isinstance(draft, np.ndarray) and draft.ndim != 1:
        return f"returned an array of shape {draft.shape}, expected 1-D"
    return None


def check_draft(draft: object, *, k: int, vocab_size: int, drafter: str, round_index: int) -> list[int]:
    """Return the draft as a list of ints, or raise a DrafterContractError naming the breach."""
    where = f"drafter {drafter} in round {round_index}"
    problem = draft_sequence_problem(draft)
    if problem is not None:
        raise DrafterContractError(f"{where} {problem} (drafter.token-range)")
    tokens = list(draft)  # type: ignore[call-overload]
    if len(tokens) > k:
        raise DrafterContractError(
            f"{where} proposed {len(tokens)} tokens but was asked for at most k={k} "
            f"(drafter.max-length): {tokens[: k + 4]}"
        )
    for i, tok in enumerate(tokens):
        if not _is_int(tok) or not 0 <= int(tok) < vocab_size:
            raise DrafterContractError(
                f"{where} proposed draft[{i}]={tok!r}, not a token id in [0, {vocab_size}) (drafter.token-range)"
            )
    return [int(t) for t in tokens]


def check_proposal_rows(q: object, draft: list[int], *, vocab_size: int, drafter: str, round_index: int) -> np.ndarray:
    """A sampling drafter's ``q`` as a float64 array: one distribution row per draft token, each with
    mass on its token; else a DrafterContractError naming the breach (drafter.proposal-distribution)."""
    where = f"drafter {drafter} in round {round_index}"
    arr = np.asarray(q, dtype=np.float64)
    if arr.shape != (len(draft), vocab_size):
        raise DrafterContractError(
            f"{where} returned q of shape {arr.shape} for {len(draft)} draft tokens, expected "
            f"({len(draft)}, {vocab_size}) (drafter.proposal-distribution)"
        )
    if len(draft) == 0:
        return arr
    if not np.isfinite(arr).all() or (arr < 0).any() or not np.allclose(arr.sum(axis=1), 1.0, atol=1e-6):
        raise DrafterContractError(
            f"{where} returned q rows that are not distributions (finite, >= 0, summing to 1; sums "
            f"{np.round(arr.sum(axis=1), 6).tolist()}) (drafter.proposal-distribution)"
        )
    zero = [i for i, t in enumerate(draft) if arr[i, t] <= 0.0]
    if zero:
        i = zero[0]
        raise DrafterContractError(
            f"{where} proposed draft[{i}]={draft[i]} with q[{i}][{draft[i]}] = 0: a token its declared "
            "distribution cannot produce (drafter.proposal-distribution)"
        )
    return arr


def check_logits(logits: object, *, rows: int, vocab_size: int, target: str, round_index: int | None) -> np.ndarray:
    """Return the logits as an array, or raise a TargetContractError (target.shape)."""
    where = f"target {target}" + (f" in round {round_index}" if round_index is not None else " in prefill")
    arr = np.asarray(logits)
    if arr.shape != (rows, vocab_size):
        raise TargetContractError(
            f"{where} returned logits of shape {arr.shape}, expected ({rows}, {vocab_size}) (target.shape)"
        )
    if not np.issubdtype(arr.dtype, np.floating):
        raise TargetContractError(f"{where} returned logits of dtype {arr.dtype}, expected a float dtype")
    if rows and not np.isfinite(arr).all():
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise TargetContractError(
            f"{where} returned a non-finite logit at row {bad[0]}, id {bad[1]}: {arr[bad[0], bad[1]]} (target.shape)"
        )
    return arr
