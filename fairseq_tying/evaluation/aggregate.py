"""Across runs: the one summarizing pipeline behind ``collect`` and ``study``.

Both views see a run as a *record* (``{"name", "arch", "tying", "output_layer", "seed",
"eval": {"bleu", "chrf", ...}, "hypotheses": [...]}``, the study's committed layout; ``collect``
builds the same from each ``eval.json``), group the records into cells, and summarize a cell
with the same statistics:

- ``stat``: mean ± 95 % CI over seeds (Student t) of one value per run;
- ``compare``: a paired bootstrap of a cell against a baseline cell, one pair of runs per
  seed, pooled over the pairs and per pair (``significance.stats_paired_bootstrap``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from fairseq_tying.evaluation.plots import MethodPoints
from fairseq_tying.evaluation.significance import metric_stats, stats_paired_bootstrap
from fairseq_tying.evaluation.stats import format_ci, mean_ci

Record = dict[str, Any]


def stat(values: Sequence[float]) -> dict[str, Any]:
    """``{"values", "mean", "ci95"}``; ``ci95`` (the half width) is None for one value."""
    mean, half = mean_ci(list(values))
    return {"values": list(values), "mean": mean, "ci95": None if np.isnan(half) else half}


def stats_of(runs: Sequence[Record], getters: dict[str, Callable[[Record], float]]
             ) -> dict[str, dict[str, Any]]:
    """``stat`` of each named value over ``runs``."""
    return {name: stat([get(r) for r in runs]) for name, get in getters.items()}


def format_stat(s: dict[str, Any], digits: int = 2) -> str:
    """``mean ± half`` (just the mean for one run)."""
    return format_ci(s["mean"], np.nan if s["ci95"] is None else s["ci95"], digits)


def format_p(p: float) -> str:
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def _sentence_stats(record: Record, refs: Sequence[str], metric: str) -> np.ndarray:
    """A record's per-sentence statistics of ``metric``, computed once per record."""
    key = f"_{metric}_stats"
    if key not in record:
        record[key] = metric_stats(record["hypotheses"], refs, metric)
    return record[key]


def compare(pairs: Sequence[tuple[Hashable, Record, Record]], refs: Sequence[str],
            n_samples: int, metric: str = "bleu") -> dict[str, Any]:
    """Paired bootstrap of ``metric`` over ``(key, run, baseline run)`` pairs (one per seed):
    pooled over the pairs (``delta_bleu``/``p``; ``delta_ci95`` over the pairs' differences:
    training variance) and per pair (``per_seed_p``, ``per_seed_delta``, keyed by ``key``)."""
    stats = [(_sentence_stats(run, refs, metric), _sentence_stats(base, refs, metric))
             for _, run, base in pairs]
    test = stats_paired_bootstrap(stats, n_samples, metric=metric)
    singles = {key: stats_paired_bootstrap([s], n_samples, metric=metric)
               for (key, _, _), s in zip(pairs, stats, strict=True)}
    test["per_seed_p"] = {k: t["p"] for k, t in singles.items()}
    test["per_seed_delta"] = {k: t[f"delta_{metric}"] for k, t in singles.items()}
    half = mean_ci(list(test["per_seed_delta"].values()))[1]
    test["delta_ci95"] = None if np.isnan(half) else half
    return test


def shared_seeds(runs: dict[int, Record], base: dict[int, Record] | None) -> list[int]:
    """The seeds of a cell (``runs``) that a baseline cell (``base``, maybe absent) also has."""
    return sorted(set(runs) & set(base or {}))


def compare_seeds(runs: dict[int, Record], base: dict[int, Record] | None,
                  refs: Sequence[str], n_samples: int) -> dict[str, Any] | None:
    """``compare`` over the seeds ``runs`` and ``base`` share; None when they share none."""
    shared = shared_seeds(runs, base)
    return compare([(s, runs[s], base[s]) for s in shared], refs, n_samples) if shared else None


def format_delta(test: dict[str, Any], per_seed: bool = True) -> str:
    """``+Δ ± CI (p …; [per-seed p])`` of a ``compare`` result."""
    ci = "" if test["delta_ci95"] is None else f" ± {test['delta_ci95']:.2f}"
    if not per_seed:
        return f"{test['delta_bleu']:+.2f}{ci} ({format_p(test['p'])})"
    per = ", ".join("<0.001" if p < 0.001 else f"{p:.3f}" for p in test["per_seed_p"].values())
    return f"{test['delta_bleu']:+.2f}{ci} ({format_p(test['p'])}; [{per}])"


def points(label: str, s: dict[str, Any], baseline: bool = False) -> MethodPoints:
    """A ``stat`` as the markers of the per-method plots (seeds, mean ± CI)."""
    return MethodPoints(label, s["values"], s["mean"], np.nan if s["ci95"] is None else s["ci95"],
                        baseline=baseline)
