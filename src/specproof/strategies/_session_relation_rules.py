"""``RelationRules``: ``SessionMachine``'s ``relate`` rule and its coverage of request relations.

Each request's relation to the one before (``_request_relations``: the same prompt, an extension,
an early or late edit, an equal block after a different prefix, ... and those right after ``reset()``)
is counted in ``observed``; ``relate`` draws a request with a relation this example has not reached
yet, and ``toured()`` is the machine whose every example starts with a tour of them all.
"""

from __future__ import annotations

from typing import Any, ClassVar, Self

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from specproof.strategies._contexts import contexts
from specproof.strategies._request_relations import DESCRIPTIONS, RELATIONS, RESET_TAGS, SESSION_KIND, SHARED_BLOCK
from specproof.strategies._session_requests import (
    _CAN_RESET,
    _EXAMPLES,
    RELATION_TAG,
    SessionRequests,
    _count_of,
    _draw_turn,
)

# the order a tour reaches the relations in: an equal block after a different prefix first (right after the
# first request, whose whole prompt the engine prefilled: where block caches take their states), shortening last
_TOUR = (
    "shared_block",
    "continuation",
    "same",
    "extension",
    "edit_late",
    "edit_early",
    "shorter",
    "unrelated",
    "same_after_reset",
    "continuation_after_reset",
)


class RelationRules(SessionRequests):
    """The ``relate`` rule and the bookkeeping of which relations a run reached (``SessionMachine``'s base)."""

    #: every example starts with a tour of the relations (``toured()``)
    force_tour: ClassVar[bool] = False

    @classmethod
    def toured(cls) -> type[Self]:
        """This machine with a tour of every relation at the start of every example (sharing ``observed``):
        run for one example where a run left a relation unreached. It carries its own copy of the
        configuration (made before the run: ``release_machine`` drops the run's when it is over)."""
        own = {"_session_config": cls._session_config, "_config_names": ("_session_config",)}
        return type(f"{cls.__name__}Toured", (cls,), {"force_tour": True, **own})

    @staticmethod
    def applicable_relations(can_reset: bool) -> tuple[str, ...]:
        """The relations a run must reach: every one, and those after ``reset()`` where the engine has one."""
        return (*RELATIONS, *(RESET_TAGS if can_reset else ()))

    @classmethod
    def relations_reached(cls) -> dict[str, int]:
        """The requests of this run by relation to the one before, every applicable relation listed (0 = never
        reached); empty when no example ran."""
        if not cls.observed[_EXAMPLES]:
            return {}
        return {
            tag: cls.observed[RELATION_TAG + tag] for tag in cls.applicable_relations(bool(cls.observed[_CAN_RESET]))
        }

    def _missing(self) -> list[str]:
        """The relations (and after-reset ones) this example has not reached yet, in tour order.

        Per example, never per run: what an example draws must not depend on the examples before it
        (Hypothesis replays an example and expects the same draws)."""
        seen = self.relations.counts
        wanted = set(self.applicable_relations(self.runner.can_reset))
        return [tag for tag in _TOUR if tag in wanted and not seen[tag]]

    def _related_prompt(self, data: Any, relation: str) -> list[int] | None:
        """A prompt with ``relation`` to the last request (its prompt, and its context: prompt + output),
        within the prompt limit; None where the last request leaves no room for it."""
        cfg, limit = self.cfg, self.prompt_limit
        prompt, ctx = self.last_prompt, self.contexts[-1]
        g, output = len(prompt), ctx[len(prompt) :]
        relation = relation.removesuffix("_after_reset")
        vocab = cfg.vocab_size
        if relation == "same":
            return list(prompt)
        if relation == "extension" and output and g < limit:
            m = data.draw(st.integers(1, min(len(output), limit - g)), label="generated tokens kept")
            return [*prompt, *output[:m]]
        if relation == "continuation" and len(ctx) < limit:
            return [*ctx, *_draw_turn(data, cfg, room=limit - len(ctx))]
        if relation in ("edit_early", "edit_late") and g >= (3 if relation == "edit_early" else 2):
            lo, hi = (1, (g - 1) // 2) if relation == "edit_early" else ((g + 1) // 2, min(g - 1, limit - 1))
            if lo > hi:
                return None
            cut = data.draw(st.integers(lo, hi), label="edit point")
            suffix = _draw_turn(data, cfg, room=min(3, limit - cut))
            suffix[0] = (prompt[cut] + 1) % vocab if suffix[0] == prompt[cut] else suffix[0]
            return [*prompt[:cut], *suffix]
        if relation == "shorter" and g >= 2:
            return list(prompt[: data.draw(st.integers(1, g - 1), label="prefix length")])
        if relation == "shared_block" and min(len(ctx), limit) >= SHARED_BLOCK + 1:
            # the block from the prompt (what the engine prefilled) where it holds two, else from the whole context
            end = min(g if g >= 2 * SHARED_BLOCK + 1 else len(ctx), limit)
            # most often a prefix of whole blocks, so the shared block is aligned as block caches key theirs
            aligned = list(range(SHARED_BLOCK, end - SHARED_BLOCK + 1, SHARED_BLOCK))
            if aligned and data.draw(st.sampled_from((True, True, False)), label="block-aligned shared block"):
                split = data.draw(st.sampled_from(aligned), label="different prefix length")
            else:
                split = data.draw(st.integers(1, end - SHARED_BLOCK), label="different prefix length")
            head = [(t + 1 + data.draw(st.integers(0, vocab - 2), label="token shift")) % vocab for t in ctx[:1]]
            head += [(t + 1) % vocab for t in ctx[1:split]]
            return [*head, *ctx[split:end]]
        if relation == "unrelated":
            fresh, _ = self._fresh_prompt(data)
            return fresh if fresh[0] != ctx[0] else [(fresh[0] + 1) % vocab, *fresh[1:]]
        return None

    def _long_prompt(self, data: Any) -> None:
        """A new prompt of at least two blocks and a token (where the limits allow), sharing no first token."""
        cfg = self.cfg
        top = min(cfg.max_prompt, self.prompt_limit)
        low = 2 * SHARED_BLOCK + 2
        if top < low:
            return
        prompt = data.draw(
            contexts(cfg.vocab_size, min_size=low, max_size=top, kinds=cfg.context_kinds), label="prompt"
        )
        prompt = [int(t) for t in prompt]
        if prompt[0] == self.contexts[-1][0]:
            prompt[0] = (prompt[0] + 1) % cfg.vocab_size
        self._request(data, "new_prompt", prompt, f"a new prompt of {_count_of(len(prompt), 'token')} (whole blocks)")

    def _relate(self, data: Any, relation: str) -> None:
        """A request whose relation to the last one is ``relation`` (after ``reset()`` for the after-reset ones);
        nothing where the last request leaves no room for it."""
        after_reset = relation.endswith("_after_reset")
        if after_reset and not self.runner.can_reset:
            return
        if relation == "shared_block" and len(self.last_prompt) < 2 * SHARED_BLOCK + 1:
            self._long_prompt(data)  # a prompt the engine prefills whole blocks of, to share one with
        prompt = self._related_prompt(data, relation)
        if prompt is None:
            return
        if after_reset:
            self._reset()
        base = relation.removesuffix("_after_reset")
        self._count(f"relate:{relation}")
        note = DESCRIPTIONS[relation] + f" ({_count_of(len(prompt), 'token')})"
        self._request(data, SESSION_KIND[base], prompt, note)

    @precondition(lambda self: "relate" not in self.disabled)
    @rule(data=st.data())
    def relate(self, data: Any) -> None:
        """A request with a drawn relation to the last one: one this example has not reached yet, while there is one."""
        missing = self._missing()
        pool = missing or [
            r for r in self.applicable_relations(self.runner.can_reset) if r not in ("fresh", "after_reset")
        ]
        self._relate(data, data.draw(st.sampled_from(pool), label="relation to the last request"))
