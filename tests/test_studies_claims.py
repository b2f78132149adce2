"""The verdict rules (``studies.verdicts``) and the claims table, on hand-made comparisons."""

from __future__ import annotations

import numpy as np
import pytest

from fairseq_tying.studies import verdicts
from fairseq_tying.studies.formatting import format_ps, p_digits
from fairseq_tying.studies.stats import t_test_p
from fairseq_tying.studies.verdicts import SEEDS, bootstrap, counts, holm, why_not
from fairseq_tying.studies.view_grid import claims_table, stop_correlation


def comparison(*deltas: float, p: float, per_seed_p: tuple[float, ...] | None = None) -> dict:
    """A ``compare`` result with the given per-seed differences and pooled p."""
    per_seed = {seed: d for seed, d in enumerate(deltas, start=1)}
    ps = per_seed_p or (p,) * len(deltas)
    return {"delta_bleu": sum(deltas) / len(deltas), "p": p, "n_seeds": len(deltas),
            "per_seed_delta": per_seed, "per_seed_p": dict(zip(per_seed, ps, strict=True)),
            "delta_ci95": None}


@pytest.mark.parametrize("deltas, p, expects, expected", [
    ((0.5, 0.4, 0.6), 0.01, "gain", "supported"),
    ((-0.5, -0.4, -0.6), 0.01, "gain", "contradicted"),
    ((0.5, -0.1, 0.6), 0.01, "gain", "unresolved (seeds disagree)"),  # each seed p = 0.01
    ((0.5, 0.4, 0.6), 0.2, "gain", "unresolved (within the test set's noise)"),
    ((2.0,), 0.001, "gain", f"unresolved (1 of {SEEDS} seeds)"),  # one seed decides nothing
    ((1.9, 1.5, 2.2), 0.001, "unchanged", "supported (better)"),
    ((-1.9, -1.5, -2.2), 0.001, "unchanged", "contradicted"),
    ((0.3, -0.2, 0.1), 0.4, "unchanged", "supported (within the test set's noise)"),
    ((-1.9, -1.5), 0.001, "unchanged", f"unresolved (2 of {SEEDS} seeds)"),
])
def test_verdicts_follow_the_rule(deltas, p, expects, expected):
    assert bootstrap(comparison(*deltas, p=p), expects) == expected


def test_holm_matches_statsmodels_and_the_step_down_by_hand():
    statsmodels = pytest.importorskip("statsmodels.stats.multitest")
    rng = np.random.default_rng(0)
    for m in (1, 2, 7, 12):
        ps = list(rng.uniform(0, 0.2, m))
        want = statsmodels.multipletests(ps, method="holm")[1]
        np.testing.assert_allclose(holm(ps), want, rtol=1e-12)
    # the case: seven claims, p = 0.046 is the 4th smallest: 4 × 0.046 = 0.184
    ps = [0.001, 0.001, 0.003, 0.046, 0.417, 0.189, 0.115]
    assert holm(ps) == pytest.approx([0.007, 0.007, 0.015, 0.184, 0.417, 0.378, 0.345])


def test_holm_decides_and_the_reason_names_the_failed_test():
    tests = [comparison(-0.2, -0.3, -0.3, p=0.046), comparison(0.5, 0.5, 0.4, p=0.003),
             comparison(0.1, 0.2, 0.1, p=0.4)]
    assert counts(tests[0])  # alone, at its raw p
    verdicts.adjust(tests)
    assert [t["family"] for t in tests] == [3, 3, 3]
    assert not counts(tests[0]) and why_not(tests[0]) == "not significant after Holm"
    assert bootstrap(tests[0], "gain") == "unresolved (not significant after Holm)"
    assert counts(tests[1]) and tests[1]["p_holm"] == pytest.approx(0.009)
    assert why_not(tests[2]) == "within the test set's noise"
    assert verdicts.outcome(bootstrap(verdicts.without_holm(tests[0]), "gain")) == "contradicted"


def test_seeds_that_are_significant_with_opposite_signs_disagree():
    """The DynamicConv case: each seed significant on its own, signs −, +, −."""
    test = comparison(-0.46, 0.47, -0.51, p=0.115, per_seed_p=(0.032, 0.029, 0.014))
    assert why_not(test) == "seeds disagree"
    noise = comparison(-0.46, 0.47, -0.51, p=0.115, per_seed_p=(0.3, 0.029, 0.2))
    assert why_not(noise) == "within the test set's noise"  # one significant seed: no conflict
    mixed = comparison(0.5, -0.1, 0.6, p=0.01, per_seed_p=(0.01, 0.5, 0.01))
    assert why_not(mixed) == "seeds differ in sign"


def test_the_interval_rule_is_the_t_test_and_holm_adjusts_it():
    from scipy import stats

    diffs = [-0.5, -0.6, -0.55]
    p = t_test_p(diffs)
    assert p == pytest.approx(stats.ttest_1samp(diffs, 0).pvalue)
    diff = {"mean": np.mean(diffs), "ci95": 0.1, "p": p}
    assert verdicts.interval(diff) == "supported"
    assert verdicts.interval({**diff, "p_holm": 0.2}) == "unresolved"
    assert verdicts.interval({**diff, "mean": 0.5}) == "contradicted"
    assert t_test_p([0.0, 0.0, 0.0]) == 1.0 and t_test_p([0.3]) == 1.0


def test_a_difference_at_p_alpha_does_not_count():
    assert not counts(comparison(0.5, 0.4, 0.6, p=0.05))
    assert counts(comparison(0.5, 0.4, 0.6, p=0.049))


def test_the_table_lists_only_the_claims_the_study_has_cells_for():
    summary = {"three_way/dot": {"vs_untied": comparison(1.9, 1.5, 2.2, p=0.001)},
               "three_way/l2norm": {"vs_dot": comparison(-0.3, p=0.09)},
               "none/l2norm": {"vs_dot": comparison(0.5, 0.4, 0.6, p=0.01)}}
    lines = claims_table(summary).splitlines()[2:]
    assert len(lines) == 2
    assert "three-way tying keeps BLEU" in lines[0] and "supported (better)" in lines[0]
    assert "+1.87 (p = 0.001; [0.001, 0.001, 0.001])" in lines[0]  # no family adjusted here
    assert "`l2norm` beats `dot` (three-way tying)" in lines[1] and "-0.30 (p = 0.090" in lines[1]
    assert claims_table({"none/dot": {}}) is None


def test_the_stop_correlation_needs_three_runs_at_different_epochs():
    def cell(epochs: list[int], bleu: list[float]) -> dict:
        return {"stop": {"epochs": epochs}, "bleu": {"values": bleu}}

    assert stop_correlation({"a": cell([20, 21], [28.0, 29.0])}) is None
    assert stop_correlation({"a": cell([20, 20], [28.0, 29.0]), "b": cell([20], [27.0])}) is None
    r, _p, n = stop_correlation({"a": cell([20, 30], [28.0, 30.0]), "b": cell([25], [28.5])})
    assert n == 3 and r == pytest.approx(np.corrcoef([20, 30, 25], [28.0, 30.0, 28.5])[0, 1])


@pytest.mark.parametrize("p, text", [
    (0.0004, "< 0.001"), (0.046, "0.046"), (0.3776, "0.378"),
    (0.04995004995, "0.04995"),  # 10/1001 bootstrap samples × 5 claims: holds at α = 0.05
    (0.0504, "0.050"), (0.05, "0.050"),  # at or above α: "0.050" reads as not significant
])
def test_a_printed_p_is_on_the_same_side_of_alpha_as_p(p, text):
    """Three digits would print 0.04995 as 0.050 beside a verdict that holds at p < 0.05."""
    assert p_digits(p) == text
    assert format_ps({"p": 0.01, "p_holm": p}).endswith(f"Holm {text}")
