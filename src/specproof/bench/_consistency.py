"""A baseline's internal consistency: what its JSON Schema cannot say (issue 35: an acceptance baseline
claiming more accepted tokens than attempts was accepted, and gated runs against rates no run can make).

The gate compares a run with the baseline's ``figures``; a hand-edited or corrupted baseline can hold
figures no measurement gives. Refused here, before any measuring, each with the field named:

- a figure of a known name whose ``kind`` or ``better`` is not that name's (a timed figure of kind
  ``machine_independent`` would gate a load-dependent number at the counts' 0.5 %; a ``better`` turned
  around gates the wrong direction), a negative figure (counts and ratios are never negative), an
  acceptance rate above 1;
- in a ``bench --drafter`` baseline's ``acceptance`` counts (``_acceptance``): one count per draft
  position (``k``); accepted tokens at a position no more than its attempts; attempts and accepts never
  rising with the position (a draft that reaches position i + 1 reached i; a round accepts a prefix of
  its draft); each rate its accepts / attempts; a round emits at least one token and at most its
  accepted tokens plus one, and ``tokens_per_round`` is emitted / rounds; the real-context record the
  sum of its texts; and the ``acceptance/...`` figures the ones these counts give, since the gate
  compares the figures while the counts are what they claim to be.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

from specproof.bench._acceptance import ACCEPTANCE_KIND, acceptance_figures

__all__ = ["FIGURE_NAMES", "consistency_problem"]

#: figure name (a key's last part) -> the kinds it can be, and which way is better (the gate's figures take theirs)
FIGURE_NAMES: Final[dict[str, tuple[frozenset[str], str]]] = {
    "tokens_per_round": (frozenset({"machine_independent", ACCEPTANCE_KIND}), "higher"),
    "projected_speedup": (frozenset({"machine_independent"}), "higher"),
    "forwards_per_token": (frozenset({"machine_independent"}), "lower"),
    "speedup": (frozenset({"ratio", "mean_ratio"}), "higher"),
    "efficiency": (frozenset({"ratio", "mean_ratio"}), "higher"),
    "cpu_speedup": (frozenset({"cpu_ratio", "cpu_pooled"}), "higher"),
    "scaling": (frozenset({"ratio"}), "lower"),
}
_POSITION: Final = (frozenset({ACCEPTANCE_KIND}), "higher")
_REL: Final = 1e-9  # a rate or mean written as JSON and read back differs from its counts' quotient by less


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=_REL, abs_tol=_REL)


def consistency_problem(doc: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first inconsistency of a schema-valid baseline: (the field, what is wrong with it); None if none."""
    for key, fig in doc["figures"].items():
        found = _figure_problem(key, fig)
        if found:
            return f"figures.{key}.{found[0]}", found[1]
    acceptance = doc.get("acceptance")
    if acceptance is None:
        return None
    return _acceptance_problem(acceptance) or _figures_match_counts(doc["figures"], acceptance)


def _figure_problem(key: str, fig: Mapping[str, Any]) -> tuple[str, str] | None:
    name = key.rsplit("/", 1)[-1]
    expected = _POSITION if name.startswith("position_") else FIGURE_NAMES.get(name)
    value = float(fig["value"])
    if value < 0:
        return "value", f"is {value!r}: a count or a ratio is never negative"
    if expected is None:  # a figure of a later version: its kind and direction are its own
        return None
    kinds, better = expected
    if fig["kind"] not in kinds:
        return "kind", f"is {fig['kind']!r}, but a {name} figure is of kind {' or '.join(map(repr, sorted(kinds)))}"
    if fig["better"] != better:
        return "better", f"is {fig['better']!r}, but for {name} {better} is better"
    if name.startswith("position_") and value > 1:
        return "value", f"is {value!r}: an acceptance rate is at most 1"
    return None


def _acceptance_problem(record: Mapping[str, Any]) -> tuple[str, str] | None:
    k = int(record["k"])
    for w, entry in enumerate(record["workloads"]):
        where = f"acceptance.workloads[{w}]"
        found = _entry_problem(entry, k, where)
        if found:
            return found
        texts = entry.get("texts") or []
        for t, text in enumerate(texts):
            found = _entry_problem(text, k, f"{where}.texts[{t}]")
            if found:
                return found
        if texts:
            found = _sums_problem(entry, texts, where)
            if found:
                return found
    return None


def _entry_problem(entry: Mapping[str, Any], k: int, where: str) -> tuple[str, str] | None:
    attempts, accepts = entry["attempts_by_position"], entry["accepts_by_position"]
    rates = entry["acceptance_by_position"]
    for name, counts in (("attempts_by_position", attempts), ("accepts_by_position", accepts)):
        if len(counts) != k:
            return f"{where}.{name}", f"has {len(counts)} positions, but the baseline's draft length k is {k}"
    if len(rates) != k:
        return f"{where}.acceptance_by_position", f"has {len(rates)} positions, but the draft length k is {k}"
    for i in range(k):
        if accepts[i] > attempts[i]:
            return (
                f"{where}.accepts_by_position[{i}]",
                f"is {accepts[i]}: more accepted tokens than the {attempts[i]} attempts at draft position {i + 1} "
                f"({where}.attempts_by_position[{i}])",
            )
        expected = accepts[i] / attempts[i] if attempts[i] else 0.0
        if not _same(float(rates[i]), expected):
            return (
                f"{where}.acceptance_by_position[{i}]",
                f"is {rates[i]!r}, but {accepts[i]} accepted of {attempts[i]} attempts is {expected!r}",
            )
    for name, counts, why in (
        ("attempts_by_position", attempts, "a draft that reaches a position reached every one before it"),
        ("accepts_by_position", accepts, "a round accepts a prefix of its draft"),
    ):
        for i in range(1, k):
            if counts[i] > counts[i - 1]:
                return (
                    f"{where}.{name}[{i}]",
                    f"is {counts[i]}, more than the {counts[i - 1]} at draft position {i} ({why})",
                )
    rounds = int(entry["rounds"])
    if attempts and attempts[0] > rounds:
        return f"{where}.attempts_by_position[0]", f"is {attempts[0]}: more attempts than the {rounds} rounds"
    emitted = entry.get("emitted")
    if emitted is not None:
        most = rounds + sum(accepts)
        if not rounds <= emitted <= most:
            return (
                f"{where}.emitted",
                f"is {emitted}, but {rounds} rounds emit one token each plus their {sum(accepts)} accepted "
                f"tokens at most: between {rounds} and {most}",
            )
        expected = emitted / rounds if rounds else 0.0
        if not _same(float(entry["tokens_per_round"]), expected):
            return (
                f"{where}.tokens_per_round",
                f"is {entry['tokens_per_round']!r}, but {emitted} tokens in {rounds} rounds is {expected!r}",
            )
    return None


def _sums_problem(entry: Mapping[str, Any], texts: Sequence[Mapping[str, Any]], where: str) -> tuple[str, str] | None:
    """A pooled record is the sum of its texts' counts."""
    for name in ("rounds", "emitted"):
        if entry.get(name) is None or any(t.get(name) is None for t in texts):
            continue
        total = sum(int(t[name]) for t in texts)
        if int(entry[name]) != total:
            return f"{where}.{name}", f"is {entry[name]}, but its texts' add up to {total}"
    for name in ("attempts_by_position", "accepts_by_position"):
        total_by_position = [sum(int(t[name][i]) for t in texts) for i in range(len(entry[name]))]
        if list(entry[name]) != total_by_position:
            return f"{where}.{name}", f"is {list(entry[name])}, but its texts' add up to {total_by_position}"
    return None


def _figures_match_counts(figures: Mapping[str, Any], record: Mapping[str, Any]) -> tuple[str, str] | None:
    """The ``acceptance/...`` figures are the ones the counts give: the same keys, the same values."""
    derived = acceptance_figures(record)
    stored = {key: fig for key, fig in figures.items() if fig["kind"] == ACCEPTANCE_KIND}
    for key in sorted(set(stored) | set(derived)):
        if key not in derived:
            return f"figures.{key}", "is not one the acceptance counts give (no such workload or measured position)"
        if key not in stored:
            return f"figures.{key}", "is missing: the acceptance counts give it"
        if not _same(float(stored[key]["value"]), derived[key]["value"]):
            return (
                f"figures.{key}.value",
                f"is {stored[key]['value']!r}, but the acceptance counts give {derived[key]['value']!r}",
            )
    return None
