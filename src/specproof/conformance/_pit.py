"""The all-token distribution test: the randomized probability integral transform (PIT) of every
emitted token, judged by the Dvoretzky-Kiefer-Wolfowitz-Massart inequality (docs/contract.md, "Sampling").

**The transform.** At each scored position order the vocabulary by ``p`` descending, the lower id
first among equals (the order of ``_sampled_runs.head_and_tail``; it depends only on ``p``, known
before the token is drawn). For the emitted token ``x`` let ``F(x-)`` be the mass of the tokens
before it and ``u = F(x-) + V p(x)``, ``V`` uniform on [0, 1) from this module's own generator
(seeded by the generation's seed, a stream no engine uses). If ``x`` is drawn from ``p`` given the
past, ``u`` is exactly uniform on [0, 1) given the past (Brockwell 2007, "Universal residuals";
Czado, Gneiting and Held 2009): a variable that is U(0, 1) given everything before it is
independent of it, so the ``u`` of every emitted token of every generation, in the order drawn, are
**iid U(0, 1) under losslessness**, whatever the scheme, the drafts, the generation lengths or
where the run stops. (The generations' seeds must give independent streams: ``engine.seeds``.)

**The bound.** Dvoretzky-Kiefer-Wolfowitz with Massart's constant (P. Massart, "The tight constant
in the DKW inequality", Ann. Probab. 18, 1990): for ``n`` iid U(0, 1) values with empirical CDF
``F_n``, ``P(sup_t |F_n(t) - t| > eps) <= 2 exp(-2 n eps^2)`` for every ``eps > 0`` and every ``n``.
The test looks at the fixed sample sizes ``n_j = ceil(FIRST * GROWTH^j)`` (``j < CHECKPOINTS``),
each with ``eps_j = sqrt(log(2 CHECKPOINTS / alpha) / (2 n_j))``, testing the first ``n_j`` values
when the run has reached them. The first ``n_j`` values are iid U(0, 1) whether or not the run gets
that far, so by the union bound ``P(false fail) <= alpha`` under any stopping rule.

**Power.** A deviation moves the law of ``u`` to some ``G``; the test sees its Kolmogorov distance
``d = sup_t |G(t) - t|``. At a position where the engine's distribution is ``p'``, ``|G(t) - t|``
at a token boundary is ``|p'(S) - p(S)|`` for the set ``S`` of tokens before it, so ``d <= TV(p',
p)``, with equality when the deviation moves mass along the order (onto the top tokens: sharper
than ``p``, too low a temperature, argmax verification; or off them: flatter, a filter not
applied). ``min_detectable`` is ``eps_j + sqrt(log(2 / 0.01) / (2 n_j))`` at the last checkpoint
reached: by DKW on ``G`` itself, iid draws from a ``G`` at that distance are rejected with
probability at least 0.99 (exact for a deviation that is the same at every position; a figure for
others, measured in docs/contract.md's power table).
"""

from __future__ import annotations

import math

import attrs
import numpy as np

__all__ = ["CHECKPOINTS", "FIRST", "GROWTH", "PitTest", "pit_values"]

FIRST = 32  # the first checkpoint: fewer tokens detect nothing a sampling run would care about
GROWTH = 1.1  # each checkpoint 10% past the last: a run's final sample is at most ~9% past one
CHECKPOINTS = 128  # n_j up to ~6e6 tokens: more than any profile scores
POWER_TAIL = 0.01  # the min_detectable figure is at power 1 - POWER_TAIL
PIT_STREAM = 0x50_49_54  # "PIT": the V generator's seed sequence is (PIT_STREAM, generation seed)


def checkpoint(j: int) -> int:
    return math.ceil(FIRST * GROWTH**j)


def pit_values(p: np.ndarray, tokens: np.ndarray | list[int], *, seed: int) -> np.ndarray:
    """The randomized PIT ``u`` of each emitted token (row ``i`` of ``p`` is its distribution)."""
    rows = np.asarray(p, dtype=np.float64)
    x = np.asarray(tokens, dtype=np.int64)
    if rows.ndim != 2 or rows.shape[0] != x.shape[0]:
        raise ValueError(f"pit_values: {x.shape[0]} tokens for p of shape {rows.shape}")
    px = rows[np.arange(len(x)), x][:, None]
    ids = np.arange(rows.shape[1])[None, :]
    before = np.where((rows > px) | ((rows == px) & (ids < x[:, None])), rows, 0.0).sum(axis=1)
    v = np.random.default_rng([PIT_STREAM, int(seed)]).random(len(x))
    return np.clip(before + v * px[:, 0], 0.0, np.nextafter(1.0, 0.0))


def kolmogorov_distance(values: np.ndarray) -> tuple[float, float]:
    """``(sup_t |F_n(t) - t|, F_n(t) - t at the sup)`` for ``values`` in [0, 1) (the one-sample KS
    statistic against U(0, 1), as ``scipy.stats.kstest(values, "uniform")`` computes it)."""
    u = np.sort(values)
    n = len(u)
    above = np.arange(1, n + 1) / n - u  # F_n(u_(i)) - u_(i): the empirical CDF ahead of t
    below = u - np.arange(n) / n  # u_(i) - F_n(u_(i)-): behind
    i, k = int(np.argmax(above)), int(np.argmax(below))
    return (float(above[i]), float(above[i])) if above[i] >= below[k] else (float(below[k]), -float(below[k]))


def threshold(n: int, alpha: float) -> float:
    """``eps`` at checkpoint size ``n``: the DKW-Massart bound at ``alpha / CHECKPOINTS``."""
    return math.sqrt(math.log(2 * CHECKPOINTS / alpha) / (2 * n))


@attrs.define
class PitTest:
    """The PIT values of one configuration's emitted tokens, tested at each checkpoint reached."""

    name: str
    alpha: float
    values: list[np.ndarray] = attrs.Factory(list)
    n: int = 0
    reached: int = 0  # checkpoints tested so far
    distance: float = 0.0  # D at the last checkpoint tested
    signed: float = 0.0  # F_n(t) - t there: > 0 the tokens sit higher in p's order than p says
    rejected_at: int | None = None  # the checkpoint size that rejected (None: none did)

    def add(self, u: np.ndarray) -> None:
        if self.rejected_at is not None or not len(u):
            return
        self.values.append(np.asarray(u, dtype=np.float64))
        self.n += len(u)
        if self.reached >= CHECKPOINTS or self.n < checkpoint(self.reached):
            return
        everything = np.concatenate(self.values)
        self.values = [everything]
        while self.reached < CHECKPOINTS and checkpoint(self.reached) <= self.n:
            size = checkpoint(self.reached)
            self.reached += 1
            self.distance, self.signed = kolmogorov_distance(everything[:size])
            if self.distance > threshold(size, self.alpha):
                self.rejected_at = size
                return

    @property
    def tested(self) -> int:
        """The size of the last checkpoint tested (0: none yet)."""
        return self.rejected_at or (checkpoint(self.reached - 1) if self.reached else 0)

    @property
    def rejected(self) -> bool:
        return self.rejected_at is not None

    @property
    def threshold(self) -> float:
        return threshold(self.tested, self.alpha) if self.tested else math.inf

    @property
    def min_detectable(self) -> float:
        """The Kolmogorov distance of the PIT's law from uniform detected with power 0.99 (inf before any
        checkpoint)."""
        if not self.tested:
            return math.inf
        return self.threshold + math.sqrt(math.log(2 / POWER_TAIL) / (2 * self.tested))

    def describe(self) -> str:
        if not self.tested:
            return f"all-token PIT: {self.n} tokens, below the first checkpoint ({FIRST}): nothing tested"
        return (
            f"all-token PIT on {self.tested} of {self.n} tokens: Kolmogorov distance {self.distance:.4f} from "
            f"uniform (DKW-Massart threshold {self.threshold:.4f}); detects a deviation of {self.min_detectable:.3f} "
            "along p's order with power 0.99"
        )

    def direction(self) -> str:
        """Which way the tokens moved, in words."""
        if self.signed > 0:
            return "the emitted tokens sit higher in p's order than p says (sharper than p: too much mass on the top)"
        return "the emitted tokens sit lower in p's order than p says (flatter than p: too much mass in the tail)"
