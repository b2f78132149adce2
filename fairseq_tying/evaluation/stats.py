"""Mean and 95% confidence interval over seeds (Student's t distribution)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from scipy import stats as _st


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


def format_ci(mean: float, half: float, digits: int = 2) -> str:
    if math.isnan(half):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {half:.{digits}f}"


def stat(values: Sequence[float]) -> dict[str, Any]:
    """``{"values", "mean", "ci95"}`` over seeds; ``ci95`` (the half width) is None for one
    value."""
    mean, half = mean_ci(list(values))
    return {"values": list(values), "mean": mean, "ci95": None if math.isnan(half) else half}


def format_stat(s: dict[str, Any], digits: int = 2) -> str:
    """``mean ± half`` of a ``stat`` (just the mean for one run)."""
    return format_ci(s["mean"], math.nan if s["ci95"] is None else s["ci95"], digits)


def format_p(p: float) -> str:
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def seeds_label(seeds: list[int]) -> str:
    """``seed 1`` or ``seeds 1, 2, 3``."""
    return f"seed{'s' * (len(seeds) != 1)} {', '.join(map(str, seeds))}"
