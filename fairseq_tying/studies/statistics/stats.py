"""Mean and 95% confidence interval over seeds (Student's t distribution), the one-sample t-test
and the two one-sided tests of equivalence (TOST) of per-seed differences."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from fairseq_tying.common.extras import require
from fairseq_tying.studies import FOR_WHAT

_st = require("scipy.stats", "analysis", FOR_WHAT)


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
