"""Every verdict rule of the across-run views, in one place.

``bootstrap``: a difference in BLEU between two cells (a paired bootstrap pooled over the seeds,
``significance.compare``) *counts* when

    the study has all its seeds for it (n ≥ SEEDS),
    the paired bootstrap pooled over the seeds gives p < ALPHA (test-set variance), and
    every seed's difference has the same sign (training variance, with 3 seeds).

A claim of a gain is supported when the difference counts and is positive, contradicted when
it counts and is negative, and unresolved otherwise. A claim that BLEU is *unchanged* (tying
costs nothing) is contradicted only by a counted loss; with all seeds in it is supported by a
counted gain or by no counted difference.

``interval``: a per-seed difference (``significance.seed_difference``, e.g. of test
perplexity) is supported when its whole 95 % CI lies below 0, contradicted when above 0 and
unresolved when it contains 0 (or one seed gives no CI).

``significant``: one run's paired bootstrap against its baseline run rejects "no difference"
(p < ALPHA); ``collect`` counts such runs.
"""

from __future__ import annotations

from typing import Any

SEEDS = 3  # the studies' protocol: 3 seeds per cell
ALPHA = 0.05

GAIN, UNCHANGED = "gain", "unchanged"  # what a claim expects of its difference

RULE = (f"a difference counts when all {SEEDS} seeds are in, the pooled paired bootstrap gives "
        f"p < {ALPHA} and every seed's difference has the same sign")
INTERVAL_RULE = ("supported / contradicted / unresolved (lower perplexity): the CI lies below 0 "
                 "/ above 0 / contains 0")


def significant(p: float) -> bool:
    return p < ALPHA


def _same_sign(test: dict[str, Any]) -> bool:
    deltas = list(test["per_seed_delta"].values())
    return all(d > 0 for d in deltas) or all(d < 0 for d in deltas)


def counts(test: dict[str, Any]) -> bool:
    """Whether a ``compare`` result's difference counts under the bootstrap rule."""
    return test["n_seeds"] >= SEEDS and significant(test["p"]) and _same_sign(test)


def bootstrap(test: dict[str, Any], expects: str) -> str:
    """The bootstrap rule's verdict on a claim that expects a ``gain`` or ``unchanged``."""
    if test["n_seeds"] < SEEDS:
        return f"unresolved ({test['n_seeds']} of {SEEDS} seeds)"
    gain = test["delta_bleu"] > 0
    if counts(test):
        if expects == UNCHANGED:
            return "supported (better)" if gain else "contradicted"
        return "supported" if gain else "contradicted"
    why = f"p ≥ {ALPHA}" if test["p"] >= ALPHA else "seeds differ in sign"
    return f"supported ({why})" if expects == UNCHANGED else f"unresolved ({why})"


def in_words(test: dict[str, Any]) -> str:
    """The bootstrap rule's finding on a difference, whatever a paper expected of it: better,
    worse, no difference shown (and why), or not decided while seeds are missing."""
    if test["n_seeds"] < SEEDS:
        return f"not decided yet ({test['n_seeds']} of {SEEDS} seeds)"
    if counts(test):
        return "better" if test["delta_bleu"] > 0 else "worse"
    return "no difference shown"


def interval(diff: dict[str, Any]) -> str:
    """The interval rule's verdict on "lower than the base" (a ``stat`` of differences)."""
    if diff["ci95"] is None:
        return "unresolved"
    if diff["mean"] + diff["ci95"] < 0:
        return "supported"
    if diff["mean"] - diff["ci95"] > 0:
        return "contradicted"
    return "unresolved"
