"""Drafter benchmarks: one n-gram proposal at 1K, 8K and 64K tokens of context.

Incremental, as the engine uses the drafter: the context is indexed once, then each
timed proposal follows the append of a few new tokens to the same growing view.
A proposal should cost the same at 64K as at 1K (target: within 1.5x).
"""

from __future__ import annotations

import pytest

from specproof.bench import stdlib_token_stream
from specproof.engine import ContextView, NgramDrafter

APPEND = 4
ROUNDS = 300


def _growing_context(drafter, context, rounds):  # type: ignore[no-untyped-def]
    """A view of ``context`` stdlib tokens the drafter has seen once (untimed), and a pytest-benchmark
    ``setup`` that appends APPEND tokens to it before each timed proposal."""
    stream = stdlib_token_stream(context + (rounds + 5) * APPEND)
    buf = list(stream[:context])
    view = ContextView(buf)
    drafter.propose(view, 4)  # index / prefill once, untimed
    pos = [context]

    def setup():  # type: ignore[no-untyped-def]
        buf.extend(stream[pos[0] : pos[0] + APPEND])
        pos[0] += APPEND
        return (view, 4), {}

    return setup


@pytest.mark.parametrize("context", [1024, 8192, 65536])
def test_propose(benchmark, context):
    drafter = NgramDrafter()
    setup = _growing_context(drafter, context, ROUNDS)

    benchmark.group = "drafter-propose"
    benchmark.name = f"ngram @ {context // 1024}K"
    benchmark.extra_info.update({"context": context, "append": APPEND, "k": 4})
    benchmark.pedantic(drafter.propose, setup=setup, rounds=ROUNDS, iterations=1)


@pytest.mark.parametrize("context", [1024, 65536])
def test_propose_on_a_loop(benchmark, context):
    """A context ending in a long period-3 loop: every proposal extends the match by its period (O(k))."""
    drafter = NgramDrafter()
    loop = [101, 102, 103]
    buf = (loop * (context // 3 + 1))[:context]
    view = ContextView(buf)
    drafter.propose(view, 4)  # index once, untimed

    def setup():  # type: ignore[no-untyped-def]
        buf.extend(loop)
        return (view, 4), {}

    benchmark.group = "drafter-propose"
    benchmark.name = f"ngram on a loop @ {context // 1024}K"
    benchmark.extra_info.update({"context": context, "append": 3, "k": 4})
    benchmark.pedantic(drafter.propose, setup=setup, rounds=ROUNDS, iterations=1)
    assert len(drafter.propose(view, 4)) == 4


@pytest.mark.parametrize("spec", ["model:trained-small", "combined:trained-small"])
def test_model_drafter_propose(benchmark, spec):
    """A draft-model proposal along a decoding: the draft model catches up on the accepted tokens in one
    forward, then drafts k = 4 tokens (3 one-token forwards); never a re-prefill of the 1K context."""
    from specproof.engine.drafters import ModelDrafter, load_drafter

    context = 1024
    drafter = load_drafter(spec)
    setup = _growing_context(drafter, context, 100)

    benchmark.group = "drafter-propose"
    benchmark.name = f"{spec} @ 1K"
    benchmark.extra_info.update({"context": context, "append": APPEND, "k": 4})
    benchmark.pedantic(drafter.propose, setup=setup, rounds=100, iterations=1)
    model_drafter = drafter if isinstance(drafter, ModelDrafter) else drafter.model
    assert model_drafter.restarts == 1  # the prefill only
