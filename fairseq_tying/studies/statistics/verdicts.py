"""Every verdict rule of the across-run views, in one place (version 4: ``VERSION``).

``bootstrap``: a difference in BLEU between two cells (a paired bootstrap pooled over the seeds
the two cells share, ``significance.compare``) *counts* when

    the cells share at least SEEDS seeds (n ≥ SEEDS),
    the paired bootstrap pooled over those seeds gives a two-sided p < ALPHA after
    Holm–Bonferroni over the study's family of tests (``adjust``; test-set variance, corrected
    for the number of tests), and
    every seed's difference has the same sign (training variance).

Beside the adjusted p the views print the raw p and the seed-level 95 % interval of the paired
Δ (Student t over the per-seed differences, ``delta_ci95``). A claim of a gain is supported
when the difference counts and is positive, contradicted when it counts and is negative, and
unresolved otherwise. ``why_not`` names the test that failed:

    seeds disagree              two seeds are significant on their own (p < ALPHA) with
                                opposite signs: training variance, not noise;
    within the test set's noise the pooled raw p ≥ ALPHA and no two seeds disagree as above;
    too few resamples           the bootstrap's p is its floor 1/(B + 1) (no resample reached
                                the observed difference) and Holm cannot bring it below ALPHA
                                (m/(B + 1) ≥ ALPHA): the resolution decides, not the data;
    not significant after Holm  raw p < ALPHA, adjusted p ≥ ALPHA;
    seeds differ in sign        adjusted p < ALPHA, but a seed's Δ has the other sign.

A claim is neither supported nor contradicted while a cell it compares *still learns* at its
budget (``cells.Learning``: the mean over its seeds of the plateau rule's gain over the last
epochs is at least the rule's ``min_gain``, or too few epochs tell): "unresolved (still
learning at the budget: CELLS)", since a longer budget might reverse the finding.

A claim that BLEU is *unchanged* (tying keeps BLEU) states a margin δ (MARGIN BLEU unless the
claim gives its own) and is supported only by *equivalence*: two one-sided t-tests of the
per-seed differences (``stats.tost``), the 1 − 2·ALPHA interval inside (−δ, δ), with its p
below ALPHA after Holm–Bonferroni (the family holds it beside the bootstrap's p). A difference
that failed to be significant supports nothing. The claim is contradicted by a difference that
counts (BLEU moved, "better" or "worse") where equivalence is not shown, and unresolved
otherwise, with the interval that leaves the margin.

A *paper's* claim (the views' tables with a source column) is tested here on another corpus,
model, budget and often metric than the paper's, so a counted difference against it does not
refute the paper: ``on_paper`` reads "contradicted (…)" as "not replicated here (…)", with the
direction ("worse" for a claim of a gain). A paper's claim of *no harm* (``NO_HARM``: Press &
Wolf's tying "without harming" BLEU, tested as the study's claim that BLEU is unchanged) is
supported by equivalence and by a gain that counts alike, "supported (better)", since a gain
does not go against it; a loss that counts reads "not replicated here (worse)". The rules' own
words stay for the claims a study makes of its own data (the answer's).

Resolution: B resamples give p ≥ 1/(B + 1), and Holm multiplies the smallest of m p-values by
m, so no adjusted p falls below m/(B + 1). ``resamples(m)`` chooses B ≥ RESOLUTION·m/ALPHA
(1, 2 or 5 × 10^k), so that this bound is at most ALPHA/RESOLUTION; a study's report states B
and the bound (``resolution``).

``lower``: the same rule where a study keeps one value per run and no per-sentence scores
(the perplexity study: each run's test perplexity, not its per-token log-probabilities), so
that no bootstrap over test sentences can be drawn. A per-seed difference
(``significance.seed_difference``) *counts* when

    the cells share at least SEEDS seeds,
    the two-sided one-sample t-test of the per-seed differences gives p < ALPHA after
    Holm–Bonferroni over the study's family of tests (training variance only: the test set's
    own variance is not tested), and
    every seed's difference has the same sign.

A claim that the value is *lower* than its base's (perplexity) is supported when the
difference counts and is below 0, contradicted when it counts and is above 0, unresolved
otherwise, naming the test that failed (``why_not``: too few seeds, "within the seeds'
spread" for a raw p ≥ ALPHA, not significant after Holm, seeds differ in sign), and
unresolved while a compared cell still learns at its budget, as above.

``significant``: a p rejects "no difference" (p < ALPHA), before or after Holm, and a seed's
own paired bootstrap against its baseline seed does (``why_not``'s seeds that disagree).

Holm (1979): with the family's m p-values sorted, p_(1) ≤ … ≤ p_(m), the adjusted value is
p̃_(i) = max_{j ≤ i} min(1, (m − j + 1)·p_(j)); every claim with p̃ < ALPHA holds at family-wise
error rate ALPHA. It is six lines over sorted values, so it is written here rather than adding
statsmodels (whose ``multipletests(method="holm")`` the tests check it against).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import TypeVar

from fairseq_tying.studies.statistics.cells import Bootstrap, Equivalence, SeedDifference
from fairseq_tying.studies.statistics.stats import tost

SEEDS = 3  # the fewest seeds a verdict uses (3 per cell; 5 for the headline cells)
ALPHA = 0.05
MARGIN = 0.5  # BLEU: how far from 0 a claim that BLEU is unchanged lets the difference lie
RESOLUTION = 20  # B ≥ RESOLUTION·m/ALPHA: the smallest Holm-adjusted p is ≤ ALPHA/RESOLUTION
MIN_SAMPLES = 1000  # the fewest resamples (sacrebleu's default), however small the family

GAIN, UNCHANGED = "gain", "unchanged"  # what a claim expects of its difference
NO_HARM = "no harm"  # a paper's claim that BLEU is not lower (``on_paper``)

VERSION = 4  # of the rules below; docs/verdicts.md says what each version changed


def rule(test: str) -> str:
    """The legend's sentence on when a difference counts, with ``test`` the test of it."""
    return (f"a difference counts when the two cells share at least {SEEDS} seeds, {test} "
            f"gives p < {ALPHA} after Holm–Bonferroni over the study's tests, and every seed's "
            "difference has the same sign; a claim between cells still learning at their "
            "budget is unresolved")


RULE = rule("the paired bootstrap pooled over them (two-sided: p = (#{b : |Δ_b − mean Δ_b| ≥ "
            "|Δ|} + 1)/(B + 1) over B resamples Δ_b)")
SEED_RULE = rule("the two-sided t-test of their per-seed differences")  # ``lower``
COVERAGE = f"{100 * (1 - 2 * ALPHA):g} %"  # the interval of the equivalence test (TOST)
CONTRADICTED, NOT_REPLICATED = "contradicted", "not replicated here"
PAPER_RULE = (f"a paper's claim that a difference which counts goes against reads "
              f"\"{NOT_REPLICATED}\", not {CONTRADICTED}: its corpus, model and budget are not "
              "the paper's; a paper's claim that tying does not harm BLEU is supported by "
              "equivalence or by a gain that counts, and not replicated here by a loss that "
              "counts")


def learning_rule(window: int, threshold: float) -> str:
    """The legend's sentence on cells still learning, with the plateau rule's numbers."""
    return (f"a cell still learns at its budget when its validation NLL improved by at least "
            f"{100 * threshold:g} % over its last {window} epochs, on the mean of its seeds")


def equivalence_rule(margin: float) -> str:
    """The legend's sentence on claims that BLEU is unchanged, with their margin."""
    return (f"a claim that BLEU is unchanged is supported only by equivalence within "
            f"±{margin:g} BLEU: the {COVERAGE} interval of the per-seed differences inside "
            f"±{margin:g} (two one-sided t-tests at α = {ALPHA}, their p among the study's "
            "tests for Holm–Bonferroni), contradicted by a difference that counts without it, "
            "unresolved otherwise")


def resamples(m: int) -> int:
    """The bootstrap resamples for a family of m tests: the smallest 1, 2 or 5 × 10^k that is
    at least max(MIN_SAMPLES, RESOLUTION·m/ALPHA), so that m/(B + 1) ≤ ALPHA/RESOLUTION."""
    need = max(MIN_SAMPLES, math.ceil(round(RESOLUTION * m / ALPHA, 6)))
    scale = 10 ** (len(str(need)) - 1)
    return next(k * scale for k in (1, 2, 5, 10) if k * scale >= need)


def digits(x: float, significant: int = 3) -> str:
    """``x`` (> 0) in fixed notation with ``significant`` digits, trailing zeros dropped:
    ``0.0014``, ``0.00005`` (never ``5e-05``): how a bootstrap's floor and a p near it print."""
    decimals = max(0, significant - 1 - math.floor(math.log10(x)))
    text = f"{x:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def resolution(n_samples: int, m: int) -> str:
    """The legend's sentence on the bootstrap's resolution: B, and the smallest Holm-adjusted
    p it allows over the family's m tests."""
    chosen = f" (at least {RESOLUTION}·m/α)" if n_samples >= RESOLUTION * m / ALPHA else ""
    return (f"B = {n_samples:,} bootstrap resamples{chosen}: a bootstrap p ≥ 1/(B + 1) = "
            f"{digits(1 / (n_samples + 1))}, so no Holm-adjusted bootstrap p of the study's "
            f"m = {m} tests falls below m/(B + 1) = {digits(m / (n_samples + 1))} (a p at its "
            "floor reads ≤; an equivalence p, a t-test's, has no floor)")


def holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order of ``ps``."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    adjusted, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


Family = TypeVar("Family", Bootstrap, Equivalence, SeedDifference)  # a test Holm adjusts


def adjust(tests: Sequence[Family]) -> list[Family]:
    """Holm over one study's family of tests (bootstraps and equivalence tests alike, each
    with its ``p``): each with ``p_holm`` and ``family`` (m)."""
    return [replace(test, p_holm=p, family=len(tests))
            for test, p in zip(tests, holm([t.p for t in tests]), strict=True)]


def significant(p: float) -> bool:
    return p < ALPHA


def adjusted_p(test: Bootstrap | Equivalence | SeedDifference) -> float:
    """The test's Holm-adjusted p (its raw p when it is a family of one)."""
    return test.p if test.p_holm is None else test.p_holm


def _deltas(test: Bootstrap | SeedDifference) -> list[float]:
    """Each seed's difference."""
    if isinstance(test, Bootstrap):
        return list(test.per_seed_delta.values())
    return list(test.stat.values)


def _n_seeds(test: Bootstrap | SeedDifference) -> int:
    return test.n_seeds if isinstance(test, Bootstrap) else len(test.seeds)


def _same_sign(test: Bootstrap | SeedDifference) -> bool:
    deltas = _deltas(test)
    return all(d > 0 for d in deltas) or all(d < 0 for d in deltas)


def seeds_disagree(test: Bootstrap) -> bool:
    """Two seeds significant on their own (per-seed bootstrap) with opposite signs."""
    signs = {test.per_seed_delta[k] > 0 for k, p in test.per_seed_p.items() if significant(p)}
    return len(signs) == 2


def counts(test: Bootstrap | SeedDifference) -> bool:
    """Whether a difference counts: a ``compare`` result's under the bootstrap rule, a
    per-seed difference's under ``lower``'s (its t-test in the bootstrap's place)."""
    return _n_seeds(test) >= SEEDS and significant(adjusted_p(test)) and _same_sign(test)


def at_floor(test: Bootstrap) -> bool:
    """The bootstrap's p is 1/(B + 1): no resample reached the observed difference, so the
    true p may be any smaller value."""
    return test.n_samples is not None and round(test.p * (test.n_samples + 1)) == 1


def too_few_resamples(test: Bootstrap) -> bool:
    """Holm keeps a p at the bootstrap's floor from significance: m/(B + 1) ≥ ALPHA."""
    return at_floor(test) and not significant(adjusted_p(test))


def why_not(test: Bootstrap | SeedDifference) -> str:
    """Which test a difference that does not count failed (``counts`` is False)."""
    if (n := _n_seeds(test)) < SEEDS:
        return f"{n} of {SEEDS} seeds"
    if isinstance(test, SeedDifference):
        if not significant(test.p):
            return "within the seeds' spread"
    elif seeds_disagree(test):
        return "seeds disagree"
    elif not significant(test.p):
        return "within the test set's noise"
    elif too_few_resamples(test):
        return f"too few resamples: Holm ≥ {test.family or 1}/{test.n_samples + 1}"
    if not significant(adjusted_p(test)):
        return "not significant after Holm"
    return "seeds differ in sign"


def equivalence(test: Bootstrap, margin: float = MARGIN) -> Equivalence | None:
    """The equivalence test of a comparison's per-seed differences: the one its study's family
    adjusted (``test.equivalence``), else TOST within ±``margin`` on its own (None for fewer
    than two seeds)."""
    if test.equivalence is not None:
        return test.equivalence
    eq = tost(list(test.per_seed_delta.values()), margin, ALPHA)
    return None if eq is None else Equivalence(**eq)


def equivalent(eq: Equivalence | None) -> bool:
    """Equivalence shown: the TOST p (Holm-adjusted where it has a family) < ALPHA."""
    return eq is not None and significant(adjusted_p(eq))


def interval_text(eq: Equivalence) -> str:
    """``90 % interval -0.12 to +0.31``: the equivalence test's interval."""
    return f"{COVERAGE} interval {eq.low:+.2f} to {eq.high:+.2f}"


def _direction(test: Bootstrap) -> str:
    return "better" if test.delta > 0 else "worse"


def _unchanged(test: Bootstrap, margin: float) -> str:
    """The verdict on "BLEU is unchanged" (n ≥ SEEDS): equivalence supports it, a counted
    difference contradicts it."""
    eq = equivalence(test, margin)
    if eq is None:
        return "unresolved (too few seeds for an interval)"
    within = f"equivalent within ±{eq.margin:g}"
    if equivalent(eq):
        return f"supported ({within}{'; ' + _direction(test) if counts(test) else ''})"
    if counts(test):
        return f"contradicted ({_direction(test)})"
    if significant(eq.p):
        return "unresolved (equivalence not significant after Holm)"
    if too_few_resamples(test):
        return f"unresolved ({why_not(test)})"
    return f"unresolved ({interval_text(eq)} exceeds ±{eq.margin:g})"


def bootstrap(test: Bootstrap, expects: str, margin: float = MARGIN) -> str:
    """The verdict on a claim that expects a ``gain`` or that BLEU is ``unchanged`` (within
    ±``margin`` where the test carries no equivalence test of its family); a claim between
    cells still learning at their budget is neither supported nor contradicted."""
    if test.n_seeds < SEEDS:
        return f"unresolved ({why_not(test)})"
    if expects == UNCHANGED:
        return _still_learning(test, _unchanged(test, margin))
    if counts(test):
        return _still_learning(test, "supported" if test.delta > 0 else "contradicted")
    return f"unresolved ({why_not(test)})"


def _still_learning(test: Bootstrap | SeedDifference, verdict: str) -> str:
    """``verdict``, or "unresolved (still learning at the budget: …)" where it would decide
    the claim while a compared cell still learns: a longer budget might reverse it."""
    if test.learning and outcome(verdict) in ("supported", "contradicted"):
        return still_learning(test.learning)
    return verdict


def still_learning(cells: Sequence[str]) -> str:
    """``unresolved (still learning at the budget: CELLS)``: what a finding that a cell still
    learning at its budget would decide reads instead."""
    return f"unresolved (still learning at the budget: {', '.join(cells)})"


def in_words(test: Bootstrap) -> str:
    """The rules' finding on a difference, whatever a paper expected of it: better, worse,
    equivalent within the margin (for a comparison with an equivalence test), no difference
    shown, or too few seeds to tell."""
    if test.n_seeds < SEEDS:
        return f"too few seeds ({test.n_seeds} of {SEEDS})"
    if test.learning and (counts(test) or equivalent(test.equivalence)):
        return "still learning at the budget"
    eq = test.equivalence
    margin = f"±{eq.margin:g}" if eq is not None else ""
    if counts(test):
        return f"{_direction(test)}, within {margin}" if equivalent(eq) else _direction(test)
    if equivalent(eq):
        return f"equivalent within {margin}"
    return "no difference shown" + (f", nor equivalence within {margin}" if eq else "")


def finding(test: Bootstrap | SeedDifference) -> str:
    """``better``, ``worse`` or ``none``: a bootstrap's counted difference (``counts``), or a
    per-seed difference whose t-test is significant after Holm with every seed of one sign."""
    if isinstance(test, Bootstrap):
        shown = counts(test)
        delta = test.delta
    else:
        delta = test.stat.mean
        shown = significant(adjusted_p(test)) and _same_sign(test)
    return ("better" if delta > 0 else "worse") if shown else "none"


_FOUND = {"better": "better", "worse": "worse", "none": "no difference shown"}  # finding's words


def robustness(test: Bootstrap, others: dict[str, Bootstrap | SeedDifference]) -> str:
    """Whether a claim's finding (``finding`` of its BLEU comparison) is the same under the
    protocol's other choices (``others`` by name: "chrF", "the best checkpoint"): "holds on
    chrF and the best checkpoint", "holds on BLEU only", or "not on chrF (no difference shown
    there)"; "" without others, or with too few seeds for a finding on any of them."""
    if not others or test.n_seeds < SEEDS:
        return ""
    mine = finding(test)
    differ = {name: finding(t) for name, t in others.items() if finding(t) != mine}
    if not differ:
        return "holds on " + " and ".join(others)
    if len(differ) == len(others) > 1:
        return "holds on BLEU only"
    return "; ".join(f"not on {name} ({_FOUND[found]} there)" for name, found in differ.items())


def without_holm(test: Family) -> Family:
    """The test as the raw-p rule judges it: no family correction (of its equivalence test
    either)."""
    raw = replace(test, p_holm=None, family=None)
    if isinstance(raw, Bootstrap) and raw.equivalence is not None:
        raw = replace(raw, equivalence=without_holm(raw.equivalence))
    return raw


def outcome(verdict: str) -> str:
    """supported / contradicted / unresolved: a verdict without its reason."""
    return verdict.split(" (")[0]


def lower(diff: SeedDifference) -> str:
    """The verdict on a claim that a cell's value is lower than its base's (test perplexity),
    from the per-seed differences (``SEED_RULE``, Holm-adjusted where ``adjust`` saw their
    family): supported when the difference counts below 0, contradicted above 0, else
    unresolved with the test that failed; not decided while a compared cell still learns."""
    if counts(diff):
        return _still_learning(diff, "supported" if diff.stat.mean < 0 else "contradicted")
    return f"unresolved ({why_not(diff)})"


def on_paper(verdict: str, test: Bootstrap, claims: str = "") -> str:
    """A paper's claim's verdict: "contradicted (better)" reads "not replicated here (better)",
    a claim of a gain's "contradicted" "not replicated here (worse)" (``PAPER_RULE``); where the
    paper ``claims`` no harm (``NO_HARM``), a counted gain, "contradicted (better)" by the
    study's claim that BLEU is unchanged, reads "supported (better)"; every other verdict as it
    is."""
    if outcome(verdict) != CONTRADICTED:
        return verdict
    if claims == NO_HARM and test.delta > 0:
        return f"supported ({_direction(test)})"
    reason = verdict[len(CONTRADICTED):]
    return NOT_REPLICATED + (reason if reason else f" ({_direction(test)})")


def paper_outcome(word: str, test: Bootstrap, claims: str = "") -> str:
    """``outcome`` of a paper's claim (``on_paper``): "contradicted" reads "not replicated
    here", or "supported" for a gain against a claim of no harm."""
    return outcome(on_paper(word, test, claims))

