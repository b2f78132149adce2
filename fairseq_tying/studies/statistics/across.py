"""The same claims in two studies: does a difference grow or shrink with the data, or move
with another learning rate or draw of the data?

A claim's comparison gives per-seed differences d_1..d_n in each study (a bootstrap's
``per_seed_delta``: this study's cells, and those of the other's ``summary.json``). The change
of the claim's Δ from the other study (A) to this one (B) is Welch's difference of two means,
which takes the two studies' runs as independent. A seed's runs in two studies start from the
same initialization (and, on the same data, see the same batches), so they may correlate; a
positive correlation makes the interval wider than it need be (conservative):

    Δ = mean(d^B) − mean(d^A)        s² = v_A + v_B,  v = var(d)/n
    df = s⁴ / (v_A²/(n_A − 1) + v_B²/(n_B − 1))       (Welch–Satterthwaite)
    95 % CI:  Δ ± t_{0.975, df}·s

"larger here" when the interval lies above 0, "smaller here" when below, else "no change
shown". Both need at least 2 seeds. Beside each Δ stands the rules' finding on it in its own
study (``verdicts.in_words``: better, worse, no difference shown, ...), so a row says whether
the comparison keeps its sign and its verdict there. A claim's Δ between cells still learning
at their budget (the comparison's ``learning``, in either study) might move with a longer
budget, so its change is neither larger nor smaller: it reads "unresolved (still learning at
the budget: …)", naming those cells and the study they are in (``verdicts.still_learning``),
as a verdict would.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from fairseq_tying.common.extras import require
from fairseq_tying.common.tables import markdown_table
from fairseq_tying.studies import FOR_WHAT
from fairseq_tying.studies.statistics import verdicts
from fairseq_tying.studies.statistics.cells import Bootstrap, Summary

_st = require("scipy.stats", "analysis", FOR_WHAT)

LARGER, SMALLER, NO_CHANGE = "larger here", "smaller here", "no change shown"


def welch(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """(mean(b) − mean(a), half width of its 95 % Welch interval)."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"Welch's interval needs 2 seeds a side, got {len(a)} and {len(b)}")
    va, vb = (_var(x) / len(x) for x in (a, b))
    s2 = va + vb
    diff = sum(b) / len(b) - sum(a) / len(a)
    if s2 == 0:
        return diff, 0.0
    df = s2**2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return diff, float(_st.t.ppf(0.975, df)) * math.sqrt(s2)


def _var(x: Sequence[float]) -> float:
    m = sum(x) / len(x)
    return sum((v - m) ** 2 for v in x) / (len(x) - 1)


def word(diff: float, half: float) -> str:
    return LARGER if diff - half > 0 else SMALLER if diff + half < 0 else NO_CHANGE


def _deltas(test: Bootstrap) -> list[float]:
    return list(test.per_seed_delta.values())


def _comparisons(summaries: dict[str, Summary]) -> dict[tuple[str, str, str], Bootstrap]:
    """Every (model, cell, comparison) of a study's summaries (by model) that has per-seed
    differences."""
    return {(model, label, name): test for model, cells in summaries.items()
            for label, cell in cells.items() for name, test in cell.tests.items()
            if isinstance(test, Bootstrap) and test.metric == "bleu"}


def verdict(diff: float, half: float, here: Bootstrap, there: Bootstrap, name: str) -> str:
    """``word`` of the change, unless it is larger or smaller while a compared cell still
    learns at its budget on either set (``here``'s comparison or ``there``'s, the set
    ``name``): then unresolved, with those cells."""
    found = word(diff, half)
    learning = [f"{c} here" for c in here.learning] + [f"{c} in {name}" for c in there.learning]
    return verdicts.still_learning(learning) if learning and found != NO_CHANGE else found


def _delta(deltas: Sequence[float], test: Bootstrap) -> str:
    """A comparison's mean Δ, its seeds and the rules' finding on it in its own study."""
    return f"{sum(deltas) / len(deltas):+.2f} (n={len(deltas)}): {verdicts.in_words(test)}"


def rows(here: dict[str, Summary], there: dict[str, Summary], name: str = "the other set"
         ) -> list[list[str]]:
    """A row per comparison both summaries make (same model, cell and comparison); ``name``:
    the other set's."""
    out = []
    mine, theirs = _comparisons(here), _comparisons(there)
    for key in [k for k in mine if k in theirs]:
        a, b = _deltas(theirs[key]), _deltas(mine[key])
        if len(a) < 2 or len(b) < 2:
            continue
        diff, half = welch(a, b)
        model, cell, comparison = key
        against = "untied" if comparison == "vs_untied" else "`dot`"
        out.append([f"`{model}`", f"{cell.replace('/', ' × ')} vs {against}", name,
                    _delta(a, theirs[key]), _delta(b, mine[key]), f"{diff:+.2f} ± {half:.2f}",
                    verdict(diff, half, mine[key], theirs[key], name)])
    return out


def render(here: dict[str, Summary], others: Sequence[tuple[dict[str, Summary], str]]) -> str:
    """One table of every comparison this study shares with one of ``others`` (summaries,
    name): its Δ and finding there and here, and its change; a comparison's rows together."""
    table = sorted((row for there, name in others for row in rows(here, there, name)),
                   key=lambda row: row[:2])  # a comparison's rows together, in others' order
    if not table:
        return ""
    names = [name for _, name in others]
    listed = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
    return (f"**Beside {listed}**: each comparison's Δ BLEU (mean over seeds of the paired "
            "difference) and the rules' finding on it, in the other study and here, and its "
            "change here − there ± the 95 % Welch interval over the two studies' seeds "
            "(their runs taken as independent, though a seed's runs start from the same "
            "initialization in both: a positive correlation widens the interval): larger or "
            "smaller where the interval excludes 0, unresolved where a compared cell still "
            "learns at its budget in either study.\n\n"
            + markdown_table(["model", "comparison", "there", "Δ there", "Δ here", "change",
                              "verdict"], table))
