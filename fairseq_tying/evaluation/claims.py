"""The papers' claims against a study's cells, with one rule for every verdict.

A claim is a difference in BLEU between two cells of the grid (``compare`` results in the
study's summary). The difference *counts* when

    the study has all its seeds for it (n ≥ SEEDS),
    the paired bootstrap pooled over the seeds gives p < ALPHA (test-set variance), and
    every seed's difference has the same sign (training variance, with 3 seeds).

A claim of a gain is supported when the difference counts and is positive, contradicted when
it counts and is negative, and unresolved otherwise. A claim that BLEU is *unchanged* (tying
costs nothing) is contradicted only by a counted loss; with all seeds in it is supported by a
counted gain or by no counted difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fairseq_tying.core.scoring import OUTPUT_LAYERS
from fairseq_tying.evaluation.aggregate import format_delta
from fairseq_tying.evaluation.tables import markdown_table

SEEDS = 3  # the studies' protocol: 3 seeds per cell
ALPHA = 0.05

PRESS_WOLF = "Press & Wolf (2017)"
LIU = "Liu et al. (2020)"
NORMALIZED = tuple(la for la in OUTPUT_LAYERS if la != "dot")
# tying modes whose matrix is shared by the output layer, as in the normalization paper
SHARED = ("three_way", "decoder")


@dataclass(frozen=True)
class Claim:
    text: str
    source: str
    cell: str  # the summary's "tying/layer" key
    test: str  # "vs_untied" or "vs_dot": which comparison of the cell
    expects: str  # "gain" or "unchanged"


def study_claims() -> list[Claim]:
    """Tying keeps BLEU (with ``dot``); each normalized layer beats ``dot`` on a shared matrix."""
    tying = [Claim(f"{t.replace('_', '-')} tying keeps BLEU (`dot`)", PRESS_WOLF, f"{t}/dot",
                   "vs_untied", "unchanged") for t in SHARED]
    layers = [Claim(f"`{la}` beats `dot` ({t.replace('_', '-')} tying)", LIU, f"{t}/{la}",
                    "vs_dot", "gain") for t in SHARED for la in NORMALIZED]
    return tying + layers


def _same_sign(test: dict[str, Any]) -> bool:
    deltas = list(test["per_seed_delta"].values())
    return all(d > 0 for d in deltas) or all(d < 0 for d in deltas)


def counts(test: dict[str, Any]) -> bool:
    """Whether a ``compare`` result's difference counts under the module's rule."""
    return test["n_seeds"] >= SEEDS and test["p"] < ALPHA and _same_sign(test)


def verdict(test: dict[str, Any], expects: str) -> str:
    if test["n_seeds"] < SEEDS:
        return f"unresolved ({test['n_seeds']} of {SEEDS} seeds)"
    gain = test["delta_bleu"] > 0
    if counts(test):
        if expects == "unchanged":
            return "supported (better)" if gain else "contradicted"
        return "supported" if gain else "contradicted"
    why = f"p ≥ {ALPHA}" if test["p"] >= ALPHA else "seeds differ in sign"
    return f"supported ({why})" if expects == "unchanged" else f"unresolved ({why})"


def claims_table(summary: dict[str, Any]) -> str | None:
    """The claims whose cells the study has, as a markdown table (None when it has none)."""
    rows = [[c.text, c.source, format_delta(test), verdict(test, c.expects)]
            for c in study_claims()
            if (test := summary.get(c.cell, {}).get(c.test)) is not None]
    if not rows:
        return None
    return markdown_table(["claim", "source", "Δ BLEU", "verdict"], rows)


RULE = (f"a difference counts when all {SEEDS} seeds are in, the pooled paired bootstrap gives "
        f"p < {ALPHA} and every seed's difference has the same sign")
