"""``HFPromptLookupEngine``: transformers' own prompt-lookup decoding as a black-box ``Engine``.

``generate`` calls ``model.generate(input_ids, do_sample=False, prompt_lookup_num_tokens=k,
max_new_tokens=n)`` and returns the new tokens with ``steps=None``: transformers does not report
its rounds, so only the end-to-end invariants (``engine.lossless``, ``engine.stop``) apply. The
``stats`` count what a forward hook sees (tokens fed per forward: drafted = q - 1), so the
certificate can say that speculation happened. The
engine exposes ``vocab_size`` and ``target`` (an ``HFTarget`` over the *same* model object), so
``specproof certify engine --engine specproof.engine.adapters.hf_prompt_lookup:make`` can compare
it with plain greedy decoding of that model.

This is the worked example of certifying a third-party engine: transformers' prompt lookup on
LFM2 has to roll back a conv state (it uses its own cache's past-state recording and ``crop``),
which is exactly what went wrong in earlier releases.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specproof.contract import Generation, Stats, StopReason
from specproof.contract.errors import InvalidSettingError, TokenRangeError
from specproof.contract.validation import int_at_least
from specproof.engine.conventions import check_prompt
from specproof.engine.targets.hf import HFTarget, load_spec, require_hf

__all__ = ["HFPromptLookupEngine", "make"]


class HFPromptLookupEngine:
    """A black-box ``Engine`` over ``model.generate(prompt_lookup_num_tokens=...)``.

    ``HFPromptLookupEngine(target, *, prompt_lookup_num_tokens=4, max_matching_ngram_size=None)``:
    ``target`` is the ``HFTarget`` whose ``.model`` is decoded; it is exposed as ``oracle`` (the
    certifier's greedy oracle: ``model.generate`` keeps its own cache, so it is not a live target).
    """

    def __init__(
        self, target: HFTarget, *, prompt_lookup_num_tokens: int = 4, max_matching_ngram_size: int | None = None
    ) -> None:
        require_hf()
        if not isinstance(target, HFTarget):
            raise InvalidSettingError(f"HFPromptLookupEngine target must be an HFTarget, got {type(target).__name__}")
        self.k = int_at_least(prompt_lookup_num_tokens, name="prompt_lookup_num_tokens", minimum=1)
        self.max_matching_ngram_size = (
            None
            if max_matching_ngram_size is None
            else int_at_least(max_matching_ngram_size, name="max_matching_ngram_size", minimum=1)
        )
        # the engine contract: the model it decodes, exposed as an oracle (model.generate keeps its own
        # cache, so this HFTarget is never the live target)
        self.oracle = target
        self.model: Any = target.model
        self.vocab_size: int = target.vocab_size
        self.max_context: int = target.max_context
        self.name = f"transformers.generate(prompt_lookup_num_tokens={self.k}) on {target.name}"

    def __repr__(self) -> str:
        return f"HFPromptLookupEngine({self.name})"

    def generate(self, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None) -> Generation:
        """Decode with transformers' prompt lookup; ``stop_reason`` from the tokens it returned."""
        torch, _ = require_hf()
        ctx = check_prompt(prompt, vocab_size=self.vocab_size, max_context=self.max_context)
        n = int_at_least(max_new_tokens, name="max_new_tokens", minimum=0)
        if eos_token_id is not None and not (
            isinstance(eos_token_id, int) and not isinstance(eos_token_id, bool) and 0 <= eos_token_id < self.vocab_size
        ):
            raise TokenRangeError(f"eos_token_id={eos_token_id!r} is not a token id in [0, {self.vocab_size})")
        # the greedy oracle can emit until the target has processed max_context tokens
        room = self.max_context + 1 - len(ctx)
        n_eff = min(n, room)
        if n_eff <= 0:
            return Generation(tokens=(), stop_reason="context_full" if n else "max_new_tokens")
        ids = torch.tensor([ctx], dtype=torch.long, device=self.oracle._device)
        kwargs: dict[str, Any] = {
            "do_sample": False,
            "prompt_lookup_num_tokens": self.k,
            "max_new_tokens": n_eff,
            "min_new_tokens": 0,
            "eos_token_id": eos_token_id,
            "pad_token_id": eos_token_id if eos_token_id is not None else 0,
            "attention_mask": torch.ones_like(ids),
        }
        if self.max_matching_ngram_size is not None:
            kwargs["max_matching_ngram_size"] = self.max_matching_ngram_size
        lengths: list[int] = []  # tokens fed per model forward: how speculation is observed from outside
        hook = self.model.register_forward_pre_hook(_count_fed(lengths), with_kwargs=True)
        try:
            with torch.no_grad():
                out = self.model.generate(ids, **kwargs)
        finally:
            hook.remove()
        tokens = [int(t) for t in out[0, len(ctx) :].tolist()]
        stop: StopReason = "max_new_tokens"
        if eos_token_id is not None and eos_token_id in tokens:
            tokens = tokens[: tokens.index(eos_token_id) + 1]
            stop = "eos"
        elif n_eff < n and len(tokens) == n_eff:
            stop = "context_full"
        return Generation(tokens=tokens, stop_reason=stop, stats=_observed_stats(lengths, len(tokens)))


def _count_fed(lengths: list[int]) -> Any:
    """A forward pre-hook that records how many tokens each model forward is fed."""

    def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None:
            lengths.append(int(ids.shape[-1]))

    return hook


def _observed_stats(lengths: list[int], emitted: int) -> Stats:
    """What the forwards transformers made show: the first is the prefill, each later one verifies
    the pending token plus the candidates prompt lookup drafted (``q - 1``). transformers reports no
    rounds, so these are counts seen from outside: rounds and drafted tokens, not acceptances."""
    rounds = lengths[1:]
    return Stats(
        rounds=len(rounds),
        emitted=emitted,
        prefill_forwards=1 if lengths else 0,
        verify_forwards=len(rounds),
        drafted=sum(q - 1 for q in rounds),
    )


def make(spec: str = "lfm2-tiny", *, prompt_lookup_num_tokens: int = 4) -> HFPromptLookupEngine:
    """The engine on ``hf:<spec>`` (default the tiny LFM2).

    The plug-in name is ``specproof.engine.adapters.hf_prompt_lookup:make``.
    """
    return HFPromptLookupEngine(load_spec(spec), prompt_lookup_num_tokens=prompt_lookup_num_tokens)
