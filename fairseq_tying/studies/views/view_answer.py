"""The short answer (README's "Does it help?"): per cell of a translation study, its parameters,
BLEU (mean and each seed), the Δ that decides its claim (with the two means over the seeds it
pairs where a cell has others) and the verdict rules' word on it, under their legend; then each
claim in words, with its Δ on each test document."""

from __future__ import annotations

from typing import Any

import numpy as np

from fairseq_tying.core.models.tying import THREE_WAY
from fairseq_tying.core.models.tying import TYING_MODES as TYINGS
from fairseq_tying.core.output_layers import BASELINE, PAPER_LAYERS
from fairseq_tying.studies.engine import specs
from fairseq_tying.studies.engine.engine import Section
from fairseq_tying.studies.records.record import Record
from fairseq_tying.studies.statistics import verdicts
from fairseq_tying.studies.statistics.cells import Bootstrap, Cell, Summary
from fairseq_tying.studies.statistics.stats import POWER, seeds_for_equivalence
from fairseq_tying.studies.views.formatting import (
    by_document,
    format_seed_delta,
    format_tests,
    legend,
    power_text,
    scope,
    seeds_label,
    shared_means,
    still_learning,
)


def _order(cell: Cell) -> tuple:
    """The untied and tied ``dot`` cells first (by tying), then the normalized layers."""
    head = cell.head
    return (head.output_layer != BASELINE, TYINGS.index(head.tying),
            specs.layer_order(head.output_layer))


def _baseline(summary: Summary) -> str:
    """The untied ``dot`` cell, or the three-way ``dot`` one where there is no untied run (an
    architecture trained with three-way tying only, like the equal-training study's
    DynamicConv)."""
    untied = f"none/{BASELINE}"
    return untied if untied in summary else f"three_way/{BASELINE}"


def _claimed(summary: Summary) -> list[tuple[Cell, specs.Claim | None]]:
    """The baseline cell (claim None) and every cell that has a claim, in the table's order."""
    claims = {c.cell: c for c in specs.study_claims(summary)}
    out = []
    for cell in sorted(summary.values(), key=_order):
        key = f"{cell.head.tying}/{cell.head.output_layer}"
        if key == _baseline(summary):
            out.append((cell, None))
        elif key in claims:
            out.append((cell, claims[key]))
    return out


def rows(summary: Summary) -> list[list[str]]:
    """One row per cell that has a claim, and the baseline (``_baseline``)."""
    out = []
    for cell, claim in _claimed(summary):
        bleu = cell.stat("bleu")
        row = [cell.head.tying, f"`{cell.head.output_layer}`", f"{cell.params[0] / 1e6:.2f}M",
               f"{bleu.mean:.2f} ({', '.join(f'{v:.2f}' for v in bleu.values)})"]
        if claim is None:
            row += ["baseline", "–", "baseline"]
        elif (test := cell.test(claim.test)) is None:
            row += ["–", "–", "–"]
        else:
            against = "untied" if claim.test == "vs_untied" else f"`{BASELINE}`"
            note = shared_means(test, cell, summary[specs.baseline_label(cell, claim.test)])
            row += [f"{format_seed_delta(test)} over {against}" + (f" ({note})" if note else ""),
                    format_tests(test), verdicts.bootstrap(test, claim.expects, claim.margin)]
        out.append(row)
    return out


def in_words(summary: Summary) -> list[str]:
    """Each claim's comparison as a sentence: which cell against which, the rules' finding in
    plain words (``verdicts.in_words``), the difference and its evidence (for a claim that
    BLEU is unchanged, the equivalence test's interval against its margin; else why no
    difference was shown), for a tying mode the parameters it saves, whether the finding holds
    on chrF and on the best checkpoint, what its seeds can show, and its Δ on each test
    document (``formatting.by_document``)."""
    out = []
    for cell, claim in _claimed(summary):
        if claim is None or (test := cell.test(claim.test)) is None:
            continue
        tying = cell.head.tying.replace("_", "-")
        what = (f"{tying} tying against untied (`{BASELINE}`)" if claim.test == "vs_untied"
                else f"`{cell.head.output_layer}` against `{BASELINE}` ({tying} tying)")
        evidence = format_tests(test)
        if (eq := test.equivalence) is not None:
            evidence += f": {verdicts.interval_text(eq)} against ±{eq.margin:g}"
        elif test.n_seeds >= verdicts.SEEDS and not verdicts.counts(test):
            why = verdicts.why_not(test)
            evidence += f": {why}"
            if why in ("seeds disagree", "seeds differ in sign"):
                evidence += " (" + ", ".join(f"{d:+.2f}" for d in
                                              test.per_seed_delta.values()) + ")"
        spare = ""
        if claim.test == "vs_untied":
            base = summary[specs.baseline_label(cell, claim.test)]
            spare = f", with {(base.params[0] - cell.params[0]) / 1e6:.2f}M fewer parameters"
        others = {name: t for also, name in specs.ALSO.items()
                  if (t := cell.test(claim.test + also)) is not None}
        docs = f"Δ by document: {by_document(test)}" if test.per_document else ""
        after = [x for x in (verdicts.robustness(test, others), power(test), docs) if x]
        out.append(f"{what}: **{verdicts.in_words(test)}**, {test.delta:+.2f} BLEU "
                   f"({evidence}){spare}" + "".join(f"; {x}" for x in after) + ".")
    return out


def power(test: Bootstrap) -> str:
    """What the claim's seeds can show, from the spread of its per-seed differences: the
    smallest Δ the t-test over them detects 8 times in 10 at α = 0.05, and the seeds that
    equivalence within ±0.5 BLEU would need if the true Δ were 0."""
    deltas = list(test.per_seed_delta.values())
    if len(deltas) < 2:
        return ""
    need = seeds_for_equivalence(float(np.std(deltas, ddof=1)), verdicts.MARGIN,
                                 verdicts.ALPHA)
    seeds = "more than 100" if need is None else str(need)
    return (f"{power_text(deltas)}, equivalence within ±{verdicts.MARGIN:g} needs {seeds} "
            "seeds")


def answers(records: list[Record]) -> bool:
    """Whether a study's records can give the short answer: for one architecture, every tying
    mode with ``dot`` and every output layer of the paper under three-way tying, each cell with
    at least the verdict rule's ``SEEDS`` (a study part-way through them, even one seed of every
    cell, is not the front page's answer; cells with more seeds, the headline's, use them)."""
    seeds: dict[tuple[str, str, str], set[int]] = {}
    for r in records:
        seeds.setdefault((r.run.arch, r.run.tying, specs.grid_layer(r)), set()).add(r.run.seed)
    if not seeds:
        return False
    needed = {(t, BASELINE) for t in TYINGS} | {(THREE_WAY.name, layer) for layer in PAPER_LAYERS}
    return any(all(len(seeds.get((arch, *cell), ())) >= verdicts.SEEDS for cell in needed)
               for arch in {a for a, _, _ in seeds})


def _legend(sections: list[Section]) -> str:
    return (scope(sections) + "Δ: the paired difference over the seeds both cells share, mean "
            "± its 95 % interval over them; where a cell has other seeds, the two means over "
            "the shared "
            "ones follow it. Verdict: " + legend(*specs.family_of(s.summary for s in sections))
            + ". Beside each claim: whether its finding (better, worse or no difference) holds "
            "on chrF (its paired bootstrap) and on the best-validation checkpoint (the t-test "
            "of the seeds' BLEU differences), each with Holm over the claims; and what its "
            "seeds can show, from the spread (sd) of their differences: the smallest |Δ| the "
            f"t-test over them detects with {100 * POWER:g} % power at α = {verdicts.ALPHA} "
            "(before Holm), and the seeds with which equivalence would hold as often were the "
            "true Δ 0; where the test set has documents, the claim's Δ on each one's sentences "
            "alone (its corpus BLEU there, mean over the same seeds).\n")


def render(sections: list[Section]) -> tuple[str, Any]:
    """The legend, the table (a model column when the study has more than one architecture),
    then the verdicts in words (``in_words``), by architecture."""
    many = len(sections) > 1
    seeds = {tuple(c.seeds) for sec in sections for c in sec.summary.values()}
    per_seed = seeds_label(list(seeds.pop())) if len(seeds) == 1 else "each seed"
    header = [*(["model"] * many), "tying", "output layer", "parameters",
              f"BLEU: mean ({per_seed})", "Δ BLEU ± 95 % CI over shared seeds", "p (raw, Holm)",
              "verdict"]
    lines = [_legend(sections), "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for sec in sections:
        for row in rows(sec.summary):
            lines.append("| " + " | ".join([*([f"`{sec.key}`"] * many), *row]) + " |")
    lines.append("")
    for sec in sections:
        for line in in_words(sec.summary):
            lines.append(f"- `{sec.key}`, {line}" if many else f"- {line[0].upper()}{line[1:]}")
    learning = [(sec.key, text) for sec in sections if (text := still_learning(sec.summary))]
    if learning:
        lines.append("")
        lines += [f"`{key}`: {text}" if many else text for key, text in learning]
    return "\n".join(lines) + "\n", {str(sec.key): sec.summary for sec in sections}
