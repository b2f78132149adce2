"""The comparisons of two cells, seed by seed: the paired bootstrap resampling of BLEU/chrF
differences (on sacrebleu's per-sentence statistics, with the p-value of sacrebleu's own
``PairedTest`` for one pair, pooled over seeds), and the per-seed difference of a value."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from fairseq_tying.evaluation.metrics import METRICS
from fairseq_tying.studies.record import Record
from fairseq_tying.studies.stats import mean_ci, stat, t_test_p


def metric_stats(hyps: Sequence[str], refs: Sequence[str], metric: str = "bleu") -> np.ndarray:
    """sacrebleu's per-sentence sufficient statistics of ``metric`` (for BLEU: matches, totals,
    lengths); a corpus score is computed from their sum."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses for {len(refs)} references")
    return np.array(_scorer(metric)._extract_corpus_statistics(list(hyps), [list(refs)]),
                    dtype="float32")


def seed_paired_bootstrap(
    pairs: Sequence[tuple[Sequence[str], Sequence[str]]],
    refs: Sequence[str],
    n_samples: int = 1000,
    seed: int = 12345,
) -> dict[str, float]:
    """Paired bootstrap of BLEU over several seeds at once: ``pairs`` holds one
    ``(system, baseline)`` hypothesis pair per seed, all translating ``refs``.

    Every resample draws one set of sentence indices and applies it to all pairs, so the test
    statistic is the mean (over seeds) of the corpus-BLEU difference. The p-value follows
    sacrebleu's ``PairedTest`` (centred absolute differences, +1 smoothing); with one pair and
    the same seed it is sacrebleu's own p-value.
    """
    return stats_paired_bootstrap([(metric_stats(a, refs), metric_stats(b, refs))
                                   for a, b in pairs], n_samples, seed)


def stats_paired_bootstrap(
    pairs: Sequence[tuple[np.ndarray, np.ndarray]], n_samples: int = 1000, seed: int = 12345,
    metric: str = "bleu",
) -> dict[str, float]:
    """``seed_paired_bootstrap`` on precomputed ``metric_stats``; the difference of the means
    is ``delta_bleu`` (``delta_chrf`` for chrF)."""
    scorer = _scorer(metric)

    def score(s: np.ndarray) -> float:
        return scorer._compute_score_from_stats(s).score

    n = len(pairs[0][0])
    idxs = np.random.default_rng(seed).choice(n, size=(n_samples, n))
    observed = np.zeros(len(pairs))
    sampled = np.zeros((len(pairs), n_samples))
    for k, (sys_s, base_s) in enumerate(pairs):
        observed[k] = score(sys_s.sum(0)) - score(base_s.sum(0))
        sampled[k] = [score(a.sum(0)) - score(b.sum(0))
                      for a, b in zip(sys_s[idxs], base_s[idxs], strict=True)]
    diff = float(observed.mean())
    sample_diffs = np.abs(sampled.mean(0))
    centred = sample_diffs - sample_diffs.mean()
    p = (int(np.sum(centred > abs(diff))) + 1) / (n_samples + 1)
    return {f"delta_{metric}": diff, "p": 1.0 if not sample_diffs.any() else p,
            "n_seeds": len(pairs), "n_samples": n_samples}


def _scorer(metric: str):
    scorer = METRICS[metric].scorer
    if scorer is None:
        raise ValueError(f"{metric}: no sacrebleu metric to resample sentence by sentence")
    return scorer()


def sentence_stats(record: Record, metric: str, refs: Sequence[str]) -> np.ndarray:
    """sacrebleu's per-sentence statistics of ``metric`` for a record's hypotheses, computed
    once per record."""
    if metric not in record.stats_cache:
        if record.hypotheses is None:
            raise ValueError(f"{record.name}: no hypotheses to compare sentence by sentence")
        record.stats_cache[metric] = metric_stats(record.hypotheses, refs, metric)
    return record.stats_cache[metric]


def compare(pairs: Sequence[tuple[Hashable, Any, Any]], refs: Sequence[str], n_samples: int,
            metric: str = "bleu") -> dict[str, Any]:
    """Paired bootstrap of ``metric`` over ``(key, run, baseline run)`` pairs of records (one
    per seed): pooled over the pairs (``delta_bleu``/``p``; ``delta_ci95`` over the pairs'
    differences: training variance) and per pair (``per_seed_p``, ``per_seed_delta``, keyed
    by ``key``)."""
    stats = [(sentence_stats(run, metric, refs), sentence_stats(base, metric, refs))
             for _, run, base in pairs]
    test = stats_paired_bootstrap(stats, n_samples, metric=metric)
    singles = {key: stats_paired_bootstrap([s], n_samples, metric=metric)
               for (key, _, _), s in zip(pairs, stats, strict=True)}
    test["per_seed_p"] = {k: t["p"] for k, t in singles.items()}
    test["per_seed_delta"] = {k: t[f"delta_{metric}"] for k, t in singles.items()}
    half = mean_ci(list(test["per_seed_delta"].values()))[1]
    test["delta_ci95"] = None if np.isnan(half) else half
    return test


def seed_difference(runs: dict[int, Any], base: dict[int, Any], metric: str
                    ) -> dict[str, Any] | None:
    """Per-seed ``metric`` of ``runs`` minus ``base`` (paired by seed): the ``stat`` of the
    differences, the seeds and the t-test's ``p`` (its verdict comes with the study's family,
    ``specs.LM``); None without shared seeds."""
    shared = sorted(set(runs) & set(base))
    if not shared:
        return None
    get = METRICS[metric].of
    values = [get(runs[s]) - get(base[s]) for s in shared]
    return {**stat(values), "p": t_test_p(values), "seeds": shared}
