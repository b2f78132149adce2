"""How far a word-similarity ρ can be trusted: its interval, and the test of two matrices' ρ
on the same word pairs.

- A ρ's 95 % interval is Fisher's z with Bonett & Wright's (2000) standard error for Spearman's
  ρ, √((1 + ρ²/2)/(n − 3)): it needs only ρ and the number of pairs n, so an analysis whose pairs'
  scores were not kept gets one too.
- Two matrices' ρ on the same pairs are dependent (one set of human ratings), so their
  difference is tested by a paired bootstrap over the pairs when each pair's cosine is known
  (:func:`paired_bootstrap`). Without them, :func:`bound_difference` gives a conservative
  interval that holds whatever the two matrices' cosines correlate (Bonferroni over the two ρ's
  97.5 % intervals).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from fairseq_tying.analysis.measures import library

LEVEL = 0.95
DRAWS = 10_000  # bootstrap resamples: the p's resolution is 2/DRAWS
SEED = 0
_CHUNK = 1_000  # resamples ranked at once: bounds memory at (chunk × pairs) floats
_MAX_RHO = 1 - 1e-9  # Fisher's z of ±1 is infinite


@dataclass(frozen=True)
class Difference:
    """ρ_a − ρ_b with its interval and two-sided p; ``method`` names how they were found."""

    estimate: float
    low: float
    high: float
    p: float
    method: str  # "bootstrap" (paired, over the pairs) or "bound" (from the two intervals)


def _z(rho: float) -> float:
    return math.atanh(max(-_MAX_RHO, min(_MAX_RHO, rho)))


def fisher_se(rho: float, n: int) -> float:
    """Bonett & Wright's standard error of Fisher's z of a Spearman ρ over n pairs."""
    return math.sqrt((1 + rho * rho / 2) / (n - 3))


def fisher_interval(rho: float | None, n: int, level: float = LEVEL
                    ) -> tuple[float, float] | None:
    """The ρ's interval (None for no ρ, or n < 4: no standard error)."""
    if rho is None or n < 4:
        return None
    half = NormalDist().inv_cdf(0.5 + level / 2) * fisher_se(rho, n)
    return math.tanh(_z(rho) - half), math.tanh(_z(rho) + half)


def bound_difference(rho_a: float | None, n_a: int, rho_b: float | None, n_b: int,
                     level: float = LEVEL) -> Difference | None:
    """ρ_a − ρ_b from the two ρ alone: each one's (1 − α/2) interval holds, both together with
    at least 1 − α whatever their dependence, so [low_a − high_b, high_a − low_b] is a
    1 − α interval; p is the α at which it reaches 0 (conservative: a paired test is
    narrower when the two matrices' cosines correlate)."""
    if rho_a is None or rho_b is None or min(n_a, n_b) < 4:
        return None
    za, zb, sa, sb = _z(rho_a), _z(rho_b), fisher_se(rho_a, n_a), fisher_se(rho_b, n_b)
    c = NormalDist().inv_cdf(1 - (1 - level) / 4)
    low = math.tanh(za - c * sa) - math.tanh(zb + c * sb)
    high = math.tanh(za + c * sa) - math.tanh(zb - c * sb)
    p = min(1.0, 4 * (1 - NormalDist().cdf(abs(za - zb) / (sa + sb))))
    return Difference(rho_a - rho_b, low, high, p, "bound")


def spearman_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's ρ of each row of ``x`` with the same row of ``y`` (average ranks for ties,
    as scipy's spearmanr); NaN where a row is constant."""
    rankdata = library("scipy.stats").rankdata
    rx, ry = rankdata(x, axis=1), rankdata(y, axis=1)
    rx -= rx.mean(axis=1, keepdims=True)
    ry -= ry.mean(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (rx * ry).sum(axis=1) / np.sqrt((rx * rx).sum(axis=1) * (ry * ry).sum(axis=1))


def resamples(n: int, draws: int = DRAWS, seed: int = SEED) -> np.ndarray:
    """The bootstrap's draws of pair indices: one row of n per resample."""
    return np.random.default_rng(seed).integers(0, n, size=(draws, n))


def paired_bootstrap(human: np.ndarray, a: np.ndarray, b: np.ndarray, draws: int = DRAWS,
                     seed: int = SEED, level: float = LEVEL) -> Difference:
    """ρ(human, a) − ρ(human, b) over the same pairs, resampled together: the percentile
    interval of the resampled differences and p = 2 · min(share ≤ 0, share ≥ 0), at most 1.
    Resamples where a side is constant (no ρ) are left out."""
    human, a, b = (np.asarray(v, dtype=np.float64) for v in (human, a, b))
    estimate = spearman_rows(human[None], a[None])[0] - spearman_rows(human[None], b[None])[0]
    idx = resamples(len(human), draws, seed)
    diffs = np.concatenate([spearman_rows(human[rows], a[rows]) - spearman_rows(human[rows],
                                                                               b[rows])
                            for rows in np.array_split(idx, max(1, draws // _CHUNK))])
    diffs = diffs[~np.isnan(diffs)]
    low, high = np.percentile(diffs, [50 - 50 * level, 50 + 50 * level])
    p = min(1.0, 2 * min(np.mean(diffs <= 0), np.mean(diffs >= 0)))
    return Difference(float(estimate), float(low), float(high), float(p), "bootstrap")
