"""Paired bootstrap resampling with sacrebleu's own implementation (``PairedTest``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest


def paired_bootstrap(
    baseline: tuple[str, Sequence[str]],
    systems: Sequence[tuple[str, Sequence[str]]],
    refs: Sequence[str],
    n_samples: int = 1000,
) -> dict[str, dict[str, Any]]:
    """p-values of BLEU and chrF differences of each system against the baseline.

    A system whose hypotheses equal the baseline's gets p = 1: every resampled difference
    is then exactly 0 and sacrebleu's strict ``>`` count would report (0 + 1) / (n + 1).
    """
    named = [(baseline[0], list(baseline[1]))] + [(n, list(h)) for n, h in systems]
    for name, hyps in named:
        if len(hyps) != len(refs):
            raise ValueError(f"{name}: {len(hyps)} hypotheses for {len(refs)} references")
    test = PairedTest(named, {"BLEU": BLEU(), "chrF": CHRF()}, [list(refs)], test_type="bs",
                      n_samples=n_samples)
    signatures, scores = test()
    bleu_key, chrf_key = [k for k in scores if k != "System"]
    out: dict[str, dict[str, Any]] = {}
    for i, (name, hyps) in enumerate(named[1:], start=1):
        same = hyps == named[0][1]
        out[name] = {
            "baseline": baseline[0],
            "bleu": scores[bleu_key][i].score,
            "chrf": scores[chrf_key][i].score,
            "bleu_p": 1.0 if same else scores[bleu_key][i].p_value,
            "chrf_p": 1.0 if same else scores[chrf_key][i].p_value,
            "identical_to_baseline": same,
        }
    sigs = {"bleu": str(signatures[bleu_key]), "chrf": str(signatures[chrf_key])}
    for res in out.values():
        res["signatures"] = sigs
    return out


def bleu_stats(hyps: Sequence[str], refs: Sequence[str]) -> np.ndarray:
    """sacrebleu's per-sentence BLEU sufficient statistics (matches, totals, lengths)."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses for {len(refs)} references")
    return np.array(BLEU()._extract_corpus_statistics(list(hyps), [list(refs)]), dtype="float32")


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
    return stats_paired_bootstrap([(bleu_stats(a, refs), bleu_stats(b, refs)) for a, b in pairs],
                                  n_samples, seed)


def stats_paired_bootstrap(
    pairs: Sequence[tuple[np.ndarray, np.ndarray]], n_samples: int = 1000, seed: int = 12345
) -> dict[str, float]:
    """``seed_paired_bootstrap`` on precomputed ``bleu_stats``."""
    metric = BLEU()

    def score(s: np.ndarray) -> float:
        return metric._compute_score_from_stats(s).score

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
    return {"delta_bleu": diff, "p": 1.0 if not sample_diffs.any() else p,
            "n_seeds": len(pairs), "n_samples": n_samples}
