"""The word-similarity ρ's interval and the tests of two matrices' ρ on the same pairs
(fairseq_tying/analysis/intervals.py), against computations made here with scipy alone."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm, spearmanr

from fairseq_tying.analysis import MatrixReport, ModelReport, markdown
from fairseq_tying.analysis.intervals import (
    bound_difference,
    fisher_interval,
    paired_bootstrap,
    spearman_rows,
)


def _pairs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Human ratings with ties (SimLex's are on a 0–10 scale), a matrix's cosines that follow
    them, and another's that do not."""
    rng = np.random.default_rng(seed)
    human = np.round(rng.uniform(0, 10, n), 1)
    good = human / 10 + rng.normal(0, 0.15, n)
    noise = rng.normal(0, 1, n)
    return human, good, noise


def test_the_interval_is_fisher_z_with_bonett_and_wrights_error():
    rho, n = 0.709, 24
    se = math.sqrt((1 + rho ** 2 / 2) / (n - 3))
    expected = np.tanh(np.arctanh(rho) + np.array([-1, 1]) * norm.ppf(0.975) * se)
    assert fisher_interval(rho, n) == pytest.approx(tuple(expected), abs=1e-12)
    assert fisher_interval(None, 24) is None and fisher_interval(0.5, 3) is None


def test_the_interval_covers_the_true_rho_about_95_times_in_100():
    """Spearman ρ of bivariate normal samples (n = 40) whose population Spearman ρ is
    (6/π)·asin(r/2): the interval should hold it in about 95 % of 600 samples."""
    rng = np.random.default_rng(7)
    r = 0.6
    true = 6 / math.pi * math.asin(r / 2)
    cov = [[1, r], [r, 1]]
    held = 0
    for _ in range(600):
        x = rng.multivariate_normal([0, 0], cov, 40)
        low, high = fisher_interval(spearmanr(x[:, 0], x[:, 1])[0], 40)
        held += low <= true <= high
    assert 0.92 <= held / 600 <= 0.98


def test_spearman_of_each_row_is_scipys():
    human, good, noise = _pairs(50, 1)
    rows = np.random.default_rng(2).integers(0, 50, size=(20, 50))
    got = spearman_rows(human[rows], good[rows])
    assert got == pytest.approx([spearmanr(human[r], good[r])[0] for r in rows], abs=1e-12)
    assert np.isnan(spearman_rows(np.ones((1, 5)), np.arange(5.0)[None]))[0]


@pytest.mark.parametrize("other", ["noise", "noisier"])
def test_the_paired_bootstrap_is_scipy_on_the_same_resamples(other):
    human, good, noise = _pairs(60, 3)
    # noisier: the same ratings followed less closely, a difference the test cannot settle
    b = noise if other == "noise" else good + np.random.default_rng(4).normal(0, 0.1, 60)
    draws, seed = 400, 11
    got = paired_bootstrap(human, good, b, draws=draws, seed=seed)
    # the draws as the module documents them, each resample's ρ by scipy
    idx = np.random.default_rng(seed).integers(0, 60, size=(draws, 60))
    diffs = np.array([spearmanr(human[i], good[i])[0] - spearmanr(human[i], b[i])[0]
                      for i in idx])
    assert got.method == "bootstrap"
    assert got.estimate == pytest.approx(spearmanr(human, good)[0] - spearmanr(human, b)[0])
    assert (got.low, got.high) == pytest.approx(tuple(np.percentile(diffs, [2.5, 97.5])))
    assert got.p == pytest.approx(min(1, 2 * min(np.mean(diffs <= 0), np.mean(diffs >= 0))))
    assert (got.p < 0.01) if other == "noise" else (0.05 < got.p < 1)


def test_two_identical_matrices_do_not_differ():
    human, good, _ = _pairs(80, 4)
    same = paired_bootstrap(human, good, good.copy(), draws=500)
    assert (same.estimate, same.low, same.high, same.p) == (0, 0, 0, 1)
    bound = bound_difference(0.4, 80, 0.4, 80)
    assert bound.estimate == 0 and bound.low < 0 < bound.high and bound.p == 1


def test_a_matrix_that_follows_the_ratings_differs_from_noise():
    human, good, noise = _pairs(120, 5)
    d = paired_bootstrap(human, good, noise, draws=2000)
    assert d.estimate > 0.5 and d.low > 0 and d.p < 0.01
    rho_good, rho_noise = spearmanr(human, good)[0], spearmanr(human, noise)[0]
    bound = bound_difference(rho_good, 120, rho_noise, 120)
    assert bound.low > 0 and bound.p < 0.01
    assert bound.high - bound.low > d.high - d.low  # the bound is wider than the paired test


@pytest.mark.parametrize("rho_a, n_a, rho_b, n_b", [(0.709, 24, 0.211, 24),
                                                     (0.253, 117, -0.076, 117),
                                                     (0.5, 300, 0.3, 300), (0.7, 60, 0.1, 60)])
def test_the_bound_is_the_two_intervals_at_97_5_percent_and_its_p_where_it_reaches_zero(
        rho_a, n_a, rho_b, n_b):
    a, b = fisher_interval(rho_a, n_a, 0.975), fisher_interval(rho_b, n_b, 0.975)
    d = bound_difference(rho_a, n_a, rho_b, n_b)
    assert (d.low, d.high) == pytest.approx((a[0] - b[1], a[1] - b[0]), abs=1e-12)
    # at level 1 − p the two (1 − p/2) intervals just touch
    if d.p < 1:
        a, b = fisher_interval(rho_a, n_a, 1 - d.p / 2), fisher_interval(rho_b, n_b, 1 - d.p / 2)
        assert a[0] == pytest.approx(b[1], abs=1e-9)
    assert (d.low > 0) == (d.p < 0.05)


def _report(label: str, cosines: list[np.ndarray] | None, rhos: list[float]) -> ModelReport:
    sims = [{"SimLex-999": {"spearman": rho, "pvalue": None, "pairs_scored": 60,
                            "pairs_total": 60,
                            **({"cosines": list(c)} if cosines is not None else {})}}
            for rho, c in zip(rhos, cosines or [None] * len(rhos), strict=True)]
    roles = [["decoder input"], ["decoder output"]]
    return ModelReport("ckpt", label, "arch", "none", "dot", 1, [
        MatrixReport(f"k{i}", roles[i], 10, 4, sims[i], 0.0, 0.0, 1.0, 10, 0, None)
        for i in range(2)])


def test_the_table_gives_each_rho_its_interval_and_each_two_matrices_their_difference():
    human, good, noise = _pairs(60, 6)
    rhos = [spearmanr(human, noise)[0], spearmanr(human, good)[0]]
    paired = markdown([_report("m", [noise, good], rhos)], "rows", {"SimLex-999": list(human)})
    low, high = fisher_interval(rhos[1], 60)
    assert f"| {rhos[1]:.3f} [{low:.2f}, {high:.2f}] (60/60) |" in paired
    d = paired_bootstrap(human, good, noise)
    assert (f"| m | decoder output − decoder input | {d.estimate:+.3f} [{d.low:+.2f}, "
            f"{d.high:+.2f}], p < 0.001 |") in paired
    assert "paired bootstrap" in paired and "no paired test" not in paired
    # without the pairs' cosines: the bound, and the note says so
    bound = markdown([_report("m", None, rhos)], "rows")
    b = bound_difference(rhos[1], 60, rhos[0], 60)
    assert f"| {b.estimate:+.3f} [{b.low:+.2f}, {b.high:+.2f}]," in bound
    assert "no paired test" in bound and "paired bootstrap" not in bound
    # a model of one matrix has nothing to compare
    one = _report("tied", None, rhos)
    one.matrices = one.matrices[:1]
    assert "ρ difference" not in markdown([one], "rows")
