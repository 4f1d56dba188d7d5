"""What every driver hands the registry: a capabilities record and a run record.

``Capabilities`` is what a subject exposes (docs/contract.md, "capabilities"): each
invariant's ``needs`` is judged against it, the same way for every driver (the
engine-case search, ``check_trace``, the wire client, the state machines).
``RunRecord`` is one generation as the engine-invariant checks see it: the
``Generation`` and the settings it ran under, the lossless verdict against the
driver's oracle and the state comparisons the driver made. Neither names an
invariant: ids live in the registry only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from specproof.contract import Generation
from specproof.contract.lossless import LosslessVerdict

__all__ = ["CAPABILITIES", "Capabilities", "Proposal", "RunRecord"]

CAPABILITIES: dict[str, str] = {
    "steps": "the engine returns per-round `Step` records",
    "stats": "the engine returns `Stats` (the `stats` of its `Generation`)",
    "rollback": "the engine says its rollback strategy (`checkpoint` / `replay`)",
    "oracle": "plain greedy can be computed: a model (`oracle`, a pristine target), `greedy()`, or golden tokens",
    "target": "the live target's state can be read (`state_arrays()`) or probed with a forward",
    "builtin": "the subject is the built-in `SpecDecoder` on a target (the rollback machine drives it)",
    "suite_drafts": "the suite drives the engine's drafts (a settable `drafter`; over the wire `suite_drafts`)",
    "sessions": "one engine instance serves many requests (a plug-in engine; `SpecDecoder` keeps nothing)",
    "forward_with_checkpoints": "the target exposes `forward_with_checkpoints`",
    "source": "the model the target was converted from is given (`certify target --oracle SPEC`, or the "
    "target's `source_spec`)",
    "forward_with_features": "a model that gives the target's features (`forward_with_features`) to judge them by",
    "drafter": "the engine drafts with a feature drafter the suite can watch (its own, or the suite's installed one)",
    "feature_layers": "the drafter declares `feature_layers` (a feature drafter)",
    "feature_target_spec": "the feature drafter names the target whose features it reads (`feature_target_spec`)",
    "batched": "the engine batches: it declares `batch_capabilities` (a `BatchEngine`), or is the built-in stack",
    "batch_sampling": "the batched engine's requests may sample (`batch_capabilities.sampling`)",
    "tree": "the engine verifies token trees (`forward_tree` on the target), or is the built-in stack on the "
    "reference hybrid",
    "tree_drafter": "the drafter proposes token trees (`propose_tree(context, *, max_nodes, max_depth)`)",
    "tree_state": "a tree engine exposes its tree target (`tree_target()`), whose per-node state can be compared "
    "with a model",
    "per_slot_state": "a batched engine's slot state can be read (`slot_state(id)`) and compared with a model",
    "decode_state": "decode-time parameters were asked for (`--decode-state`) and the engine exposes a model to "
    "decode plainly with; it declares `decode_features` and takes `generate(..., decode=DecodeParams)`, or it is "
    "judged on parameter parity only",
    "processor_state": "the engine reports `processor_states`: its processors' state after each round of a call",
    "decode_processors": "the engine declares a logits processor (`penalties`, `logit_bias` or `bad_words`)",
    "decode_min_tokens": "the engine declares `min_tokens` among its `decode_features`",
    "decode_stops": "the engine declares `stop_sequences` among its `decode_features`",
    "decode_grammar": "the engine declares `grammar` among its `decode_features` and its vocabulary can write the "
    "grammar check's grammars",
    "decode_logprobs": "the engine declares `logprobs` among its `decode_features` (`Generation.logprobs`)",
    "decode_stop_strings": "the engine declares `stop_strings` among its `decode_features` (byte vocabularies)",
    "decode_prompt_logprobs": "the engine declares `prompt_logprobs` among its `decode_features` "
    "(`Generation.prompt_logprobs`)",
    "decode_sampled": "the engine samples, seeded (`seeded = True`, `generate(..., sampling=SamplingParams)`), "
    "with its decode parameters",
    "batch_decode": "a batched engine takes `decode` on its batch requests (`batch_decode_features`), with a model "
    "to decode plainly with",
    "batch_grammar": "a batched engine takes a `grammar` in its batch requests' `decode` (`batch_decode_features`), "
    "with a model to decode plainly with and a vocabulary that can write the grammar check's grammars",
}
"""Every capability name an invariant may need, with what it means (docs/contract.md, "capabilities")."""


def _names(values: Iterable[str]) -> frozenset[str]:
    out = frozenset(values)
    unknown = sorted(out - set(CAPABILITIES))
    if unknown:
        raise ValueError(f"unknown capabilities {unknown}; known: {sorted(CAPABILITIES)}")
    return out


@attrs.frozen(kw_only=True)
class Capabilities:
    """What one subject exposes; ``why_not`` says, per missing capability, why it is missing."""

    has: frozenset[str] = attrs.field(converter=_names)
    why_not: Mapping[str, str] = attrs.field(factory=dict)

    def lacks(self, needs: Iterable[str]) -> str | None:
        """None when every need is met, else the reason the first unmet one is missing."""
        for need in needs:
            if need not in self.has:
                return self.why_not.get(need) or f"not applicable: the subject lacks {need} ({CAPABILITIES[need]})"
        return None

    def with_(self, **present: bool | str) -> Capabilities:
        """A copy with capabilities set: ``True`` adds one, a string removes it giving the reason."""
        has, why = set(self.has), dict(self.why_not)
        for name, value in present.items():
            if value is True:
                has.add(name)
                why.pop(name, None)
            else:
                has.discard(name)
                why[name] = str(value) if value else why.get(name, "")
        return Capabilities(has=has, why_not=why)


@attrs.frozen(kw_only=True)
class Proposal:
    """One draft the suite handed an engine: the context length and k asked for, and the answer."""

    context_length: int
    k: int
    draft: tuple[object, ...]
    hostile: bool = False  # deliberately longer than k or out of range (the hostile-drafter rule)


def _ints(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


@attrs.frozen(kw_only=True)
class RunRecord:
    """One generation and what its driver observed, as the engine-invariant checks read it.

    ``k`` bounds every draft (the engine's k, or the longest draft seen when it has none);
    ``final_processed`` is the live target's KV length after the call (None: no live
    target); ``lossless`` the verdict against the oracle (None: no oracle); ``state`` the
    breaches of the state comparisons as violation fields (None: no comparison could be
    made) and ``state_checks`` how many comparisons were made; ``features`` and
    ``feature_checks`` the same for the features handed to a feature drafter.
    """

    generation: Generation
    prompt: tuple[int, ...] = attrs.field(converter=_ints)
    k: int
    max_new_tokens: int
    eos: int | None
    max_context: int | None = None
    rollback: str | None = None
    final_processed: int | None = None
    lossless: LosslessVerdict | None = None
    state: tuple[dict[str, Any], ...] | None = None
    state_checks: int = 0
    features: tuple[dict[str, Any], ...] | None = None
    feature_checks: int = 0
    proposals: tuple[Proposal, ...] | None = None  # the suite's drafts, when its drafter drove the run
    vocab_size: int | None = None
    capabilities: Capabilities
