"""The equal-training study's tables and plot (``specs.GRID`` cells, every run trained the same
number of epochs): BLEU per cell with each seed, the Δs that decide the papers' claims at equal
training with the verdict rule (tying against untied; each normalized layer and each tagged
cell against ``dot``, for each architecture, beside the Δ its paper reports for the
architecture's family: ``OutputLayer.paper_deltas``, with what they measure in the legend,
``paper_figures``; a counted difference against a paper reads "not replicated here",
``verdicts.on_paper``), each claim's Δ per test document, and the validation NLL per epoch."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fairseq_tying.common.run_spec import CELL_TAG
from fairseq_tying.common.tables import markdown_table
from fairseq_tying.core.models.tying import THREE_WAY, UNTIED
from fairseq_tying.core.models.tying import TYING_MODES as TYINGS
from fairseq_tying.core.output_layers import BASELINE
from fairseq_tying.studies.engine import specs
from fairseq_tying.studies.engine.engine import Cells, Section
from fairseq_tying.studies.records.record import Record
from fairseq_tying.studies.statistics import verdicts
from fairseq_tying.studies.statistics.cells import Bootstrap, Cell, Summary
from fairseq_tying.studies.statistics.stats import mean_ci
from fairseq_tying.studies.views.formatting import (
    DOCUMENTS_CAPTION,
    documents_table,
    format_delta,
    format_stat,
    holm_changes,
    legend,
    paper_claim,
    paper_figures,
    papers_legend,
    scope,
    seeds_label,
    shared_means,
)
from fairseq_tying.studies.views.plots import plot_bands


def _cells(summary: Summary) -> list[Cell]:
    """The cells in the grid's order: tying, then output layer."""
    return sorted(summary.values(), key=lambda c: (TYINGS.index(c.head.tying),
                                                   specs.layer_order(c.head.output_layer)))


def _budget(sections: list[Section]) -> str:
    epochs = sorted({e for s in sections for c in s.summary.values() if c.stop is not None
                     for e in c.stop.epochs})
    if not epochs:
        return "training"
    if len(epochs) == 1:
        return f"{epochs[0]} epochs"
    return f"{epochs[0]}–{epochs[-1]} epochs"


def _scored(sections: list[Section]) -> str:
    """Which checkpoint a run's score comes from: ``the average of its last 5 epoch
    checkpoints`` when every run averaged as many."""
    counts = {len(r.eval.averaged or ()) for s in sections for runs in s.cells.values()
              for r in runs.values()}
    if len(counts) == 1 and (n := counts.pop()) > 0:
        return f"the average of its last {n} epoch checkpoint{'s' * (n != 1)}"
    return "the average of its last epoch checkpoints"


def bleu_table(sections: list[Section]) -> str:
    rows = []
    for s in sections:
        for c in _cells(s.summary):
            bleu = c.stat("bleu")
            seeds = " / ".join(f"{v:.2f}" for v in bleu.values)
            rows.append([f"`{s.key}`", c.head.tying, c.head.output_layer,
                         f"{format_stat(bleu)} (n={len(c.seeds)})",
                         f"{seeds} ({seeds_label(c.seeds)})",
                         format_stat(c.stat("chrf")), format_stat(c.stat("valid_nll"), 3)])
    return markdown_table(["model", "tying", "output layer", "BLEU", "BLEU per seed", "chrF",
                           "validation NLL"], rows)


def _paper(arch: str, layer: str) -> str:
    """The paper's Δs over dot for this layer and model family, each with where it was
    measured; "–" without any."""
    return ", ".join(map(str, paper_figures(layer, arch))) or "–"


@dataclass(frozen=True)
class _Claim:
    """One claim of the Δ table: the study's claim (``specs.Claim``), its test, its name in the
    tables (``what``, then ``where`` in the Δ table) and the paper's Δ beside it."""

    claim: specs.Claim
    test: Bootstrap
    what: str
    where: str
    paper: str


def _claims(summary: Summary, arch: str) -> list[_Claim]:
    """Every claim of the study whose comparison the summary has, in the Δ table's order: tying
    against untied (``dot``; decoder, then three-way), then each normalized layer and each
    tagged cell (``specs.study_claims``) against ``dot`` with three-way tying."""
    claims = specs.claims_tests(summary)
    tying = [(c, t) for c, t in claims if c.test == "vs_untied"][::-1]
    layers = [(c, t) for c, t in claims
              if c.test == "vs_dot" and c.cell.startswith(f"{THREE_WAY.name}/")]
    out = []
    for c, test in tying + layers:
        tying_name, layer = c.cell.split("/")
        if c.test == "vs_untied":
            out.append(_Claim(c, test, f"{tying_name.replace('_', '-')} tying vs untied",
                              f" (`{BASELINE}`)", "–"))
        else:
            paper = _paper(arch, layer) if CELL_TAG not in layer else "–"
            out.append(_Claim(c, test, f"`{layer}` vs `{BASELINE}`", " (three-way tying)", paper))
    return out


def comparisons(sections: list[Section]) -> tuple[list[list[str]], list[tuple[str, str, str]]]:
    """Rows of the Δ table: tying against untied (``dot``), each normalized layer and tagged
    cell against ``dot`` with three-way tying, per architecture (``_claims``). Beside them the
    verdicts Holm–Bonferroni changed (``formatting.holm_changes``). A claim with a paper's
    source reads its verdict ``verdicts.on_paper``."""
    rows, changes = [], []
    for s in sections:
        for found in _claims(s.summary, str(s.key)):
            claim, test, what = found.claim, found.test, found.what + found.where
            source = claim.source or "–"
            note = shared_means(test, *_pair(s.summary, test))
            verdict = verdicts.bootstrap(test, claim.expects, claim.margin)
            if paper_claim(source):
                verdict = verdicts.on_paper(verdict, test, claim.paper)
            rows.append([what, f"`{s.key}`", source, found.paper,
                         format_delta(test, note=note), verdict])
            if changed := specs.changed_by_holm(test, claim.expects):
                if paper_claim(source):
                    changed = tuple(verdicts.paper_outcome(w, test, claim.paper)
                                    for w in changed)
                changes.append((f"{what}, `{s.key}`", *changed))
    return rows, changes


def _papers(sections: list[Section]) -> str:
    """The legend's sentence on the paper Δ column: what the paper Δs of the compared layers
    are (``formatting.papers_legend``); "" when none has one."""
    layers = [la for la in specs.normalized() for s in sections
              if _test(s.summary, f"three_way/{la}", "vs_dot") is not None
              and paper_figures(la, str(s.key))]
    return f"{text[0].upper()}{text[1:]}. " if (text := papers_legend(layers)) else ""


def per_document(sections: list[Section]) -> str:
    """The table of each claim's Δ per test document (``_claims``), beside its overall Δ (""
    where the comparisons have no documents)."""
    return documents_table(["comparison", "model"], [
        ([found.what, f"`{s.key}`"], found.test)
        for s in sections for found in _claims(s.summary, str(s.key))])


def _test(summary: Summary, label: str, name: str) -> Bootstrap | None:
    """The comparison ``name`` of the summary's cell ``label`` (None: no such cell or test)."""
    return summary[label].test(name) if label in summary else None


def _pair(summary: Summary, test: Bootstrap) -> tuple[Cell, Cell]:
    """The cell a comparison of the summary belongs to, and the cell it is made against."""
    cell, name = next((c, n) for c in summary.values() for n in ("vs_dot", "vs_untied")
                      if c.test(n) is test)
    return cell, summary[specs.baseline_label(cell, name)]


def render(sections: list[Section]) -> tuple[str, Any]:
    """The block's text (its scope first, ``formatting.scope``) and ``summary.json`` (one
    summary per architecture)."""
    budget = _budget(sections)
    parts = [scope(sections).rstrip() + "\n",
             f"Every run trained {budget}; its score is {_scored(sections)}. Mean ± 95 % "
             "CI (Student t over seeds); validation NLL in base 2 per token after the last "
             "epoch.\n",
             f"**BLEU after {budget}** (sacrebleu, detokenized, test set)\n",
             bleu_table(sections)]
    rows, changes = comparisons(sections)
    if rows:
        parts += [f"\n**Δ BLEU after {budget}**: mean over the seeds both cells share of the "
                  "paired difference ± its 95 % CI over them (where a cell has other seeds, "
                  "the two means over the shared ones first); p of the paired bootstrap over "
                  "test sentences, pooled over the seeds, raw and Holm-adjusted over the "
                  "study's tests; per-seed p in brackets; for a tying claim the equivalence "
                  "test's p. "
                  + _papers(sections) + "Verdict: "
                  + legend(*specs.family_of(s.summary for s in sections), papers=True)
                  + ".\n",
                  markdown_table(["comparison", "model", "source",
                                  "paper Δ (the paper's corpus and model)", "Δ BLEU",
                                  "verdict"], rows)]
        if changes:
            parts += ["", holm_changes(changes)]
    if table := per_document(sections):
        parts += [f"\n{DOCUMENTS_CAPTION}", table]
    return "\n".join(parts), {str(s.key): s.summary for s in sections}


def _band(points: dict[int, list[float]]) -> tuple[list, list, list, list]:
    """Per epoch: the mean of its values ± their 95 % CI (none for one value)."""
    xs = sorted(points)
    mean, half = zip(*(mean_ci(points[x]) for x in xs), strict=True)
    half = [0.0 if h != h else h for h in half]  # one seed: no interval
    return (xs, list(mean), [m - h for m, h in zip(mean, half, strict=True)],
            [m + h for m, h in zip(mean, half, strict=True)])


def _epochs(run: Record) -> dict[int, float]:
    return {epoch: value for epoch, _update, value in run.train.valid_epochs}


def _ci_band(runs: list) -> tuple[list, list, list, list]:
    """Per epoch: the mean validation NLL over the runs that reached it, ± its 95 % CI."""
    points: dict[int, list[float]] = defaultdict(list)
    for r in runs:
        for epoch, value in _epochs(r).items():
            points[epoch].append(value)
    return _band(points)


def _delta_band(runs: dict, baseline: dict) -> tuple[list, list, list, list] | None:
    """Per epoch: the mean over seeds of the paired difference (a run's validation NLL minus
    its seed's baseline run's) ± its 95 % CI; None without a seed in both."""
    points: dict[int, list[float]] = defaultdict(list)
    for seed in sorted(runs.keys() & baseline.keys()):
        mine, base = _epochs(runs[seed]), _epochs(baseline[seed])
        for epoch in sorted(mine.keys() & base.keys()):
            points[epoch].append(mine[epoch] - base[epoch])
    return _band(points) if points else None


def _with_epochs(cells: Cells) -> list[tuple[str, str]]:
    keys = sorted(cells, key=lambda k: (TYINGS.index(k[0]), specs.layer_order(k[1])))
    return [k for k in keys
            if all(r.train.valid_epochs is not None for r in cells[k].values())]


def _panel(cells: Cells) -> dict[str, tuple]:
    return {f"{t} × {la}": _ci_band(list(cells[(t, la)].values())) for t, la in _with_epochs(cells)}


def _delta_panels(arch: str, cells: Cells) -> dict[str, dict[str, tuple]]:
    """``ARCH: layer − dot``: each normalized layer against ``dot`` under three-way tying;
    ``ARCH: tying − untied``: each tying mode against untied, with ``dot``."""
    keys = _with_epochs(cells)
    pairs = {f"{arch}: layer − dot (three-way)":
             {f"{la} − {BASELINE}": ((THREE_WAY.name, la), (THREE_WAY.name, BASELINE))
              for t, la in keys if t == THREE_WAY.name and la != BASELINE},
             f"{arch}: tying − untied (dot)":
             {f"{t} − {UNTIED.name}": ((t, BASELINE), (UNTIED.name, BASELINE)) for t, la in keys
              if la == BASELINE and t != UNTIED.name}}
    out = {}
    for name, lines in pairs.items():
        bands = {label: band for label, (cell, base) in lines.items() if base in keys
                 and (band := _delta_band(cells[cell], cells[base])) is not None}
        if bands:
            out[name] = bands
    return out


def plots(sections: list[Section], out: Path) -> list[Path]:
    """``valid_nll_epochs.png``: validation NLL per epoch, a panel per architecture, a line
    per cell with its 95 % CI over seeds. ``valid_nll_delta_epochs.png``: the same as paired
    differences (seed by seed) from the cell each claim compares with, so that the epoch at
    which two cells separate shows against the zero line."""
    panels = {str(s.key): p for s in sections if (p := _panel(s.cells))}
    if not panels:
        return []
    path = out / "valid_nll_epochs.png"
    plot_bands(panels, path, "epoch", "validation NLL (base 2)",
               "Validation NLL per epoch: mean over seeds, band the 95 % CI")
    written = [path]
    deltas = {name: bands for s in sections
              for name, bands in _delta_panels(str(s.key), s.cells).items()}
    if deltas:
        written.append(out / "valid_nll_delta_epochs.png")
        plot_bands(deltas, written[-1], "epoch", "Δ validation NLL (base 2); below 0: lower",
                   "Paired Δ validation NLL per epoch (same seed): mean over seeds, band the "
                   "95 % CI", zero_line=True, sharey=False)
    return written
