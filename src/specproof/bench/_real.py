"""Acceptance on real contexts: drafters judged on held-out text, not on the target's own loops.

Free-running decoding measures a drafter on the target's greedy continuation of a prompt;
on a small target that continuation loops, and any drafter predicts a loop. Here the
context is *real text* (teacher forcing): at many positions ``p`` of files the target
never saw, the target's greedy continuation of ``k + 1`` tokens from ``text[:p]`` is
compared with each drafter's ``k``-token proposal from the same prefix. Per drafter:
acceptance by position (of the positions a drafter reached, the share it got right, as
the engine's ``Stats`` count it) and the expected tokens per round, the mean of
``accepted + 1`` (a verify round emits the accepted draft tokens and one more).

The text: files of CPython's test suite (``test/test_*.py`` of the running interpreter's
standard library), which ``scripts/train_fixture.py`` excludes from both its training and
its held-out split (so neither trained on nor used for the held-out loss), chosen by a
hash of their names, so the same on every run of one interpreter.

Cost: one pass of the target over each file's text (fed position set by position set,
with a snapshot at each position for the ``k + 1`` greedy steps), shared by every
drafter; each drafter sees the growing prefix, as the engine hands it one.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import textwrap
from collections.abc import Callable, Sequence
from typing import Final

import attrs
import numpy as np

from specproof.contract import Drafter, Target
from specproof.contract.errors import InvalidSettingError
from specproof.contract.validation import int_at_least
from specproof.engine import ContextView

__all__ = [
    "RealContextCell",
    "RealContextText",
    "greedy_continuations",
    "measure_real_contexts",
    "real_context_texts",
]

_MIN_FILE_BYTES: Final = 4096


@attrs.frozen(kw_only=True)
class RealContextText:
    """One held-out file's text as tokens, and the positions drafted from."""

    source: str  # the file, relative to the standard library
    tokens: tuple[int, ...]
    positions: tuple[int, ...]

    def to_json(self) -> dict[str, object]:
        return {"source": self.source, "tokens": len(self.tokens), "positions": len(self.positions)}


@attrs.frozen(kw_only=True)
class RealContextCell:
    """One drafter's acceptance at the real-context positions of one target."""

    target: str
    drafter: str
    k: int
    positions: int
    tokens_per_round: float  # mean of accepted + 1 over the positions
    acceptance_by_position: tuple[float, ...]
    attempts_by_position: tuple[int, ...]
    mean_draft_length: float
    tokens_per_round_by_text: tuple[float, ...]  # the same figure per text, in ``texts`` order
    accepts_by_position: tuple[int, ...] = ()  # the accepted counts behind ``acceptance_by_position``

    @property
    def key(self) -> str:
        return f"{self.target}/{self.drafter}/k{self.k}"

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = attrs.asdict(self)
        data["acceptance_by_position"] = list(self.acceptance_by_position)
        data["attempts_by_position"] = list(self.attempts_by_position)
        data["accepts_by_position"] = list(self.accepts_by_position)
        data["tokens_per_round_by_text"] = list(self.tokens_per_round_by_text)
        data["key"] = self.key
        return data


def _stdlib_root() -> str:
    return os.path.dirname(inspect.getfile(textwrap))


def real_context_texts(
    *, files: int, text_tokens: int, stride: int, min_prefix: int, root: str | None = None
) -> list[RealContextText]:
    """``files`` test-suite files (the first by sha256 of their name), their first ``text_tokens`` bytes,
    and the positions ``min_prefix, min_prefix + stride, ...`` that leave ``k + 1`` tokens of room."""
    for name, value, low in (("files", files, 1), ("text_tokens", text_tokens, 64), ("stride", stride, 1)):
        int_at_least(value, name=name, minimum=low, where="real contexts")
    if isinstance(min_prefix, bool) or not isinstance(min_prefix, int) or not 1 <= min_prefix < text_tokens:
        raise InvalidSettingError(f"real contexts: min_prefix={min_prefix!r} must be in [1, text_tokens={text_tokens})")
    base = root if root is not None else _stdlib_root()
    test_dir = os.path.join(base, "test")
    if not os.path.isdir(test_dir):
        raise InvalidSettingError(f"real contexts: no test suite at {test_dir} (this Python ships without it)")
    names = sorted(n for n in os.listdir(test_dir) if n.startswith("test_") and n.endswith(".py"))
    names.sort(key=lambda n: hashlib.sha256(f"test/{n}".encode()).hexdigest())
    out: list[RealContextText] = []
    for name in names:
        with open(os.path.join(test_dir, name), "rb") as fh:
            data = fh.read()
        if len(data) < max(_MIN_FILE_BYTES, text_tokens):
            continue
        tokens = tuple(data[:text_tokens])
        out.append(
            RealContextText(
                source=f"test/{name}", tokens=tokens, positions=tuple(range(min_prefix, text_tokens, stride))
            )
        )
        if len(out) == files:
            break
    if len(out) < files:
        raise InvalidSettingError(f"real contexts: only {len(out)} test-suite files of >= {text_tokens} bytes here")
    return out


def greedy_continuations(target: Target, text: RealContextText, steps: int) -> list[tuple[int, ...]]:
    """The target's greedy ``steps`` tokens after ``text.tokens[:p]`` for each position ``p``: one pass over
    the text (each token fed once), a snapshot at each position, ``steps`` one-token forwards from it."""
    target.reset()
    fed = 0
    out: list[tuple[int, ...]] = []
    for p in text.positions:
        if p - 1 > fed:  # feed up to, not including, the prefix's last token (it is the first step's input)
            target.forward(list(text.tokens[fed : p - 1]))
            fed = p - 1
        snap = target.snapshot()
        tok = text.tokens[p - 1]
        got: list[int] = []
        for _ in range(steps):
            tok = int(np.argmax(target.forward([tok])[-1]))
            got.append(tok)
        out.append(tuple(got))
        target.restore(snap)
    return out


def measure_real_contexts(
    target_spec: str,
    target: Target,
    drafters: Sequence[tuple[str, Callable[[], Drafter]]],
    texts: Sequence[RealContextText],
    *,
    k: int,
    tick: Callable[[str], None] = lambda _m: None,
) -> list[RealContextCell]:
    """Every drafter's acceptance against the target's greedy continuations at every position of ``texts``."""
    if target.vocab_size < 256 and not callable(getattr(target, "encode", None)):
        raise InvalidSettingError(f"real contexts: target {target_spec} is not byte-level (vocab {target.vocab_size})")
    conts = [greedy_continuations(target, text, k + 1) for text in texts]
    tick(f"real contexts: {target_spec} continuations")
    cells: list[RealContextCell] = []
    for name, factory in drafters:
        drafter = factory()
        attempts = [0] * k
        accepts = [0] * k
        accepted_total = 0
        draft_total = 0
        count = 0
        by_text: list[float] = []
        for text, cont in zip(texts, conts):
            text_accepted = 0
            reset = getattr(drafter, "reset", None)
            if callable(reset):
                reset()
            buf: list[int] = []
            view = ContextView(buf)
            for p, greedy in zip(text.positions, cont):
                buf.extend(text.tokens[len(buf) : p])
                draft = [int(t) for t in drafter.propose(view, k)][:k]
                draft_total += len(draft)
                accepted = 0
                for i, tok in enumerate(draft):
                    attempts[i] += 1
                    if tok != greedy[i]:
                        break
                    accepts[i] += 1
                    accepted += 1
                accepted_total += accepted
                text_accepted += accepted
                count += 1
            by_text.append((text_accepted + len(text.positions)) / len(text.positions) if text.positions else 0.0)
        cells.append(
            RealContextCell(
                target=target_spec,
                drafter=name,
                k=k,
                positions=count,
                tokens_per_round=(accepted_total + count) / count if count else 0.0,
                acceptance_by_position=tuple(a / n if n else 0.0 for a, n in zip(accepts, attempts)),
                attempts_by_position=tuple(attempts),
                mean_draft_length=draft_total / count if count else 0.0,
                tokens_per_round_by_text=tuple(by_text),
                accepts_by_position=tuple(accepts),
            )
        )
        tick(f"real contexts: {name}")
    return cells
