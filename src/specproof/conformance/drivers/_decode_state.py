"""The ``decode-state`` driver: each decode-state invariant's Hypothesis search over requests with
``DecodeParams`` (docs/contract.md, "Decode state").

It runs only with ``--decode-state`` (a plan's ``decode_state``), and applies to the built-in stack
(``SpecDecoder`` honours every ``DECODE_FEATURES`` entry) and to a plug-in engine that declares
``decode_features``; an engine that declares none is skipped, saying why,
so every engine certifiable before stays certifiable unchanged. Each example is one request drawn by
the invariant's ``draw`` and judged against plain decoding with the same parameters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import hypothesis
from hypothesis import strategies as st

from specproof.conformance._records import Capabilities
from specproof.conformance._sampled_runs import engine_samples
from specproof.conformance.checks.decode_grammar import usable as grammar_vocabulary
from specproof.conformance.checks.decode_state import PROCESSOR_FEATURES, DecodeSubject
from specproof.conformance.drivers._protocol import CheckItem, Driver, NotApplicable, require
from specproof.contract import DECODE_FEATURES, ViolationError
from specproof.engine import NgramDrafter, SpecDecoder

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._results import CheckResult
    from specproof.conformance._subjects import EngineCase

__all__ = ["DecodeStateDriver", "decode_capabilities"]

_UNDECLARED = (
    "the engine declares no decode_features, so its decode-time parameters are not judged "
    "(docs/contract.md, Decode state)"
)


def decode_capabilities(
    features: frozenset[str],
    *,
    reports_states: bool,
    writes_grammars: bool = True,
    declared: bool = True,
    seeded: bool = False,
) -> Capabilities:
    """What an engine declaring ``features`` (and reporting ``processor_states`` or not) lets the checks judge;
    ``writes_grammars``: its vocabulary can write the grammar check's grammars; an engine that declares no
    ``decode_features`` (``declared=False``) is judged on parameter parity only."""
    present = {
        "decode_grammar": "grammar" in features and writes_grammars,
        "decode_state": True,
        "decode_processors": bool(features & PROCESSOR_FEATURES),
        "decode_min_tokens": "min_tokens" in features,
        "decode_stops": "stop_sequences" in features,
        "decode_logprobs": "logprobs" in features,
        "decode_stop_strings": "stop_strings" in features,
        "decode_prompt_logprobs": "prompt_logprobs" in features,
        "processor_state": reports_states,
        "decode_sampled": seeded,
    }
    why_not = {
        "decode_processors": "the engine declares none of penalties, logit_bias, bad_words in decode_features",
        "decode_min_tokens": "the engine does not declare min_tokens in decode_features",
        "decode_stops": "the engine does not declare stop_sequences in decode_features",
        "decode_logprobs": "the engine does not declare logprobs in decode_features",
        "decode_stop_strings": "the engine does not declare stop_strings in decode_features",
        "decode_prompt_logprobs": "the engine does not declare prompt_logprobs in decode_features (it returns no "
        "prompt logprobs)",
        "processor_state": "the engine reports no processor_states (its processors' state per round)",
        "decode_sampled": "the engine does not declare seeded sampling (`seeded = True`, generate(..., sampling=))",
        "decode_grammar": "the engine does not declare grammar in decode_features"
        if "grammar" not in features
        else "the vocabulary cannot write the grammar check's grammars (docs/contract.md, Decode state)",
    }
    return Capabilities(
        has={name for name, on in present.items() if on},
        why_not=why_not if declared else dict.fromkeys(why_not, _UNDECLARED),
    )


class DecodeStateDriver(Driver):
    """Requests with decode parameters on each engine case that declares them."""

    name = "decode-state"
    options = ("decode_state",)

    def run(self, item: CheckItem, result: CheckResult) -> None:
        inv, case = item.invariant, item.engine
        assert case is not None and inv.draw is not None
        subject, caps = self._subject(case)
        require(inv, caps)
        notes: list[str] = []
        profile = self.plan.profile

        @hypothesis.given(data=st.data())
        def search(data: st.DataObject) -> None:
            result.examples += 1
            outcome = inv.check(subject, inv.draw(data, subject, profile))  # type: ignore[misc]
            result.exercised += outcome.exercised
            if outcome.note and not outcome.exercised:
                notes.append(outcome.note)
            if outcome.violations:
                raise ViolationError(outcome.violations)

        self.context.replay.settings(search, max_examples=profile.max_examples, item=item)()
        if not result.exercised:
            result.skip(notes[0] if notes else "no request reached this check")

    def _subject(self, case: EngineCase) -> tuple[DecodeSubject, Capabilities]:
        """The case as a decode-state subject with its capabilities (``NotApplicable`` saying why it is not one)."""
        profile = self.plan.profile
        if case.kind == "builtin":
            target = self.plan.suite.target
            if target is None:
                raise NotApplicable("no target to run the built-in decoder on")
            k, rollback = case.k or 4, case.rollback or "checkpoint"

            def make_builtin() -> Any:
                return SpecDecoder(target.make(), NgramDrafter(), k=k, rollback=rollback)  # type: ignore[arg-type]

            make_engine, make_reference, takes = make_builtin, target.make, True
            declared: object = SpecDecoder.decode_features
            states, seeded = True, True
        else:
            declared = getattr(case.engine, "decode_features", None)
            if case.make_reference is None:
                no_model = "the engine exposes no model (`oracle`, `target`) to decode plainly with"
                raise NotApplicable(_UNDECLARED if declared is None else no_model)
            make_engine = case.make_engine or (lambda: case.engine)
            make_reference, takes, k = case.make_reference, case.takes_drafter, case.k or 4
            states = hasattr(case.engine, "processor_states")
            seeded = engine_samples(case.engine) == (True, True)  # the sampling driver's one definition
        if declared is None:  # judged on parameter parity only: does it honour or refuse what it is sent?
            declared, states = (), False
        if not isinstance(declared, (tuple, list, frozenset, set)) or not all(isinstance(f, str) for f in declared):
            raise NotApplicable(f"decode_features={declared!r} must be a tuple of names from {DECODE_FEATURES}")
        features = frozenset(str(f) for f in declared)
        unknown = sorted(features - set(DECODE_FEATURES))
        if unknown:
            raise NotApplicable(f"decode_features names {unknown}, not among {DECODE_FEATURES}")
        subject = DecodeSubject(
            make_engine=make_engine,
            make_reference=make_reference,
            vocab_size=case.vocab_size,
            k=k,
            features=features,
            takes_drafter=takes,
            max_prompt=profile.max_prompt,
            max_new_tokens=profile.max_new_tokens,
        )
        caps = decode_capabilities(
            features,
            reports_states=states,
            writes_grammars=grammar_vocabulary(case.vocab_size),
            declared=bool(features),
            seeded=seeded,
        )
        return subject, caps
