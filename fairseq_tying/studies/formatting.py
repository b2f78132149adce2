"""How the across-run views write numbers: a mean ± its CI, a p-value, the seeds, a paired
Δ with its test, the epochs a cell trained; and the papers' numbers they print beside ours.
Every view and ``collect`` take them from here (no view imports another)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# Liu et al. (2020), Transformer on IWSLT'14 Es→En, shared input–output embeddings.
PAPER_IWSLT14_ES_EN = {"dot": 34.24, "l2norm": 34.65, "sqnorm": 34.97, "distance": 34.54,
                       "cosine": 34.81}
# Liu et al. (2020): DynamicConv on IWSLT'14 De→En, l2norm over dot
PAPER_DYNAMICCONV_L2NORM = 0.41


def format_ci(mean: float, half: float, digits: int = 2) -> str:
    if math.isnan(half):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {half:.{digits}f}"


def format_stat(s: dict[str, Any], digits: int = 2) -> str:
    """``mean ± half`` of a ``stats.stat`` (just the mean for one run)."""
    return format_ci(s["mean"], math.nan if s["ci95"] is None else s["ci95"], digits)


def format_p(p: float) -> str:
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def seeds_label(seeds: list[int]) -> str:
    """``seed 1`` or ``seeds 1, 2, 3``."""
    return f"seed{'s' * (len(seeds) != 1)} {', '.join(map(str, seeds))}"


def format_delta(test: dict[str, Any], per_seed: bool = True) -> str:
    """``+Δ ± CI (p …; [per-seed p])`` of a paired bootstrap (``significance.compare``)."""
    ci = "" if test["delta_ci95"] is None else f" ± {test['delta_ci95']:.2f}"
    if not per_seed:
        return f"{test['delta_bleu']:+.2f}{ci} ({format_p(test['p'])})"
    per = ", ".join("<0.001" if p < 0.001 else f"{p:.3f}" for p in test["per_seed_p"].values())
    return f"{test['delta_bleu']:+.2f}{ci} ({format_p(test['p'])}; [{per}])"


def epochs_text(cell: dict[str, Any]) -> str:
    """``26.3 (27/20/32; 3 plateau)``: mean epochs, per seed, and the stop reasons."""
    stop = cell["stop"]
    reasons = ", ".join(f"{stop['reasons'].count(r)} {r}" for r in sorted(set(stop["reasons"])))
    epochs = "/".join(str(e) for e in stop["epochs"])
    return f"{np.mean(stop['epochs']):.1f} ({epochs}; {reasons})"
