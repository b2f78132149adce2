"""The verdict rules (``studies.statistics.verdicts``: the bootstrap rule, equivalence, Holm,
the bootstrap's resolution), the claims table and the short answer's rows, on hand-made
comparisons."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fairseq_tying.studies.engine import specs
from fairseq_tying.studies.statistics import verdicts
from fairseq_tying.studies.statistics.cells import (
    Bootstrap,
    Cell,
    Equivalence,
    GridHead,
    SeedDifference,
    Stat,
    Stops,
)
from fairseq_tying.studies.statistics.stats import t_test_p, tost
from fairseq_tying.studies.statistics.verdicts import SEEDS, bootstrap, counts, holm, why_not
from fairseq_tying.studies.views import formatting, view_answer
from fairseq_tying.studies.views.formatting import format_ps, p_digits
from fairseq_tying.studies.views.view_grid import claims_table, stop_correlation


def comparison(*deltas: float, p: float, per_seed_p: tuple[float, ...] | None = None
               ) -> Bootstrap:
    """A ``compare`` result with the given per-seed differences and pooled p."""
    per_seed = {seed: d for seed, d in enumerate(deltas, start=1)}
    ps = per_seed_p or (p,) * len(deltas)
    return Bootstrap(delta=sum(deltas) / len(deltas), p=p, n_seeds=len(deltas),
                     per_seed_delta=per_seed, per_seed_p=dict(zip(per_seed, ps, strict=True)),
                     delta_ci95=None)


@pytest.mark.parametrize("deltas, p, expects, expected", [
    ((0.5, 0.4, 0.6), 0.01, "gain", "supported"),
    ((-0.5, -0.4, -0.6), 0.01, "gain", "contradicted"),
    ((0.5, -0.1, 0.6), 0.01, "gain", "unresolved (seeds disagree)"),  # each seed p = 0.01
    ((0.5, 0.4, 0.6), 0.2, "gain", "unresolved (within the test set's noise)"),
    ((2.0,), 0.001, "gain", f"unresolved (1 of {SEEDS} seeds)"),  # one seed decides nothing
    # BLEU moved: a counted difference outside the margin contradicts "unchanged", either way
    ((1.9, 1.5, 2.2), 0.001, "unchanged", "contradicted (better)"),
    ((-1.9, -1.5, -2.2), 0.001, "unchanged", "contradicted (worse)"),
    # no difference shown, and the 90 % interval (−0.36, +0.49) inside ±0.5: equivalent
    ((0.3, -0.2, 0.1), 0.4, "unchanged", "supported (equivalent within ±0.5)"),
    # no difference shown either, but the seeds spread: no evidence that BLEU is unchanged
    ((0.6, -0.4, 0.1), 0.4, "unchanged", "unresolved (90 % interval -0.74 to +0.94 exceeds ±0.5)"),
    # a counted difference inside the margin: equivalent, and better
    ((0.10, 0.12, 0.11), 0.001, "unchanged", "supported (equivalent within ±0.5; better)"),
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
    tests = verdicts.adjust(tests)
    assert [t.family for t in tests] == [3, 3, 3]
    assert not counts(tests[0]) and why_not(tests[0]) == "not significant after Holm"
    assert bootstrap(tests[0], "gain") == "unresolved (not significant after Holm)"
    assert counts(tests[1]) and tests[1].p_holm == pytest.approx(0.009)
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


def test_the_per_seed_rule_is_the_t_test_and_holm_adjusts_it():
    from scipy import stats

    diffs = [-0.5, -0.6, -0.55]
    p = t_test_p(diffs)
    assert p == pytest.approx(stats.ttest_1samp(diffs, 0).pvalue)
    diff = SeedDifference(stat=Stat(tuple(diffs), np.mean(diffs), 0.1), p=p, seeds=(1, 2, 3))
    assert verdicts.lower(diff) == "supported" and counts(diff)
    assert verdicts.lower(replace(diff, p_holm=0.2)) == "unresolved (not significant after Holm)"
    up = Stat.of([0.5, 0.6, 0.55])
    assert verdicts.lower(replace(diff, stat=up)) == "contradicted"
    assert t_test_p([0.0, 0.0, 0.0]) == 1.0 and t_test_p([0.3]) == 1.0


def test_a_difference_at_p_alpha_does_not_count():
    assert not counts(comparison(0.5, 0.4, 0.6, p=0.05))
    assert counts(comparison(0.5, 0.4, 0.6, p=0.049))


def _cell(tying: str, layer: str, bleu: dict[int, float], params: int = 0,
          **tests: Bootstrap) -> Cell:
    """A summary's cell: its seeds' BLEU (their mean, no CI), its parameters and its
    comparisons."""
    values = (*bleu.values(),)
    return Cell(GridHead(tying, layer), {"seeds": (*bleu,), "bleu": Stat(
        values, float(np.mean(values)), None), "params": (params,)}, tests)


def test_a_grid_without_untied_or_three_way_dot_still_answers_its_claims():
    """A decoder-tied grid of ``dot`` and ``l2norm`` makes one of the answer's comparisons,
    l2norm against dot, and the short answer states it (``sweep_summary`` makes the answer of
    such a sweep); a grid of one cell makes none."""
    assert [c.cell for c in specs.claims_between({("decoder", "dot"), ("decoder", "l2norm")})] \
        == ["decoder/l2norm"]
    assert specs.claims_between({("three_way", "dot")}) == []
    summary = {"decoder/dot": _cell("decoder", "dot", {1: 28.0, 2: 28.1, 3: 28.2}),
               "decoder/l2norm": _cell("decoder", "l2norm", {1: 28.5, 2: 28.5, 3: 28.8},
                                       vs_dot=comparison(0.5, 0.4, 0.6, p=0.01))}
    [words] = view_answer.in_words(summary)
    assert words.startswith("`l2norm` against `dot` (decoder tying): ") and "+0.50 BLEU" in words
    rows = {row[1]: row for row in view_answer.rows(summary)}  # dot: its claim has no pair
    assert rows["`dot`"][4:] == ["–", "–", "–"] and rows["`l2norm`"][4].endswith("over `dot`")


def test_the_table_lists_only_the_claims_the_study_has_cells_for():
    summary = {"none/dot": _cell("none", "dot", {1: 28.0, 2: 28.1, 3: 28.2}),
               "three_way/dot": _cell("three_way", "dot", {1: 29.9, 2: 29.6, 3: 30.4},
                                      vs_untied=comparison(1.9, 1.5, 2.2, p=0.001)),
               "three_way/l2norm": _cell("three_way", "l2norm", {1: 29.6},
                                         vs_dot=comparison(-0.3, p=0.09)),
               "none/l2norm": _cell("none", "l2norm", {1: 28.5, 2: 28.5, 3: 28.8},
                                    vs_dot=comparison(0.5, 0.4, 0.6, p=0.01))}
    lines = claims_table(summary).splitlines()[2:]
    assert len(lines) == 2
    # BLEU rose by more than the margin: the rule's "contradicted (better)" of "tying keeps
    # BLEU", and a gain that does not go against Press & Wolf's claim of no harm
    assert "three-way tying does not harm BLEU" in lines[0] and "supported (better)" in lines[0]
    assert "+1.87 (p = 0.001; [0.001, 0.001, 0.001])" in lines[0]  # no family adjusted here
    # one seed of l2norm against three of dot: the Δ's two means are over seed 1 alone
    assert "`l2norm` beats `dot` (three-way tying)" in lines[1]
    assert "-0.30 (seed 1: 29.60 − 29.90; p = 0.090" in lines[1]
    assert claims_table({"none/dot": _cell("none", "dot", {1: 28.0})}) is None


@pytest.mark.parametrize("deltas, expects, rule, paper", [
    ((-0.5, -0.4, -0.6), "gain", "contradicted", "not replicated here (worse)"),
    ((1.9, 1.5, 2.2), "unchanged", "contradicted (better)", "not replicated here (better)"),
    ((-1.9, -1.5, -2.2), "unchanged", "contradicted (worse)", "not replicated here (worse)"),
    ((0.5, 0.4, 0.6), "gain", "supported", "supported"),
    ((0.5, -0.1, 0.6), "gain", "unresolved (seeds disagree)", "unresolved (seeds disagree)"),
])
def test_a_paper_claim_against_a_counted_difference_is_not_replicated_here(deltas, expects,
                                                                           rule, paper):
    """The rule's words are the verdict on a hypothesis about this data; a paper's claim
    measured on another corpus and model that a counted difference goes against reads "not
    replicated here", with the direction the difference took."""
    test = comparison(*deltas, p=0.001 if expects == "unchanged" else 0.01)
    assert bootstrap(test, expects) == rule
    assert verdicts.on_paper(rule, test) == paper
    assert verdicts.paper_outcome(verdicts.outcome(rule), test) == verdicts.outcome(paper)


@pytest.mark.parametrize("deltas, p, rule, paper", [
    ((1.9, 1.5, 2.2), 0.001, "contradicted (better)", "supported (better)"),
    ((-1.9, -1.5, -2.2), 0.001, "contradicted (worse)", "not replicated here (worse)"),
    ((0.1, -0.05, 0.05), 0.5, "supported (equivalent within ±0.5)",
     "supported (equivalent within ±0.5)"),
    ((-0.1, -0.5, -0.9), 0.2, "unresolved (90 % interval -1.17 to +0.17 exceeds ±0.5)",
     "unresolved (90 % interval -1.17 to +0.17 exceeds ±0.5)"),
])
def test_a_papers_claim_of_no_harm_is_supported_by_a_counted_gain(deltas, p, rule, paper):
    """Press & Wolf claim that tying does no harm, which the study tests as "BLEU unchanged":
    equivalence supports both; a gain that counts contradicts "unchanged" but not "no harm",
    so it reads "supported (better)"; a loss that counts is "not replicated here (worse)"; an
    interval that leaves the margin below 0 decides nothing. Holm's changes read alike."""
    test = comparison(*deltas, p=p)
    assert bootstrap(test, verdicts.UNCHANGED) == rule
    assert verdicts.on_paper(rule, test, verdicts.NO_HARM) == paper
    assert verdicts.paper_outcome(verdicts.outcome(rule), test, verdicts.NO_HARM) == \
        verdicts.outcome(paper)
    (tying,) = [c for c in specs.study_claims() if c.cell == "three_way/dot"]
    assert tying.source == specs.PRESS_WOLF and tying.paper == verdicts.NO_HARM
    assert tying.expects == verdicts.UNCHANGED  # the study's own claim, the answer's


def _against(delta: float, p: float) -> dict[str, Cell]:
    """A study whose three-way ``dot`` is ``delta`` BLEU above untied on each of 3 seeds, and
    whose ``l2norm`` is as far below ``dot`` (bootstrap p = ``p``)."""
    base = {1: 28.0, 2: 28.1, 3: 28.2}
    up = {s: b + delta for s, b in base.items()}
    return {"none/dot": _cell("none", "dot", base, 2_000_000),
            "three_way/dot": _cell("three_way", "dot", up, 1_000_000,
                                   vs_untied=comparison(delta, delta, delta, p=p)),
            "three_way/l2norm": _cell("three_way", "l2norm", base, 1_000_000,
                                      vs_dot=comparison(-delta, -delta, -delta, p=p))}


def test_the_papers_claims_read_not_replicated_and_the_answer_keeps_the_rules_words():
    """The same counted differences: in the papers' claims table (a source column) Liu et al.'s
    gain reads "not replicated here", Press & Wolf's "no harm" is supported by the gain, and no
    verdict says "contradicted"; the answer, whose claims are hypotheses on this data, keeps
    the rule's words; the legend says why."""
    summary = _against(1.5, 0.001)
    table = claims_table(summary)
    verdict = {row[0]: row[-1] for row in (
        [c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:])}
    assert verdict == {"three-way tying does not harm BLEU (`dot`)": "supported (better)",
                       "`l2norm` beats `dot` (three-way tying)": "not replicated here (worse)"}
    worse = claims_table(_against(-1.5, 0.001))
    assert "| not replicated here (worse) |" in worse.splitlines()[2]  # tying cost BLEU
    assert "contradicted" not in table
    rows = {(row[0], row[1]): row[-1] for row in view_answer.rows(summary)}
    assert rows[("three_way", "`dot`")] == "contradicted (better)"
    assert rows[("three_way", "`l2norm`")] == "contradicted"
    legend = formatting.legend(*specs.family_of([summary]), papers=True)
    assert verdicts.PAPER_RULE in legend
    assert verdicts.PAPER_RULE not in formatting.legend(*specs.family_of([summary]))


def test_the_stop_correlation_needs_three_runs_at_different_epochs():
    def cell(epochs: list[int], bleu: list[float]) -> Cell:
        return Cell(GridHead("none", "dot"), {
            "bleu": Stat(tuple(bleu), float(np.mean(bleu)), None),
            "stop": Stops(tuple(epochs), ("plateau",) * len(epochs))})

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
    assert format_ps(replace(comparison(0.5, p=0.01), p_holm=p)).endswith(f"Holm {text}")


@pytest.mark.parametrize("samples, m, raw, holm", [
    (10_000, 14, "≤ 0.0001", "≤ 0.0014 (floor)"), (1000, 5, "≤ 0.000999", "≤ 0.005 (floor)"),
    (20_000, 14, "≤ 0.00005", "≤ 0.0007 (floor)"),  # never 5e-05
    (100_000, 60, "≤ 0.00001", "≤ 0.0006 (floor)")])
def test_a_p_at_its_floor_reads_so_with_the_floors_digits(samples, m, raw, holm):
    """A bootstrap p at 1/(B + 1) and its Holm p at m/(B + 1) print "≤" and the floor in fixed
    notation, the numbers the legend states; each seed's p at the floor, in brackets, too."""
    family = verdicts.adjust([replace(comparison(0.5, 0.4, 0.6, p=1 / (samples + 1)),
                                      n_samples=samples) for _ in range(m)])
    test = family[0]
    assert format_ps(test) == f"p {raw}, Holm {holm}"
    assert f"[{raw.replace(' ', '')}, {raw.replace(' ', '')}, {raw.replace(' ', '')}]" in \
        formatting.format_delta(test)
    legend = formatting.legend(family, set())
    assert f"1/(B + 1) = {raw[2:]}," in legend
    assert f"m/(B + 1) = {holm[2:].removesuffix(' (floor)')} (a p at its floor reads ≤" in legend
    assert "e-0" not in legend + format_ps(test)


def test_a_p_above_its_floor_never_reads_at_or_below_it():
    """Three decimals would print a Holm p of 0.00145 as "0.001", under a legend whose floor
    is 14/10,001 = 0.0014: it takes the digits that keep it above the floor, as a raw p just
    above 1/(B + 1) does; an equivalence p (a t-test's) has no floor and reads "< 0.001"."""
    floor = 1 / 10_001
    test = replace(comparison(0.5, 0.4, 0.6, p=2 * floor), n_samples=10_000, p_holm=0.00145,
                   family=14)
    assert format_ps(test) == "p = 0.0002, Holm 0.00145"
    assert p_digits(1.05 * floor, floor=floor) == "0.000105"
    assert p_digits(0.0015, floor=14 * floor) == "0.002"  # three decimals read above 0.0014
    eq = Equivalence(margin=0.5, low=-0.1, high=0.1, p=1e-5, n=5, p_holm=14e-5, family=14)
    assert format_ps(eq) == "p < 0.001, Holm < 0.001"


@pytest.mark.parametrize("deltas", [(0.3, -0.2, 0.1), (0.6, -0.4, 0.1), (0.45, 0.2, 0.4, 0.3),
                                    (-0.1, -0.35, -0.2, -0.3, -0.05), (1.9, 1.5, 2.2)])
@pytest.mark.parametrize("margin", [0.5, 0.25])
def test_equivalence_is_two_one_sided_t_tests(deltas, margin):
    """TOST against scipy: p is the larger of the one-sided t-tests of mean > −δ and of
    mean < δ, the interval is Student t's 90 % interval, and p < 0.05 exactly where that
    interval lies inside (−δ, δ)."""
    from scipy import stats

    eq = tost(deltas, margin, 0.05)
    lower = stats.ttest_1samp(deltas, -margin, alternative="greater").pvalue
    upper = stats.ttest_1samp(deltas, margin, alternative="less").pvalue
    assert eq["p"] == pytest.approx(max(lower, upper), rel=1e-9)
    low, high = stats.t.interval(0.90, len(deltas) - 1, loc=np.mean(deltas),
                                 scale=stats.sem(deltas))
    assert (eq["low"], eq["high"]) == pytest.approx((low, high), rel=1e-9)
    inside = -margin < low and high < margin
    assert (eq["p"] < 0.05) == inside
    test = comparison(*deltas, p=0.5)  # no difference shown by the bootstrap
    verdict = bootstrap(test, "unchanged", margin)
    assert verdict.startswith("supported (equivalent") == inside
    assert inside or f"exceeds ±{margin:g}" in verdict  # never supported by p ≥ α alone


def test_equivalence_needs_two_seeds_for_an_interval(monkeypatch):
    assert tost([0.1], 0.5) is None
    monkeypatch.setattr(verdicts, "SEEDS", 1)
    assert bootstrap(comparison(0.1, p=0.5), "unchanged") == \
        "unresolved (too few seeds for an interval)"


def test_equal_differences_are_equivalent_inside_the_margin_only():
    assert tost([0.25, 0.25, 0.25], 0.5)["p"] == 0.0
    assert tost([0.75, 0.75, 0.75], 0.5)["p"] == 1.0


def test_the_equivalence_test_joins_the_family_and_holm_can_undo_it():
    """The family adjusts the equivalence test's p with the bootstraps' (statsmodels' Holm);
    an interval inside the margin that Holm does not keep supports nothing."""
    statsmodels = pytest.importorskip("statsmodels.stats.multitest")
    tied = comparison(0.2, 0.5, 0.35, 0.25, 0.45, p=0.3)  # 90 %: +0.23 to +0.47
    eq = Equivalence(**tost(list(tied.per_seed_delta.values()), 0.5))
    others = [comparison(0.5, 0.4, 0.6, p=0.001) for _ in range(30)]
    family = verdicts.adjust([tied, eq, *others])
    want = statsmodels.multipletests([t.p for t in family], method="holm")[1]
    assert [t.p_holm for t in family] == pytest.approx(want)
    tied = replace(family[0], equivalence=family[1])
    assert tied.equivalence.p < 0.05 <= tied.equivalence.p_holm
    assert bootstrap(tied, "unchanged") == "unresolved (equivalence not significant after Holm)"
    assert verdicts.outcome(bootstrap(verdicts.without_holm(tied), "unchanged")) == "supported"
    assert verdicts.in_words(tied) == "no difference shown, nor equivalence within ±0.5"


@pytest.mark.parametrize("m, samples", [(0, 1000), (1, 1000), (2, 1000), (3, 2000), (8, 5000),
                                        (12, 5000), (13, 10000), (14, 10000), (60, 50000)])
def test_the_resamples_grow_with_the_family(m, samples):
    """B ≥ 20·m/α, rounded up to 1, 2 or 5 × 10^k (at least 1,000): the smallest Holm p the
    bootstrap can give, m/(B + 1), is at most α/20."""
    assert verdicts.resamples(m) == samples
    assert m / (samples + 1) <= verdicts.ALPHA / verdicts.RESOLUTION


def test_the_bootstrap_resolution_decides_no_verdict():
    """Twelve claims whose bootstraps all sit at the floor 1/(B + 1): with B = 200, Holm
    cannot bring them below 12/201 ≥ α, and the verdict says that the resamples, not the data,
    stop it (where "not significant after Holm" would read as evidence); with B =
    ``resamples(12)`` the same data support every claim. The legend prints the bound."""
    def family(b: int) -> list[Bootstrap]:
        return verdicts.adjust([replace(comparison(0.5, 0.4, 0.6, p=1 / (b + 1)), n_samples=b)
                                for _ in range(12)])

    coarse = family(200)
    assert all(t.p_holm == pytest.approx(12 / 201) for t in coarse)
    assert {bootstrap(t, "gain") for t in coarse} == {"unresolved (too few resamples: "
                                                      "Holm ≥ 12/201)"}
    assert {verdicts.in_words(t) for t in coarse} == {"no difference shown"}
    legend = formatting.legend(coarse, set())
    assert "B = 200 bootstrap resamples: a bootstrap p ≥ 1/(B + 1) = 0.00498" in legend
    assert "m = 12 tests falls below m/(B + 1) = 0.0597" in legend
    fine = family(verdicts.resamples(12))
    assert {bootstrap(t, "gain") for t in fine} == {"supported"}
    assert "B = 5,000 bootstrap resamples (at least 20·m/α)" in formatting.legend(fine, set())
    # one p above the floor is decided by the data: Holm's product of a real p
    real = verdicts.adjust([replace(comparison(0.5, 0.4, 0.6, p=0.03), n_samples=200),
                            *coarse[1:]])
    assert why_not(real[0]) == "not significant after Holm"


def test_a_delta_over_fewer_seeds_than_its_means_gives_their_means():
    """The short answer's row of a 5-seed cell against a 3-seed baseline: the Δ is over the 3
    seeds they share, and the row gives the two means over those seeds, which differ by the Δ;
    a row whose cells have the same seeds gives none (its means already differ by it)."""
    five = {1: 31.03, 2: 30.79, 3: 30.68, 4: 30.27, 5: 31.04}
    base = {1: 29.69, 2: 29.35, 3: 29.63}
    deltas = [five[s] - base[s] for s in base]
    tied = replace(comparison(*deltas, p=0.001), delta_ci95=0.49)
    summary = {"none/dot": _cell("none", "dot", base, 2_000_000),
               "three_way/dot": _cell("three_way", "dot", five, 1_000_000, vs_untied=tied)}
    row = view_answer.rows(summary)[1]
    a, b = np.mean([five[s] for s in base]), np.mean(list(base.values()))
    assert row[4] == f"+1.28 ± 0.49 over untied (seeds 1, 2, 3: {a:.2f} − {b:.2f})"
    assert f"{a - b:+.2f}" == "+1.28" and row[3].startswith("30.76 (")  # 5-seed mean: 1.20
    same = {**summary, "three_way/dot": _cell("three_way", "dot", {s: five[s] for s in base},
                                              1_000_000, vs_untied=tied)}
    assert view_answer.rows(same)[1][4] == "+1.28 ± 0.49 over untied"
    assert formatting.shared_means(tied, summary["three_way/dot"], summary["none/dot"]) == \
        f"seeds 1, 2, 3: {a:.2f} − {b:.2f}"


@pytest.mark.parametrize("deltas, p, expects, counted", [
    ((0.5, 0.4, 0.6), 0.01, "gain", "supported"),
    ((-0.5, -0.4, -0.6), 0.01, "gain", "contradicted"),
    ((1.9, 1.5, 2.2), 0.001, "unchanged", "contradicted (better)"),
    ((0.3, -0.2, 0.1), 0.4, "unchanged", "supported (equivalent within ±0.5)"),
])
def test_a_claim_between_cells_still_learning_is_not_decided(deltas, p, expects, counted):
    test = comparison(*deltas, p=p)
    assert bootstrap(test, expects) == counted
    learning = replace(test, learning=("three_way/dot",))
    assert bootstrap(learning, expects) == \
        "unresolved (still learning at the budget: three_way/dot)"
    if counts(test):  # in words, a difference; equivalence only with its family's test
        assert verdicts.in_words(learning) == "still learning at the budget"


def test_an_undecided_claim_keeps_its_own_reason_while_learning():
    test = replace(comparison(0.5, 0.4, 0.6, p=0.2), learning=("none/dot", "three_way/dot"))
    assert bootstrap(test, "gain") == "unresolved (within the test set's noise)"
    diff = SeedDifference(stat=Stat.of([-1.0, -1.2, -0.9]), p=0.01, seeds=(1, 2, 3))
    assert verdicts.lower(diff) == "supported"
    assert verdicts.lower(replace(diff, learning=("decoder × dot",))) == \
        "unresolved (still learning at the budget: decoder × dot)"


def test_the_mean_of_the_seeds_gains_decides_and_an_untold_seed_keeps_it_learning():
    from fairseq_tying.studies.statistics.cells import Learning
    assert not Learning((0.004, 0.001, 0.006), 3, 0.005).still  # mean 0.0037
    assert Learning((0.004, 0.003, 0.009), 3, 0.005).still  # mean 0.0053
    assert Learning((0.001, None, 0.001), 3, 0.005).still
    line = formatting.still_learning({
        "three_way/dot": _cell("three_way", "dot", {1: 14.0}),
        "none/dot": replace(_cell("none", "dot", {1: 14.0}), values={
            "seeds": (1, 2), "learning": Learning((0.02, 0.016), 3, 0.005)})})
    assert line == ("Still learning at the budget (validation NLL 0.5 % or more lower over the "
                    "last 3 epochs than before them, mean of the seeds; each seed's in "
                    "brackets): none/dot (+1.8 %: +2.0, +1.6).")
