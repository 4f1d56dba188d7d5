"""``check_bundle``: does a saved bundle compute what the model it was exported from computes?

The bundle runs through the ML-program evaluator (``CoreMLEvalTarget``: the program as
written, on any OS); the source is any ``Target`` (``trained``, ``reference:...``,
``family:NAME``, ``hf:/path``, ``mlx:/path``). Three rules, each saying what it exercised:

- ``bundle.logits``: on Hypothesis-drawn token sequences fed in drawn chunkings, every
  position's logits within ``rtol`` x the largest |source logit| of that row;
- ``bundle.states``: after every chunk, and after the last row before a router near-tie (the
  rows fed again, the chunks cut there), each state both sides hold under one name and shape
  (the KV cache cut to the tokens processed; a zero-sized source state has no bundle twin)
  within ``rtol`` x its largest |source value|; no such state: not exercised;
- ``bundle.greedy``: greedy continuations of the golden prompts equal token for token.

**Router near-ties.** An fp16 bundle may order two router logits that the float32 source
separates by a hair the other way: the position then takes other experts, and everything after
it (through the KV cache and the recurrent state) legitimately drifts. When the source reports
its router margins (``last_router_margins``: ``ReferenceHybrid`` with MoE blocks), rows from the
first position whose margin is below ``router_margin`` are not compared (and not counted as
exercised), and the states are compared once more after the last row before it (every row they
hold routed confidently: comparable); a greedy divergence after such a position, or at a top-2 logit margin within
``tie_tolerance``, is excused and counted as such.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import numpy as np

from specproof.contract.errors import InvalidSettingError
from specproof.coreml._export import GOLDEN_PROMPTS
from specproof.engine import row_router_margins
from specproof.engine.targets.coreml_eval import SOURCE_ROUTER_MARGIN, SOURCE_RTOL
from specproof.formats import bundle_check as bundle_check_format

__all__ = ["CHECK_RULES", "BundleCheckReport", "CheckOptions", "CheckResult", "check_bundle"]

#: rule id -> what it compares
CHECK_RULES: Final = {
    "bundle.logits": "every position's logits of drawn sequences in drawn chunkings, within rtol of the source's",
    "bundle.states": "after every chunk, the states both sides hold (same name and shape) within rtol",
    "bundle.greedy": "greedy tokens of the golden prompts equal the source's",
}


def _positive(kind: type, *, allow_zero: bool = False) -> Any:
    def check(instance: Any, attribute: Any, value: Any) -> None:
        number = float(value) if isinstance(value, (int, float)) and isinstance(value, kind) else -1.0
        number = -1.0 if isinstance(value, bool) else number
        if number < 0 or (number == 0 and not allow_zero):
            raise InvalidSettingError(
                f"bundle check: {attribute.name.replace('_', '-')}={value!r} must be a "
                f"{'non-negative' if allow_zero else 'positive'} {kind.__name__}"
            )

    return check


@attrs.frozen(kw_only=True)
class CheckOptions:
    """How hard and how strictly: ``examples`` drawn sequences; ``max_tokens`` per sequence; ``rtol`` of a row's
    (a state's) largest |source value|; ``router_margin`` below which a source router decision excuses the rows
    from there on; ``tie_tolerance`` the top-2 margin that excuses a greedy divergence; ``max_new_tokens`` per
    golden prompt; ``seed`` (None: derandomized)."""

    examples: int = attrs.field(default=50, validator=_positive(int))
    max_tokens: int = attrs.field(default=40, validator=_positive(int))
    rtol: float = attrs.field(default=SOURCE_RTOL, converter=float, validator=_positive(float))
    router_margin: float = attrs.field(
        default=SOURCE_ROUTER_MARGIN, converter=float, validator=_positive(float, allow_zero=True)
    )
    tie_tolerance: float = attrs.field(default=0.125, converter=float, validator=_positive(float, allow_zero=True))
    max_new_tokens: int = attrs.field(default=12, validator=_positive(int))
    seed: int | None = None


@attrs.frozen(kw_only=True)
class CheckResult:
    """One rule: ``status`` pass | fail | inconclusive (nothing exercised), ``exercised`` what it compared."""

    id: str
    status: str
    exercised: int
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "status": self.status, "exercised": self.exercised, "detail": self.detail}


@attrs.frozen(kw_only=True)
class BundleCheckReport:
    path: str
    against: str
    options: CheckOptions
    results: tuple[CheckResult, ...]
    seconds: float

    @property
    def verdict(self) -> str:
        statuses = {r.status for r in self.results}
        return "fail" if "fail" in statuses else "inconclusive" if "inconclusive" in statuses else "pass"

    @property
    def exit_code(self) -> int:
        """0 pass, 1 fail, 3 inconclusive (the project's certify convention)."""
        return {"pass": 0, "fail": 1, "inconclusive": 3}[self.verdict]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": bundle_check_format.ID,
            "path": self.path,
            "against": self.against,
            "verdict": self.verdict,
            "options": attrs.asdict(self.options),
            "results": [r.to_json() for r in self.results],
            "seconds": round(self.seconds, 3),
        }


class _Mismatch(AssertionError):
    def __init__(self, rule: str, detail: str) -> None:
        super().__init__(detail)
        self.rule = rule
        self.size = 0  # tokens in the failing run


def _mapped(bundle: Mapping[str, np.ndarray], source: Mapping[str, np.ndarray]) -> list[str]:
    """The states both sides hold under one name with one shape (zero-sized source states have no twin)."""
    return [n for n, v in source.items() if v.size and n in bundle and np.shape(bundle[n]) == np.shape(v)]


@attrs.define
class _Tally:
    examples: int = 0
    rows: int = 0
    excused_rows: int = 0
    chunks_with_states: int = 0
    states: set[str] = attrs.field(factory=set)
    unmapped: set[str] = attrs.field(factory=set)
    worst: float = 0.0  # the largest row error as a fraction of the row's largest |source logit|
    worst_state: float = 0.0  # the largest state error as a fraction of the state's largest |source value|
    first: _Mismatch | None = None  # the shortest failing run seen (kept even if Hypothesis would lose it)


def _compare_run(
    bundle: Any, source: Any, tokens: Sequence[int], chunks: Sequence[int], opts: CheckOptions, tally: _Tally
) -> _Mismatch | None:
    """Feed ``tokens`` to both in ``chunks``; the first row or state out of tolerance, else None."""
    bundle.reset()
    source.reset()
    pos = 0
    for piece in _pieces(tokens, chunks):
        got = np.asarray(bundle.forward(piece), np.float64)
        want = np.asarray(source.forward(piece), np.float64)
        margins = row_router_margins(source, len(piece))
        where = f"tokens {list(tokens)} in chunks {list(chunks)}"
        for i in range(len(piece)):
            if margins[i] < opts.router_margin:  # this row and everything after may route otherwise in fp16
                tally.excused_rows += len(tokens) - pos - i
                # the state after the rows before it is still comparable: every row it holds routed confidently
                return _replay_states(bundle, source, tokens[: pos + i], chunks, where, opts, tally) if i else None
            scale = float(np.abs(want[i]).max()) or 1.0
            err = float(np.abs(got[i] - want[i]).max())
            tally.worst = max(tally.worst, err / scale)
            if err > opts.rtol * scale:
                return _Mismatch(
                    "bundle.logits",
                    f"position {pos + i}: max |logit difference| {err:.4g} > {opts.rtol} x {scale:.4g} "
                    f"(bundle argmax {int(got[i].argmax())}, source argmax {int(want[i].argmax())}); {where}",
                )
            tally.rows += 1
        pos += len(piece)
        found = _compare_states(bundle, source, pos, where, opts, tally)
        if found is not None:
            return found
    return None


def _replay_states(
    bundle: Any,
    source: Any,
    tokens: Sequence[int],
    chunks: Sequence[int],
    where: str,
    opts: CheckOptions,
    tally: _Tally,
) -> _Mismatch | None:
    """The states after ``tokens`` (the rows before a router near-tie, fed again in the run's chunking cut there):
    a chunk that ends after a near-tie is not compared, so without this a run whose first chunk holds one would
    compare no state."""
    bundle.reset()
    source.reset()
    for piece in _pieces(tokens, chunks):
        bundle.forward(piece)
        source.forward(piece)
    return _compare_states(bundle, source, len(tokens), f"{where}, fed again up to the router near-tie", opts, tally)


def _pieces(tokens: Sequence[int], chunks: Sequence[int]) -> Iterator[list[int]]:
    """``tokens`` cut in ``chunks`` (what is left in one piece once they run out, the last one cut short)."""
    pos, sizes = 0, list(chunks)
    while pos < len(tokens):
        size = sizes.pop(0) if sizes else len(tokens) - pos
        yield list(tokens[pos : pos + size])
        pos += size


def _compare_states(
    bundle: Any, source: Any, pos: int, where: str, opts: CheckOptions, tally: _Tally
) -> _Mismatch | None:
    arrays = getattr(source, "state_arrays", None)
    if not callable(arrays):
        return None
    theirs, ours = arrays(), bundle.state_arrays()
    names = _mapped(ours, theirs)
    tally.unmapped |= {n for n, v in theirs.items() if v.size and n not in names} | (set(ours) - set(names))
    for name in names:
        want, got = np.asarray(theirs[name], np.float64), np.asarray(ours[name], np.float64)
        scale = float(np.abs(want).max()) or 1.0
        err = float(np.abs(got - want).max())
        tally.worst_state = max(tally.worst_state, err / scale)
        if err > opts.rtol * scale:
            return _Mismatch(
                "bundle.states",
                f"{name!r} after {pos} tokens: max |difference| {err:.4g} > {opts.rtol} x {scale:.4g}; {where}",
            )
    if names:
        tally.chunks_with_states += 1
        tally.states |= set(names)
    return None


def _drawn_runs(bundle: Any, source: Any, opts: CheckOptions) -> tuple[_Tally, _Mismatch | None]:
    from hypothesis import HealthCheck, given, seed, settings
    from hypothesis import strategies as st

    from specproof.strategies import no_local_constants

    tally = _Tally()
    vocab = int(source.vocab_size)
    longest = max(1, min(opts.max_tokens, int(bundle.max_context), int(source.max_context)))
    step = max(1, int(bundle.max_query))

    @settings(
        max_examples=opts.examples,
        derandomize=opts.seed is None,
        database=None,
        deadline=None,
        report_multiple_bugs=False,  # one failure, the smallest: what the report shows
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def drawn(data: Any) -> None:
        tokens = data.draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=longest), label="tokens")
        chunks = data.draw(st.lists(st.integers(1, step), min_size=1, max_size=8), label="chunks")
        found = _compare_run(bundle, source, tokens, chunks, opts, tally)
        if found is not None:
            if tally.first is None or len(tokens) <= tally.first.size:
                found.size = len(tokens)
                tally.first = found
            raise found  # one raise site: Hypothesis shrinks one failure
        tally.examples += 1

    run = drawn if opts.seed is None else seed(opts.seed)(drawn)
    try:
        with no_local_constants():  # the same examples in every process, whatever local code it imported
            run()
    except _Mismatch as exc:  # Hypothesis re-raises the smallest failing example's
        return tally, exc
    # a failure Hypothesis did not re-raise (its shrinker moved between two kinds) is still a failure
    return tally, tally.first


def _greedy(bundle: Any, source: Any, opts: CheckOptions) -> CheckResult:
    from specproof.engine import greedy_decode

    vocab = int(source.vocab_size)
    room = min(int(bundle.max_context), int(source.max_context))
    compared = excused = 0
    notes: list[str] = []
    for prompt in GOLDEN_PROMPTS:
        if any(not 0 <= t < vocab for t in prompt) or len(prompt) + opts.max_new_tokens > room:
            notes.append(f"prompt {list(prompt)[:6]}... skipped (outside the vocabulary or the context)")
            continue
        bundle.reset()
        source.reset()
        got = list(greedy_decode(bundle, list(prompt), opts.max_new_tokens, eos_token_id=None).tokens)
        want = list(greedy_decode(source, list(prompt), opts.max_new_tokens, eos_token_id=None).tokens)
        first = next((i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), None)
        if first is None:
            compared += len(want)
            continue
        source.reset()
        row = np.asarray(source.forward([*prompt, *want[:first]]), np.float64)
        top = np.sort(row[-1])[::-1]
        router = float(row_router_margins(source, row.shape[0]).min())
        if top[0] - top[1] <= opts.tie_tolerance or router < opts.router_margin:
            excused += 1
            compared += first
            notes.append(
                f"prompt {list(prompt)[:6]}...: divergence at new token {first} excused (top-2 margin "
                f"{top[0] - top[1]:.4g}, router margin {router:.4g})"
            )
            continue
        return CheckResult(
            id="bundle.greedy",
            status="fail",
            exercised=compared,
            detail=f"prompt {list(prompt)}: new token {first} is {got[first]} on the bundle, {want[first]} on the "
            f"source (source top-2 margin {top[0] - top[1]:.4g} > {opts.tie_tolerance}); bundle {got}, source {want}",
        )
    detail = f"{compared} greedy tokens equal over {len(GOLDEN_PROMPTS)} golden prompts ({excused} excused)"
    return CheckResult(
        id="bundle.greedy",
        status="pass" if compared else "inconclusive",
        exercised=compared,
        detail="; ".join([detail, *notes]) if compared else "no golden token compared: " + "; ".join(notes),
    )


def _load_bundle(path: Path) -> Any:
    from specproof.engine.targets.coreml_eval import CoreMLEvalTarget
    from specproof.engine.targets.mil_eval import UnknownOpError

    if not path.exists():
        raise InvalidSettingError(f"bundle check: {str(path)!r} does not exist")
    try:
        return CoreMLEvalTarget(path)
    except UnknownOpError as exc:
        raise InvalidSettingError(f"bundle check: {exc}") from exc


def check_bundle(
    path: str | Path, source: Any, *, against: str = "", options: CheckOptions | None = None
) -> BundleCheckReport:
    """Compare the bundle at ``path`` (through the evaluator) with ``source``; ``InvalidSettingError`` for a
    bundle that cannot be read or evaluated, or whose vocabulary is not the source's (before any work)."""
    opts = CheckOptions() if options is None else options
    t0 = time.perf_counter()
    bundle = _load_bundle(Path(path))
    if int(bundle.vocab_size) != int(source.vocab_size):
        raise InvalidSettingError(
            f"bundle check: the bundle's vocabulary is {bundle.vocab_size} tokens, the source's "
            f"({against or 'source'}) {source.vocab_size}: not the same model"
        )
    tally, mismatch = _drawn_runs(bundle, source, opts)
    results = []
    if mismatch is not None and mismatch.rule == "bundle.logits":
        results.append(CheckResult(id="bundle.logits", status="fail", exercised=tally.rows, detail=str(mismatch)))
    else:
        results.append(
            CheckResult(
                id="bundle.logits",
                status="pass" if tally.rows else "inconclusive",
                exercised=tally.rows,
                detail=f"{tally.rows} rows of {tally.examples} drawn sequences within rtol {opts.rtol} (largest "
                f"error {tally.worst:.4f} of the row's largest |logit|); {tally.excused_rows} rows after a source "
                f"router margin < {opts.router_margin} not compared",
            )
        )
    if mismatch is not None and mismatch.rule == "bundle.states":
        results.append(CheckResult(id="bundle.states", status="fail", exercised=0, detail=str(mismatch)))
    elif mismatch is not None:
        results.append(
            CheckResult(id="bundle.states", status="inconclusive", exercised=0, detail="not run: the logits differ")
        )
    else:
        unmapped = f"; not mapped: {', '.join(sorted(tally.unmapped))}" if tally.unmapped else ""
        results.append(
            CheckResult(
                id="bundle.states",
                status="pass" if tally.chunks_with_states else "inconclusive",
                exercised=tally.chunks_with_states,
                detail=(
                    f"{', '.join(sorted(tally.states))} equal within rtol {opts.rtol} after "
                    f"{tally.chunks_with_states} chunks{unmapped}"
                )
                if tally.chunks_with_states
                else f"no state both sides hold under one name and shape{unmapped}",
            )
        )
    results.append(_greedy(bundle, source, opts))
    return BundleCheckReport(
        path=str(path), against=against, options=opts, results=tuple(results), seconds=time.perf_counter() - t0
    )
