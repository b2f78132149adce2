"""Mean and 95% confidence interval over seeds (Student's t distribution), the one-sample t-test
and the two one-sided tests of equivalence (TOST) of per-seed differences, and what a number
of seeds can show: the smallest difference the t-test detects, the seeds TOST needs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from fairseq_tying.common.extras import require
from fairseq_tying.studies import FOR_WHAT

_st = require("scipy.stats", "analysis", FOR_WHAT)
_optimize = require("scipy.optimize", "analysis", FOR_WHAT)
_integrate = require("scipy.integrate", "analysis", FOR_WHAT)


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Return ``(mean, half_width)``; the half width is NaN for fewer than two values."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_ci needs at least one value")
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    t = float(_st.t.ppf(0.5 + confidence / 2, n - 1))
    return mean, t * sd / math.sqrt(n)


def t_test_p(values: Sequence[float]) -> float:
    """Two-sided p of the one-sample t-test of mean 0 (scipy); 1.0 for fewer than two values
    and for values that are all 0, NaN-free for the Holm adjustment."""
    if len(values) < 2 or not any(values):
        return 1.0
    p = float(_st.ttest_1samp(list(values), 0.0).pvalue)
    return 0.0 if math.isnan(p) else p  # equal non-zero values: no spread, no doubt


def stat(values: Sequence[float]) -> dict[str, Any]:
    """``{"values", "mean", "ci95"}`` over seeds; ``ci95`` (the half width) is None for one
    value."""
    mean, half = mean_ci(list(values))
    return {"values": list(values), "mean": mean, "ci95": None if math.isnan(half) else half}


def tost(values: Sequence[float], margin: float, alpha: float = 0.05) -> dict[str, Any] | None:
    """Equivalence of per-seed differences d_1..d_n within ±δ (``margin``), by two one-sided
    t-tests (TOST): with mean d̄, sd s, se = s/√n and t = t_{1−α, n−1},

        equivalent at level α  iff  d̄ − t·se > −δ  and  d̄ + t·se < δ,

    i.e. the 1 − 2α interval ``[low, high]`` inside (−δ, δ). Its p-value,

        p = max(P(T ≥ (d̄ + δ)/se), P(T ≤ (d̄ − δ)/se)),  T ~ t_{n−1},

    is below α exactly then (so that Holm–Bonferroni can take it with other tests). None for
    fewer than two values: no interval."""
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)
    t = float(_st.t.ppf(1 - alpha, n - 1))
    if se == 0:  # equal differences: no doubt about where the mean lies
        p = 0.0 if abs(mean) < margin else 1.0
    else:
        p = max(float(_st.t.sf((mean + margin) / se, n - 1)),
                float(_st.t.cdf((mean - margin) / se, n - 1)))
    return {"margin": margin, "low": mean - t * se, "high": mean + t * se, "p": p, "n": n}


POWER = 0.8  # the chance of showing an effect that a power statement assumes


def detectable(sd: float, n: int, alpha: float = 0.05, power: float = POWER) -> float:
    """The smallest true mean difference δ that the two-sided one-sample t-test over ``n``
    seeds, whose differences spread with standard deviation ``sd``, rejects "no difference"
    with probability ``power`` at level α:

        P(|T| > t_{1−α/2, n−1}) = power,  T ~ noncentral t(n − 1, δ·√n / sd)

    (scipy's ``nct``); inf for fewer than two seeds, 0 for no spread."""
    if n < 2:
        return math.inf
    if sd == 0:
        return 0.0
    df, crit = n - 1, float(_st.t.ppf(1 - alpha / 2, n - 1))

    def shortfall(delta: float) -> float:
        nc = delta * math.sqrt(n) / sd
        reached = float(_st.nct.sf(crit, df, nc) + _st.nct.cdf(-crit, df, nc))
        return (1.0 if math.isnan(reached) else reached) - power  # NaN: nc far past the tail

    high = sd
    while shortfall(high) < 0:
        high *= 2
    return float(_optimize.brentq(shortfall, 0.0, high, xtol=1e-9 * sd))


def tost_power(sd: float, n: int, margin: float, alpha: float = 0.05) -> float:
    """The probability that TOST (``tost``) shows equivalence within ±``margin`` over ``n``
    seeds when the true difference is 0 and the seeds spread with ``sd``: with d̄ ~ N(0, sd²/n)
    independent of s² ~ sd²·χ²_{n−1}/(n − 1), TOST holds iff |d̄| < margin − t_{1−α,n−1}·s/√n,
    so the power is E_s[max(0, 2Φ((margin − t·s/√n)·√n/sd) − 1)], integrated over χ²_{n−1}
    (Φ and the χ² density in closed form: scipy's per-point calls cost 100 times more)."""
    if n < 2:
        return 0.0
    if sd == 0:
        return 1.0
    t, root, k = float(_st.t.ppf(1 - alpha, n - 1)), math.sqrt(n), (n - 1) / 2
    log_norm = k * math.log(2) + math.lgamma(k)

    def given(u: float) -> float:
        if u <= 0:
            return 0.0
        s = sd * math.sqrt(u / (n - 1))
        inside = math.erf((margin - t * s / root) * root / sd / math.sqrt(2))  # 2Φ(x) − 1
        return max(0.0, inside) * math.exp((k - 1) * math.log(u) - u / 2 - log_norm)

    return float(_integrate.quad(given, 0, math.inf, limit=200)[0])


def seeds_for_equivalence(sd: float, margin: float, alpha: float = 0.05,
                          power: float = POWER, most: int = 100) -> int | None:
    """The fewest seeds with which TOST shows equivalence within ±``margin`` with probability
    ``power`` when the true difference is 0 (``tost_power``); None beyond ``most``. The power
    grows with the seeds, so the search doubles n, then bisects."""
    def enough(n: int) -> bool:
        return tost_power(sd, n, margin, alpha) >= power

    low, high = 1, 2  # low: too few (one seed has no interval)
    while not enough(high):
        if high >= most:
            return None
        low, high = high, min(2 * high, most)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high
