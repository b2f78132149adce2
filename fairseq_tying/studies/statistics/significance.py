"""The comparisons of two cells, seed by seed: the paired bootstrap resampling of BLEU/chrF
differences (on sacrebleu's per-sentence statistics and its draws, pooled over seeds, with a
two-sided p), and the per-seed difference of a value."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from fairseq_tying.evaluation.metrics import METRICS
from fairseq_tying.studies.records.record import Record
from fairseq_tying.studies.statistics.cells import Bootstrap, SeedDifference, Stat
from fairseq_tying.studies.statistics.stats import mean_ci, t_test_p


def metric_stats(hyps: Sequence[str], refs: Sequence[str], metric: str = "bleu") -> np.ndarray:
    """sacrebleu's per-sentence sufficient statistics of ``metric`` (for BLEU: matches, totals,
    lengths); a corpus score is computed from their sum."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses for {len(refs)} references")
    return np.array(_reference_scorer(metric, tuple(refs))._extract_corpus_statistics(
        list(hyps), None), dtype="float32")


@lru_cache(maxsize=4)
def _reference_scorer(metric: str, refs: tuple[str, ...]):
    """``metric``'s scorer with the references tokenized and counted once (sacrebleu's
    reference cache, read-only), so that each run's statistics cost its hypotheses alone."""
    return METRICS[metric].scorer(references=[list(refs)])


def seed_paired_bootstrap(
    pairs: Sequence[tuple[Sequence[str], Sequence[str]]],
    refs: Sequence[str],
    n_samples: int = 1000,
    seed: int = 12345,
) -> dict[str, float]:
    """Paired bootstrap of BLEU over several seeds at once: ``pairs`` holds one
    ``(system, baseline)`` hypothesis pair per seed, all translating ``refs``.

    Every resample draws one set of sentence indices and applies it to all pairs, so the test
    statistic is the mean (over seeds) of the corpus-BLEU difference; ``p`` is two-sided
    (``_pooled``), ``p_sacrebleu`` the p of sacrebleu's ``PairedTest`` from the same draws
    (with one pair and the same seed, sacrebleu's own p-value).
    """
    return stats_paired_bootstrap([(metric_stats(a, refs), metric_stats(b, refs))
                                   for a, b in pairs], n_samples, seed)


def stats_paired_bootstrap(
    pairs: Sequence[tuple[np.ndarray, np.ndarray]], n_samples: int = 1000, seed: int = 12345,
    metric: str = "bleu",
) -> dict[str, float]:
    """``seed_paired_bootstrap`` on precomputed ``metric_stats``; the difference of the means
    is ``delta_bleu`` (``delta_chrf`` for chrF)."""
    observed, sampled = paired_samples(pairs, n_samples, seed, metric)
    return _pooled(observed, sampled, metric)


def paired_samples(pairs: Sequence[tuple[np.ndarray, np.ndarray]], n_samples: int,
                   seed: int = 12345, metric: str = "bleu") -> tuple[np.ndarray, np.ndarray]:
    """Each pair's observed difference (k,) and its difference in each resample (k, B); the
    resamples draw the same sentences for every pair (``resample_counts``)."""
    counts = resample_counts(len(pairs[0][0]), n_samples, seed)
    scorer, scores = _scorer(metric), _scores(metric)

    def score(s: np.ndarray) -> float:
        return scorer._compute_score_from_stats(s).score

    observed = np.array([score(a.sum(0)) - score(b.sum(0)) for a, b in pairs])
    sampled = np.array([scores(counts @ a.astype(np.float64))
                        - scores(counts @ b.astype(np.float64)) for a, b in pairs])
    return observed, sampled


def _pooled(observed: np.ndarray, sampled: np.ndarray, metric: str) -> dict[str, Any]:
    """The two-sided p of the mean (over pairs) difference d from B resamples m_1..m_B: the
    resampled differences centred on their mean stand for the null distribution, and

        p = (#{b : |m_b − m̄| ≥ |d|} + 1) / (B + 1),

    so p ≥ 1/(B + 1), and p = 1 for d = 0. Beside it ``p_sacrebleu``, sacrebleu's
    ``PairedTest`` p, which centres the *absolute* differences, #{b : |m_b| − mean|m| > |d|}:
    about half the two-sided p, and far below 1 for d near 0 (one-tailed in effect)."""
    diff, n_samples = float(observed.mean()), sampled.shape[1]
    means = sampled.mean(0)
    p = (int(np.sum(np.abs(means - means.mean()) >= abs(diff))) + 1) / (n_samples + 1)
    absolute = np.abs(means)
    theirs = (int(np.sum(absolute - absolute.mean() > abs(diff))) + 1) / (n_samples + 1)
    return {f"delta_{metric}": diff, "p": p,
            "p_sacrebleu": 1.0 if not absolute.any() else theirs,
            "n_seeds": len(observed), "n_samples": n_samples}


@lru_cache(maxsize=1)
def resample_counts(n: int, n_samples: int, seed: int = 12345) -> np.ndarray:
    """How often each of ``n`` sentences is drawn in each of ``n_samples`` resamples (B, n):
    the draws of sacrebleu's ``rng.choice(n, size=(B, n))``, made in blocks of rows (the same
    stream), so that a resample's statistics are one product, ``counts @ stats``."""
    rng, rows = np.random.default_rng(seed), []
    for start in range(0, n_samples, _BLOCK):
        idxs = rng.choice(n, size=(min(_BLOCK, n_samples - start), n))
        offsets = (idxs + n * np.arange(len(idxs))[:, None]).ravel()
        rows.append(np.bincount(offsets, minlength=idxs.size).reshape(idxs.shape))
    counts = np.concatenate(rows).astype(np.float64)
    counts.flags.writeable = False  # shared by every call with the same draws
    return counts


_BLOCK = 500  # resamples drawn at once: (500, n) indices, not (B, n)


def _scores(metric: str) -> Callable[[np.ndarray], np.ndarray]:
    """The corpus scores of rows of summed statistics (R, k) -> (R,): BLEU vectorized
    (``bleu_scores``), any other metric through sacrebleu row by row."""
    scorer = _scorer(metric)
    if metric == "bleu" and _is_default_bleu(scorer):
        return bleu_scores
    if metric == "chrf" and (scorer.beta, scorer.eps_smoothing) == (2, False):
        return chrf_scores
    return lambda rows: np.array([scorer._compute_score_from_stats(r).score for r in rows])


def _is_default_bleu(scorer) -> bool:
    return (scorer.smooth_method, scorer.effective_order, scorer.max_ngram_order) == \
        ("exp", False, 4)


def bleu_scores(stats: np.ndarray) -> np.ndarray:
    """sacrebleu's corpus BLEU (exp smoothing, 4-grams) of rows of summed statistics
    ``[hyp_len, ref_len, correct_1..4, total_1..4]``:

        BLEU = BP · exp(¼ Σ_n log p_n),  p_n = 100 · correct_n / total_n,
        BP = exp(1 − ref_len / hyp_len) if hyp_len < ref_len else 1

    in numpy over all rows; a row with an n-gram order without a match or without n-grams
    (where sacrebleu smooths or stops) is scored by sacrebleu itself."""
    sys_len, ref_len = stats[:, 0], stats[:, 1]
    correct, total = stats[:, 2:6], stats[:, 6:10]
    plain = (correct > 0).all(1) & (total > 0).all(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log(100.0 * correct / total)
        bp = np.where(sys_len < ref_len, np.exp(1 - ref_len / sys_len), 1.0)
        # summed left to right, as sacrebleu's sum() does
        out = bp * np.exp((logs[:, 0] + logs[:, 1] + logs[:, 2] + logs[:, 3]) / 4)
    if not plain.all():
        scorer = _scorer("bleu")
        out[~plain] = [scorer._compute_score_from_stats(r).score for r in stats[~plain]]
    return out


def chrf_scores(stats: np.ndarray) -> np.ndarray:
    """sacrebleu's corpus chrF (β = 2, effective-order averaging) of rows of summed statistics
    ``[hyp_n, ref_n, match_n]`` for each character order n:

        P = mean_n match_n / hyp_n,  R = mean_n match_n / ref_n   (over the orders with
        hyp_n > 0 and ref_n > 0),  chrF = 100 · (1 + β²) P R / (β² P + R)  (0 if P + R = 0)

    in numpy over all rows."""
    hyp, ref, match = stats[:, 0::3], stats[:, 1::3], stats[:, 2::3]
    valid = (hyp > 0) & (ref > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        prec = np.where(valid, match / np.where(hyp > 0, hyp, 1), 0.0)
        rec = np.where(valid, match / np.where(ref > 0, ref, 1), 0.0)
        orders = valid.sum(1)
        p = np.where(orders > 0, prec.sum(1) / np.maximum(orders, 1), 0.0)
        r = np.where(orders > 0, rec.sum(1) / np.maximum(orders, 1), 0.0)
        beta2 = 4.0
        return np.where(p + r > 0, 100 * (1 + beta2) * p * r / (beta2 * p + r), 0.0)


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
            metric: str = "bleu", documents: Sequence[str] | None = None) -> Bootstrap:
    """Paired bootstrap of ``metric`` over ``(key, run, baseline run)`` pairs of records (one
    per seed): pooled over the pairs (``delta``, ``p``; ``delta_ci95`` over the pairs'
    differences: training variance) and per pair (``per_seed_p``, ``per_seed_delta``, keyed
    by ``key``); with ``documents`` (one name per test sentence) the mean difference on each
    document's sentences alone (``per_document``)."""
    stats = [(sentence_stats(run, metric, refs), sentence_stats(base, metric, refs))
             for _, run, base in pairs]
    by_document = {} if documents is None else per_document(stats, documents, metric)
    observed, sampled = paired_samples(stats, n_samples, metric=metric)
    pooled = _pooled(observed, sampled, metric)
    # each pair alone: its row of the same resamples, as a bootstrap of that pair would draw
    singles = {key: _pooled(observed[k:k + 1], sampled[k:k + 1], metric)
               for k, (key, _, _) in enumerate(pairs)}
    deltas = {k: t[f"delta_{metric}"] for k, t in singles.items()}
    half = mean_ci(list(deltas.values()))[1]
    return Bootstrap(delta=pooled[f"delta_{metric}"], p=pooled["p"], n_seeds=pooled["n_seeds"],
                     n_samples=pooled["n_samples"], metric=metric, per_seed_delta=deltas,
                     per_seed_p={k: t["p"] for k, t in singles.items()},
                     delta_ci95=None if np.isnan(half) else half, per_document=by_document)


def per_document(stats: Sequence[tuple[np.ndarray, np.ndarray]], documents: Sequence[str],
                 metric: str) -> dict[str, float]:
    """Per document, named with its number of sentences (``John (879)``, in order of first
    appearance): the mean over the pairs of the corpus ``metric`` difference on that
    document's sentences alone."""
    if len(documents) != len(stats[0][0]):
        raise ValueError(f"{len(documents)} document names for {len(stats[0][0])} sentences")
    scorer = _scorer(metric)
    names = np.asarray(documents)
    out = {}
    for doc in dict.fromkeys(documents):
        rows = names == doc
        out[f"{doc} ({rows.sum()})"] = float(np.mean([
            scorer._compute_score_from_stats(a[rows].sum(0)).score
            - scorer._compute_score_from_stats(b[rows].sum(0)).score for a, b in stats]))
    return out


def seed_difference(runs: dict[int, Any], base: dict[int, Any], metric: str
                    ) -> SeedDifference | None:
    """Per-seed ``metric`` of ``runs`` minus ``base`` (paired by seed): the Stat of the
    differences, the seeds and the t-test's ``p`` (its verdict comes with the study's family,
    ``specs.LM``); None without shared seeds, or where a run lacks an optional metric."""
    shared = sorted(set(runs) & set(base))
    get = METRICS[metric].of
    if not shared or any(get(r[s]) is None for r in (runs, base) for s in shared):
        return None
    values = [get(runs[s]) - get(base[s]) for s in shared]
    return SeedDifference(stat=Stat.of(values), p=t_test_p(values), seeds=tuple(shared))
