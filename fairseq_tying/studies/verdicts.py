"""Every verdict rule of the across-run views, in one place (version 2).

``bootstrap``: a difference in BLEU between two cells (a paired bootstrap pooled over the seeds
the two cells share, ``significance.compare``) *counts* when

    the cells share at least SEEDS seeds (n ≥ SEEDS),
    the paired bootstrap pooled over those seeds gives p < ALPHA after Holm–Bonferroni over the
    study's family of claims (``adjust``; test-set variance, corrected for the number of
    claims), and
    every seed's difference has the same sign (training variance).

Beside the adjusted p the views print the raw p and the seed-level 95 % interval of the paired
Δ (Student t over the per-seed differences, ``delta_ci95``). A claim of a gain is supported
when the difference counts and is positive, contradicted when it counts and is negative, and
unresolved otherwise. A claim that BLEU is *unchanged* (tying costs nothing) is contradicted
only by a counted loss; with all seeds in it is supported by a counted gain or by no counted
difference. ``why_not`` names the test that failed:

    seeds disagree              two seeds are significant on their own (p < ALPHA) with
                                opposite signs: training variance, not noise;
    within the test set's noise the pooled raw p ≥ ALPHA and no two seeds disagree as above;
    not significant after Holm  raw p < ALPHA, adjusted p ≥ ALPHA;
    seeds differ in sign        adjusted p < ALPHA, but a seed's Δ has the other sign.

``interval``: a per-seed difference (``significance.seed_difference``, e.g. of test
perplexity; its p from the one-sample t-test of the differences, Holm-adjusted over the study's
family) is supported when the adjusted p < ALPHA and the mean lies below 0, contradicted when
above 0, unresolved otherwise (or one seed gives no CI). With one claim it is the 95 % CI rule.

``significant``: one run's paired bootstrap against its baseline run rejects "no difference"
(p < ALPHA); ``collect`` counts such runs.

Holm (1979): with the family's m p-values sorted, p_(1) ≤ … ≤ p_(m), the adjusted value is
p̃_(i) = max_{j ≤ i} min(1, (m − j + 1)·p_(j)); every claim with p̃ < ALPHA holds at family-wise
error rate ALPHA. It is six lines over sorted values, so it is written here rather than adding
statsmodels (whose ``multipletests(method="holm")`` the tests check it against).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

SEEDS = 3  # the fewest seeds a verdict uses (3 per cell; 5 for the headline cells)
ALPHA = 0.05

GAIN, UNCHANGED = "gain", "unchanged"  # what a claim expects of its difference

RULE = (f"a difference counts when the two cells share at least {SEEDS} seeds, the paired "
        f"bootstrap pooled over them gives p < {ALPHA} after Holm–Bonferroni over the study's "
        "claims, and every seed's difference has the same sign")
INTERVAL_RULE = ("supported / contradicted / unresolved (lower perplexity): the t-test of the "
                 f"per-seed differences gives p < {ALPHA} after Holm–Bonferroni over the "
                 "study's comparisons with the mean below 0 / above 0 / otherwise")


def holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order of ``ps``."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    adjusted, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


def adjust(tests: Sequence[dict[str, Any]]) -> None:
    """Holm over one study's family of claims: each test gets ``p_holm`` and ``family`` (m)."""
    for test, p in zip(tests, holm([t["p"] for t in tests]), strict=True):
        test["p_holm"], test["family"] = p, len(tests)


def significant(p: float) -> bool:
    return p < ALPHA


def adjusted_p(test: dict[str, Any]) -> float:
    """The test's Holm-adjusted p (its raw p when it is a family of one)."""
    return test.get("p_holm", test["p"])


def _same_sign(test: dict[str, Any]) -> bool:
    deltas = list(test["per_seed_delta"].values())
    return all(d > 0 for d in deltas) or all(d < 0 for d in deltas)


def seeds_disagree(test: dict[str, Any]) -> bool:
    """Two seeds significant on their own (per-seed bootstrap) with opposite signs."""
    signs = {test["per_seed_delta"][k] > 0 for k, p in test["per_seed_p"].items()
             if significant(p)}
    return len(signs) == 2


def counts(test: dict[str, Any]) -> bool:
    """Whether a ``compare`` result's difference counts under the bootstrap rule."""
    return (test["n_seeds"] >= SEEDS and significant(adjusted_p(test)) and _same_sign(test))


def why_not(test: dict[str, Any]) -> str:
    """Which test a difference that does not count failed (``counts`` is False)."""
    if test["n_seeds"] < SEEDS:
        return f"{test['n_seeds']} of {SEEDS} seeds"
    if seeds_disagree(test):
        return "seeds disagree"
    if not significant(test["p"]):
        return "within the test set's noise"
    if not significant(adjusted_p(test)):
        return "not significant after Holm"
    return "seeds differ in sign"


def bootstrap(test: dict[str, Any], expects: str) -> str:
    """The bootstrap rule's verdict on a claim that expects a ``gain`` or ``unchanged``."""
    if test["n_seeds"] < SEEDS:
        return f"unresolved ({why_not(test)})"
    gain = test["delta_bleu"] > 0
    if counts(test):
        if expects == UNCHANGED:
            return "supported (better)" if gain else "contradicted"
        return "supported" if gain else "contradicted"
    why = why_not(test)
    return f"supported ({why})" if expects == UNCHANGED else f"unresolved ({why})"


def in_words(test: dict[str, Any]) -> str:
    """The bootstrap rule's finding on a difference, whatever a paper expected of it: better,
    worse, no difference shown (and why), or too few seeds to tell."""
    if test["n_seeds"] < SEEDS:
        return f"too few seeds ({test['n_seeds']} of {SEEDS})"
    if counts(test):
        return "better" if test["delta_bleu"] > 0 else "worse"
    return "no difference shown"


def without_holm(test: dict[str, Any]) -> dict[str, Any]:
    """The test as the version-1 rule judged it: raw p, no family correction."""
    return {k: v for k, v in test.items() if k not in ("p_holm", "family")}


def outcome(verdict: str) -> str:
    """supported / contradicted / unresolved: a verdict without its reason."""
    return verdict.split(" (")[0]


def interval(diff: dict[str, Any]) -> str:
    """The interval rule's verdict on "lower than the base" (a ``stat`` of differences with the
    t-test's ``p``, Holm-adjusted where ``adjust`` saw its family)."""
    if diff["ci95"] is None or not significant(adjusted_p(diff)):
        return "unresolved"
    return "supported" if diff["mean"] < 0 else "contradicted"
