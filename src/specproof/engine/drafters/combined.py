"""Prompt lookup first, a draft model otherwise: the combination many engines ship."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specproof.contract.sampling import SampledDraft, SamplingParams
from specproof.engine.drafters.model import ModelDrafter
from specproof.engine.drafters.ngram import NgramDrafter

__all__ = ["CombinedDrafter"]


class CombinedDrafter:
    """Prompt lookup when it finds a match, the draft model otherwise, and the model completes short matches.

    - the lookup's draft has ``k`` tokens: propose it (the draft model is not run);
    - it has fewer (the match sits near the end of the context: a run of one byte, the end
      of a copied span): propose it followed by the draft model's continuation of
      ``context + lookup draft``, up to ``k`` tokens;
    - no match: the draft model's draft.

    ``lookup`` defaults to ``NgramDrafter(min_n=3, max_n=4, extend=False)`` (a draft cut at
    the end of the context is completed by the model, not by repeating the match's period): on a byte vocabulary a match
    of one or two tokens is found almost everywhere and says little, so only a match of at
    least three tokens overrides the model. Both parts are pure functions of the context
    (``ModelDrafter`` keeps its model in step by itself, even across calls it was not asked
    to draft), so the combination is too. ``reset()`` resets both.

    Sampling (``propose_sampled``): the lookup's tokens stay deterministic (their ``q`` rows are
    one-hot: given the context, the lookup proposes them with certainty) and the draft model's
    tokens are sampled (``ModelDrafter.propose_sampled``, their ``q`` its processed rows), along
    the same three paths; ``q[i]`` is still what ``tokens[i]`` was drawn from given the context and
    ``tokens[:i]``, so rejection sampling against it is lossless. ``lookup_drafts``,
    ``completed_drafts`` and ``model_drafts`` count which path proposed.
    """

    def __init__(self, model: ModelDrafter, lookup: NgramDrafter | None = None) -> None:
        self.model = model
        self.lookup = lookup if lookup is not None else NgramDrafter(min_n=3, max_n=4, extend=False)
        self.vocab_size = model.vocab_size
        self.name = f"specproof.CombinedDrafter({self.lookup.name}, {model.name})"
        self.lookup_drafts = 0
        self.completed_drafts = 0
        self.model_drafts = 0

    def __repr__(self) -> str:
        return f"CombinedDrafter({self.lookup!r}, {self.model!r})"

    def reset(self) -> None:
        self.lookup.reset()
        self.model.reset()
        self.lookup_drafts = 0
        self.completed_drafts = 0
        self.model_drafts = 0

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        if k <= 0:
            return []
        draft = [int(t) for t in self.lookup.propose(context, k)]
        if len(draft) >= k:
            self.lookup_drafts += 1
            return draft
        if not draft:
            self.model_drafts += 1
            return self.model.propose(context, k)
        self.completed_drafts += 1
        return draft + self.model.propose([*context, *draft], k - len(draft))

    def propose_sampled(
        self, context: Sequence[int], k: int, *, sampling: SamplingParams, rng: np.random.Generator
    ) -> SampledDraft:
        if k <= 0:
            return SampledDraft((), np.zeros((0, self.vocab_size)))
        draft = [int(t) for t in self.lookup.propose(context, k)][:k]
        if not draft:
            self.model_drafts += 1
            return self.model.propose_sampled(context, k, sampling=sampling, rng=rng)
        looked = np.zeros((len(draft), self.vocab_size))
        looked[np.arange(len(draft)), draft] = 1.0
        if len(draft) >= k:
            self.lookup_drafts += 1
            return SampledDraft(tuple(draft), looked)
        self.completed_drafts += 1
        rest = self.model.propose_sampled([*context, *draft], k - len(draft), sampling=sampling, rng=rng)
        return SampledDraft((*draft, *rest.tokens), np.concatenate([looked, rest.q]))
