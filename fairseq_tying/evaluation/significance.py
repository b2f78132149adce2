"""Paired bootstrap resampling of BLEU/chrF differences, on sacrebleu's per-sentence statistics
and with the p-value of sacrebleu's own ``PairedTest`` (one pair), pooled over seeds."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sacrebleu.metrics import BLEU, CHRF

METRICS = {"bleu": BLEU, "chrf": CHRF}


def metric_stats(hyps: Sequence[str], refs: Sequence[str], metric: str = "bleu") -> np.ndarray:
    """sacrebleu's per-sentence sufficient statistics of ``metric`` (for BLEU: matches, totals,
    lengths); a corpus score is computed from their sum."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses for {len(refs)} references")
    return np.array(METRICS[metric]()._extract_corpus_statistics(list(hyps), [list(refs)]),
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
    scorer = METRICS[metric]()

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
