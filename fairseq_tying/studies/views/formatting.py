"""How the across-run views write numbers: a mean ± its CI, a p-value, the seeds, a paired
Δ with its test, the epochs a cell trained. Every view and ``collect`` take them from here (no
view imports another); the papers' figures they print beside ours are the output layers'
(``core/output_layers.py``)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

from fairseq_tying.common.tables import markdown_table
from fairseq_tying.core import output_layers
from fairseq_tying.core.output_layers import PaperDelta
from fairseq_tying.studies.engine.engine import Section
from fairseq_tying.studies.statistics import verdicts
from fairseq_tying.studies.statistics.cells import (
    Bootstrap,
    Cell,
    Equivalence,
    Learning,
    SeedDifference,
    Stat,
    Summary,
)
from fairseq_tying.studies.statistics.stats import POWER, detectable
from fairseq_tying.studies.statistics.verdicts import ALPHA


def format_ci(mean: float, half: float, digits: int = 2) -> str:
    if math.isnan(half):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {half:.{digits}f}"


def format_stat(s: Stat, digits: int = 2) -> str:
    """``mean ± half`` of a Stat (just the mean for one run)."""
    return format_ci(s.mean, math.nan if s.ci95 is None else s.ci95, digits)


def p_digits(p: float, compact: bool = False, floor: float | None = None) -> str:
    """``0.046`` or ``< 0.001`` (``<0.001`` compact, in lists); more digits where three would
    round onto ALPHA (p = 0.04995 reads ``0.04995``, not ``0.050``), so the printed p is on the
    same side of ALPHA as p. A resampling test's p has a ``floor`` (1/(B + 1), m/(B + 1) after
    Holm): a p at the floor reads ``≤ floor``, since the observed difference beat every
    resample, and one above it the digits the floor needs, so that it never reads at or below
    the floor (below 0.001: two significant digits or more, in fixed notation)."""
    sp = "" if compact else " "
    if floor is not None and p <= floor * (1 + 1e-9):
        return f"≤{sp}{verdicts.digits(floor)}"
    if p < 0.001 and floor is None:
        return f"<{sp}0.001"
    shown = float(verdicts.digits(floor)) if floor is not None else 0.0
    candidates = ([verdicts.digits(p, n) for n in range(2, 7)] if p < 0.001
                  else [f"{p:.{n}f}" for n in range(3, 7)])
    for text in candidates:
        if (float(text) < ALPHA) == (p < ALPHA) and float(text) > shown:
            return text
    return candidates[-1]


def format_p(p: float, floor: float | None = None) -> str:
    text = p_digits(p, floor=floor)
    return f"p {text}" if text[0] in "<≤" else f"p = {text}"


def floors(test: Bootstrap | Equivalence | SeedDifference) -> tuple[float | None, float | None]:
    """The smallest p and Holm p a test can have: a bootstrap's 1/(B + 1) and m/(B + 1) over
    its family of m tests; none for a t-test (an equivalence test's, a seed difference's)."""
    if not isinstance(test, Bootstrap) or test.n_samples is None:
        return None, None
    floor = 1 / (test.n_samples + 1)
    return floor, None if test.family is None else min(1.0, test.family * floor)


def format_ps(test: Bootstrap | Equivalence | SeedDifference) -> str:
    """``p = 0.046, Holm 0.322``: the raw p and the Holm-adjusted one over the study's tests
    (the raw p alone for a test outside a family)."""
    floor, holm_floor = floors(test)
    if test.p_holm is None:
        return format_p(test.p, floor)
    holm = p_digits(test.p_holm, floor=holm_floor)
    return f"{format_p(test.p, floor)}, Holm {holm}{' (floor)' if holm[0] == '≤' else ''}"


def format_tests(test: Bootstrap) -> str:
    """``format_ps`` of a paired bootstrap, then of its equivalence test where it has one:
    ``p < 0.001, Holm 0.001; equivalence p = 0.968, Holm 1.000``."""
    if test.equivalence is None:
        return format_ps(test)
    return f"{format_ps(test)}; equivalence {format_ps(test.equivalence)}"


def format_seed_delta(test: Bootstrap) -> str:
    """``+0.48 ± 0.67``: the paired Δ BLEU, mean over seeds ± its 95 % interval over seeds."""
    ci = "" if test.delta_ci95 is None else f" ± {test.delta_ci95:.2f}"
    return f"{test.delta:+.2f}{ci}"


def seeds_label(seeds: list[int] | list[str]) -> str:
    """``seed 1`` or ``seeds 1, 2, 3``."""
    return f"seed{'s' * (len(seeds) != 1)} {', '.join(map(str, seeds))}"


def shared_means(test: Bootstrap, cell: Cell, base: Cell, metric: str = "bleu") -> str:
    """``seeds 1, 2, 3: 30.84 − 29.56``: the cell's and its baseline's mean ``metric`` over the
    seeds the paired Δ uses, whose difference the Δ is; "" when the Δ uses every seed of both
    cells, so that the cells' own means (over all their seeds) already differ by it. Seeds
    compare as text: a summary read back from JSON keys them so."""
    shared = [str(s) for s in test.per_seed_delta]
    if {str(s) for s in cell.seeds} == set(shared) == {str(s) for s in base.seeds}:
        return ""

    def mean(c: Cell) -> float:
        by_seed = dict(zip(map(str, c.seeds), c.stat(metric).values, strict=True))
        return sum(by_seed[s] for s in shared) / len(shared)

    return f"{seeds_label(shared)}: {mean(cell):.2f} − {mean(base):.2f}"


def format_delta(test: Bootstrap, per_seed: bool = True, note: str = "") -> str:
    """``+Δ ± CI (NOTE; p …, Holm …; [per-seed p]; equivalence p …)`` of a paired bootstrap
    (``significance.compare``); ``note`` is ``shared_means``."""
    lead = f"{note}; " if note else ""
    if not per_seed:
        return f"{format_seed_delta(test)} ({lead}{format_tests(test)})"
    floor = floors(test)[0]
    per = ", ".join(p_digits(p, compact=True, floor=floor) for p in test.per_seed_p.values())
    tests = format_ps(test) + f"; [{per}]"
    if test.equivalence is not None:
        tests += f"; equivalence {format_ps(test.equivalence)}"
    return f"{format_seed_delta(test)} ({lead}{tests})"


def document_name(name: str) -> str:
    """``John``: a test document's name less its sentences (``John (879)``)."""
    return name.rsplit(" (", 1)[0]


def by_document(test: Bootstrap) -> str:
    """``Ruth +0.69, Ecclesiastes +1.08, …``: a comparison's Δ on each test document's
    sentences alone (``Bootstrap.per_document``); "" without documents."""
    return ", ".join(f"{document_name(d)} {v:+.2f}" for d, v in test.per_document.items())


DOCUMENTS_CAPTION = ("**Δ BLEU by test document**: each claim's Δ on one document's sentences "
                     "alone (its corpus BLEU there, mean over the shared seeds), the document's "
                     "sentences in brackets; a document that carries the overall Δ alone shows "
                     "here.\n")


def documents_table(header: Sequence[str], rows: Sequence[tuple[Sequence[str], Bootstrap]]
                    ) -> str:
    """The table of each comparison's Δ per test document beside its overall Δ: a row per
    ``(its first cells under header, its test)`` whose test has documents; "" without any."""
    found = [(cells, test) for cells, test in rows if test.per_document]
    if not found:
        return ""
    docs = list(dict.fromkeys(d for _, test in found for d in test.per_document))
    return markdown_table([*header, "all", *docs], [
        [*cells, f"{test.delta:+.2f}", *(f"{test.per_document[d]:+.2f}"
                                         if d in test.per_document else "–" for d in docs)]
        for cells, test in found])


def power_text(deltas: Sequence[float]) -> str:
    """``3 seeds (sd 0.57) detect |Δ| ≥ 1.86 with 80 % power``: from the spread of a claim's
    per-seed differences, the smallest true difference the two-sided t-test over them shows 8
    times in 10 at α = ALPHA (before Holm, ``stats.detectable``); "" for fewer than two."""
    if len(deltas) < 2:
        return ""
    sd = float(np.std(deltas, ddof=1))
    return (f"{len(deltas)} seeds (sd {sd:.2f}) detect |Δ| ≥ "
            f"{detectable(sd, len(deltas), ALPHA):.2f} with {100 * POWER:g} % power")


def legend(tests: list[Bootstrap], margins: set[float], learning: Learning | None = None,
           papers: bool = False) -> str:
    """The verdicts' legend: the bootstrap rule, the convergence check with the numbers of
    ``learning`` (a cell's; none: no sentence), the equivalence rule with its ``margins`` (of
    the claims that BLEU is unchanged; none: no such sentence), with ``papers`` how a paper's
    claim reads (``verdicts.PAPER_RULE``), and the bootstrap's resolution over the family of
    ``tests``."""
    parts = [verdicts.RULE]
    if learning is not None:
        parts.append(verdicts.learning_rule(learning.window, learning.threshold))
    parts += [verdicts.equivalence_rule(m) for m in sorted(margins)]
    if papers:
        parts.append(verdicts.PAPER_RULE)
    family = [t for t in tests if t.n_samples is not None]
    if family:
        m = len(family) if family[0].family is None else family[0].family
        parts.append(verdicts.resolution(family[0].n_samples, m))
    return "; ".join(parts)


def paper_claim(source: str) -> bool:
    """Whether a claim's ``source`` is a paper (its verdict then reads ``verdicts.on_paper``)."""
    return source not in ("", "–")


def paper_figures(layer: str, arch: str) -> tuple[PaperDelta, ...]:
    """The Δs over ``dot`` that ``layer``'s paper reports for the family of ``arch``
    (DynamicConv or the Transformer), else for any family; () without any."""
    la = output_layers.get(layer)
    family = "dynamicconv" if "dynamicconv" in arch else "transformer"
    return la.paper_deltas.get(family) or la.paper_deltas.get("*", ())


def papers_legend(layers: list[str]) -> str:
    """What the papers' Δs of ``layers`` are (each paper's ``paper_figures``, once), and how to
    read them beside ours; "" when none has any."""
    said = list(dict.fromkeys(f for la in layers if (f := output_layers.get(la).paper_figures)))
    if not said:
        return ""
    return ("paper Δ: the Δ BLEU over `dot` a layer's paper reports on its own corpus and "
            "model, a direction to set beside ours and not a number this corpus and model "
            "should reproduce (the papers and their tables: docs/results.md, References); "
            + "; ".join(said))


def holm_changes(changes: list[tuple[str, str, str]]) -> str:
    """The line that lists the verdicts Holm–Bonferroni changed, each ``(comparison, raw-p
    verdict, verdict)``; "" when it changed none."""
    if not changes:
        return ""
    return ("Changed by Holm–Bonferroni (each was decided on its raw p before): "
            + "; ".join(f"{what}: {before} → {now}" for what, before, now in changes) + ".")


def epochs_text(cell: Cell) -> str:
    """``26.3 (27/20/32; 3 plateau)``: mean epochs, per seed, and the stop reasons."""
    stop = cell.stop
    reasons = ", ".join(f"{stop.reasons.count(r)} {r}" for r in sorted(set(stop.reasons)))
    epochs = "/".join(str(e) for e in stop.epochs)
    return f"{np.mean(stop.epochs):.1f} ({epochs}; {reasons})"


def still_learning(summary: Summary) -> str:
    """``Still learning at the budget (…): three_way/dot (+1.8 %: +1.5, +2.3, +1.6), …`` — the
    cells whose seeds' mean gain over their last epochs reaches the plateau rule's, each seed's
    gain beside it; "" when none does."""
    cells = [(label, c.learning) for label, c in summary.items()
             if c.learning is not None and c.learning.still]
    if not cells:
        return ""

    def pct(gain: float | None) -> str:
        return "?" if gain is None else f"{100 * gain:+.1f}"

    window, threshold = cells[0][1].window, cells[0][1].threshold
    return (f"Still learning at the budget (validation NLL {100 * threshold:g} % or more "
            f"lower over the last {window} epochs than before them, mean of the seeds; each "
            "seed's in brackets): " + "; ".join(
                f"{label} ({pct(ln.gain)} %: {', '.join(pct(g) for g in ln.gains)})"
                for label, ln in cells) + ".")


def _span(values: Sequence[int]) -> str:
    """``40`` or ``18–40``: the least and the most of sorted values."""
    return f"{values[0]}" if values[0] == values[-1] else f"{values[0]}–{values[-1]}"


def _test_set(cells: list[Cell]) -> str:
    """``1,434 test sentences (Ruth 85, …)``: the test set's size (a translation's sentences,
    a language model's tokens) and its documents where the comparisons have them ("" where
    the cells say neither)."""
    docs = next((list(t.per_document) for c in cells for t in c.tests.values()
                 if getattr(t, "per_document", None)), [])
    inside = " (" + ", ".join(d.replace(" (", " ").rstrip(")") for d in docs) + ")" if docs \
        else ""  # "John (879)" -> "John 879"
    for fact, unit in (("sentences", "sentences"), ("tokens", "tokens")):
        if sizes := sorted({v for c in cells for v in c.values.get(fact, ())}):
            return f"{_span([f'{n:,}' for n in sizes])} test {unit}{inside}"
    if docs:
        return f"{sum(int(d.rsplit('(', 1)[1].rstrip(')')) for d in docs):,} test sentences" \
            + inside
    return ""


def _budget(cells: list[Cell]) -> str:
    """``40 epochs``, ``18–40 epochs (stops: 20 plateau, 1 cap)`` or ``600 updates``: how long
    the runs trained, with why they stopped where a rule stopped them ("" where the cells do
    not say)."""
    stops = [(e, why) for c in cells if c.stop for e, why in zip(c.stop.epochs, c.stop.reasons,
                                                                 strict=True)]
    if stops:
        reasons = Counter(why for _, why in stops)
        return f"{_span(sorted({e for e, _ in stops}))} epochs" + (
            "" if set(reasons) == {"budget"} else
            " (stops: " + ", ".join(f"{n} {why}" for why, n in sorted(reasons.items())) + ")")
    updates = sorted({u for c in cells for u in c.values.get("updates", ())})
    return f"{_span(updates)} updates" if updates else ""


def scope(sections: list[Section]) -> str:
    """What a block's verdicts are about, in one sentence, from its cells: the data, each
    model's shape and size, the test set (its size and documents), the seeds, the budget and
    the scored checkpoint."""
    cells = [c for s in sections for c in s.summary.values()]

    def fact(name: str) -> list:
        return sorted({v for c in cells for v in c.values.get(name, ())})

    parts = [", ".join(f"`{d}`" for d in fact("datasets"))] if fact("datasets") else []
    for s in sections:
        params = sorted({p for c in s.summary.values() for p in c.params})
        shapes = [x for x in {v for c in s.summary.values() for v in c.values.get("shape", ())}
                  if x]
        archs = [s.key] if s.key is not None else sorted(
            {r.run.arch for runs in s.cells.values() for r in runs.values()})
        parts.append(", ".join(f"`{a}`" for a in archs) + "".join(f", {x}" for x in
                                                                 sorted(shapes))
                     + f", {_span([f'{p / 1e6:.2f}M' for p in params])} parameters")
    if test := _test_set(cells):
        parts.append(test)
    parts.append(seeds_label(sorted({s for c in cells for s in c.seeds})))
    if budget := _budget(cells):
        averaged = fact("averaged")
        parts.append(budget + (f", scored as the average of the last {averaged[-1]} epoch "
                               "checkpoints" if averaged and averaged[-1] > 1 else ""))
    return "Scope: " + "; ".join(parts) + ". "
