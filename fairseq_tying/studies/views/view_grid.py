"""The translation studies' tables and plots (``specs.GRID``): a grid of output layers × tying
modes per value, the paired Δs, the parameters, our Δs beside the papers' (their Δs only, with
what they measure; never a paper's BLEU, which is another corpus's and model's) and the papers'
claims (a counted difference against one reads "not replicated here") with each one's Δ per test
document, one set per architecture (the main one first, the others under their own heading),
under the study's scope."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from fairseq_tying.common.extras import require
from fairseq_tying.common.tables import markdown_table
from fairseq_tying.core.models.tying import THREE_WAY, UNTIED
from fairseq_tying.core.models.tying import TYING_MODES as TYINGS
from fairseq_tying.core.output_layers import BASELINE
from fairseq_tying.core.output_layers import OUTPUT_LAYERS as LAYERS
from fairseq_tying.evaluation.norms import plot_norm_histograms
from fairseq_tying.studies import FOR_WHAT
from fairseq_tying.studies.engine import specs
from fairseq_tying.studies.engine.engine import Cells, Section, band
from fairseq_tying.studies.statistics import verdicts
from fairseq_tying.studies.statistics.cells import Cell, Summary
from fairseq_tying.studies.views.formatting import (
    DOCUMENTS_CAPTION,
    documents_table,
    epochs_text,
    format_delta,
    format_p,
    format_stat,
    holm_changes,
    legend,
    paper_claim,
    paper_figures,
    papers_legend,
    scope,
    shared_means,
)
from fairseq_tying.studies.views.plots import (
    plot_bands,
    plot_bleu_grid,
    plot_curves,
    plot_seed_lines,
    points,
)

pearsonr = require("scipy.stats", "analysis", FOR_WHAT).pearsonr


def cell_of(summary: Summary, tying: str, layer: str) -> Cell | None:
    return summary.get(f"{tying}/{layer}")


def _delta(summary: Summary, cell: Cell, key: str, is_baseline: bool,
           per_seed: bool = True) -> str:
    """The cell's Δ against its baseline (``key``), with the two means over the seeds the Δ
    pairs where a cell has others."""
    if is_baseline:
        return "baseline"
    if (test := cell.test(key)) is None:
        return "no baseline run"
    note = shared_means(test, cell, summary[specs.baseline_label(cell, key)])
    return format_delta(test, per_seed, note)


def stop_correlation(summary: Summary) -> tuple[float, float, int] | None:
    """Pearson r (and its p) between the epoch at which each run stopped and its BLEU, over
    every run trained to a plateau: how much of a BLEU difference is training length. None
    when fewer than 3 runs have a stop or they all stopped at the same epoch."""
    pairs = [(e, b) for c in summary.values() if c.stop is not None
             for e, b in zip(c.stop.epochs, c.stat("bleu").values, strict=True)]
    if len(pairs) < 3 or len({e for e, _ in pairs}) < 2:
        return None
    r, p = pearsonr(*zip(*pairs, strict=True))
    return float(r), float(p), len(pairs)


def claims_table(summary: Summary) -> str | None:
    """The claims whose cells the study has, as a markdown table (None when it has none); a
    paper's claim reads its verdict ``verdicts.on_paper``."""
    claims = specs.claims_of(summary)
    if not claims:
        return None
    rows = [[c.text, c.source, _delta(summary, summary[c.cell], c.test, False),
             verdicts.on_paper(verdict, test, c.paper) if paper_claim(c.source) else verdict]
            for c, test, verdict in claims]
    changes = [(c.text, *([verdicts.paper_outcome(w, test, c.paper) for w in changed]
                          if paper_claim(c.source) else changed))
               for c, test, _ in claims if (changed := specs.changed_by_holm(test, c.expects))]
    return markdown_table(["claim", "source", "Δ BLEU", "verdict"], rows) + (
        f"\n\n{holm_changes(changes)}" if changes else "")


def tables(summary: Summary, arch: str = "") -> str:
    """The study's tables: a row per output layer and a column per tying mode that has runs;
    a Δ table only where it has a pair to compare, the papers' Δs (for the family of ``arch``)
    beside ours only where three-way tying has runs of a layer with one."""
    tyings = [t for t in TYINGS if any(cell_of(summary, t, la) for la in LAYERS)]
    layers = [la for la in LAYERS if any(cell_of(summary, t, la) for t in tyings)]

    def grid(fmt) -> str:
        rows = [[la] + [fmt(c) if (c := cell_of(summary, t, la)) else "–" for t in tyings]
                for la in layers]
        return markdown_table(["output layer", *tyings], rows)

    parts = ["Mean ± 95 % CI (Student t over seeds).\n",
             "**BLEU** (sacrebleu, detokenized, test set)\n",
             grid(lambda c: f"{format_stat(c.stat('bleu'))} (n={len(c.seeds)})")]
    if BASELINE in layers and len(layers) > 1:
        parts += ["\n**Δ BLEU against `dot` with the same tying**: mean over the seeds both cells "
                  "share of the paired difference ± its 95 % CI over them (training variance; "
                  "where a cell has other seeds, the two means over the shared ones first); p of "
                  "the paired bootstrap over test sentences, pooled over the seeds (test-set "
                  "variance); per-seed p in brackets\n",
                  grid(lambda c: _delta(summary, c, "vs_dot", c.head.output_layer == BASELINE))]
    if UNTIED.name in tyings and len(tyings) > 1:
        parts += ["\n**Δ BLEU of tying against the untied model with the same output layer** "
                  "(p as above; for a tying claim, the equivalence test's p last)\n",
                  grid(lambda c: _delta(summary, c, "vs_untied", c.head.tying == UNTIED.name))]
    parts += ["\n**chrF**\n", grid(lambda c: format_stat(c.stat("chrf"))),
              "\n**Validation NLL** (base 2, per token, last validation)\n",
              grid(lambda c: format_stat(c.stat("valid_nll"), 3))]
    if all(c.stop is not None for c in summary.values()):
        parts += ["\n**Epochs trained** (mean over seeds; stop reasons)\n",
                  grid(epochs_text),
                  "\n**BLEU of the best single checkpoint** (lowest validation NLL), beside the "
                  "average of the last epochs above\n",
                  grid(lambda c: "–" if (best := c.stat("bleu_best")) is None
                       else format_stat(best))]
    if corr := stop_correlation(summary):
        r, p, n = corr
        parts += [f"\n**BLEU and training length**: over the {n} runs, test BLEU against the "
                  f"epoch at which the run stopped has Pearson r = {r:.2f} ({format_p(p)}).\n"]
    if all(c.valid_nll_common is not None for c in summary.values()):
        epoch = next(iter(summary.values())).valid_nll_common.epoch
        parts += [f"\n**Validation NLL after epoch {epoch}**, the last epoch every run reached: "
                  "the runs at equal training, where the plateau rule stops them at different "
                  "epochs\n",
                  grid(lambda c: format_stat(c.valid_nll_common.stat, 3))]
    parts += ["\n**Parameters** (fairseq's count of the trained model)\n", params_table(summary)]
    if THREE_WAY.name in tyings and (papers := paper_table(summary, arch)):
        table, layers_with = papers
        parts += ["\n**Our Δ beside the paper's Δ** (ours: three-way tying on the Bible, mean "
                  f"over seeds; {papers_legend(layers_with)})\n", table]
    if table := claims_table(summary):
        parts += [f"\n**The papers' claims**: {legend(*specs.family_of([summary]), papers=True)}"
                  " (Δ and p as above)\n", table]
        if by_document := documents_table(["claim"], [([c.text], test) for c, test, _ in
                                                      specs.claims_of(summary)]):
            parts += [f"\n{DOCUMENTS_CAPTION}", by_document]
    return "\n".join(parts)


def params_table(summary: Summary) -> str:
    rows, untied = [], None
    for t in TYINGS:
        counts = sorted({n for la in LAYERS if (c := cell_of(summary, t, la))
                         for n in c.params})
        if not counts:
            continue
        if len(counts) > 1:
            raise ValueError(f"tying {t}: output layers disagree on the parameter count {counts}")
        untied = counts[0] if t == UNTIED.name else untied
        rel = f"{counts[0] / untied:.1%}" if untied else "–"
        rows.append([t, f"{counts[0]:,}", rel])
    return markdown_table(["tying", "parameters", "of untied"], rows)


def paper_table(summary: Summary, arch: str = "") -> tuple[str, list[str]] | None:
    """Our three-way cells beside the Δ over ``dot`` that each layer's paper reports for the
    family of ``arch`` (``formatting.paper_figures``), for the layers with one and a three-way
    run, ``dot`` first as the baseline; with those layers. None without any such layer."""
    layers = [la for la in LAYERS if la != BASELINE and paper_figures(la, arch)
              and cell_of(summary, THREE_WAY.name, la)]
    if not layers:
        return None
    rows = []
    for la in (BASELINE, *layers):
        c = cell_of(summary, THREE_WAY.name, la)
        ours = format_stat(c.stat("bleu")) if c else "–"
        if la == BASELINE:
            paper = ours_delta = "baseline"
        else:
            paper = ", ".join(map(str, paper_figures(la, arch)))
            ours_delta = ("–" if c.test("vs_dot") is None
                          else _delta(summary, c, "vs_dot", False, per_seed=False))
        rows.append([la, paper, ours, ours_delta])
    return markdown_table(["output layer", "paper Δ (the paper's corpus and model)",
                           "our BLEU", "our Δ"], rows), layers


def render(sections: list[Section]) -> tuple[str, Any]:
    """The block's text (its scope first, ``formatting.scope``) and ``summary.json`` (one
    architecture's summary, else one per architecture) of a translation study's sections."""
    texts = [scope(sections).rstrip()]
    texts += [tables(s.summary, str(s.key)) if i == 0
              else f"### `{s.key}`\n\n{tables(s.summary, str(s.key))}"
              for i, s in enumerate(sections)]
    summary = sections[0].summary if len(sections) == 1 else {s.key: s.summary for s in sections}
    return "\n\n".join(texts), summary


def plots(sections: list[Section], out: Path) -> list[Path]:
    """Each section's plots: the first in ``out``, the others in ``out/ARCH``."""
    written = []
    for i, s in enumerate(sections):
        folder = out if i == 0 else out / str(s.key)
        folder.mkdir(parents=True, exist_ok=True)
        written += section_plots(s.cells, s.summary, folder)
    return written


def section_plots(cells: Cells, summary: Summary, out: Path) -> list[Path]:
    groups = {}
    for t in TYINGS:
        marks = [points(la, c.stat("bleu"), baseline=la == BASELINE)
                 for la in LAYERS if (c := cell_of(summary, t, la))]
        if marks:
            groups[t] = marks
    written = [out / "bleu.png"]
    plot_bleu_grid(groups, written[0])
    written.append(out / "valid_nll.png")
    plot_curves(_per_tying(cells, _mean_curve), written[-1], "updates",
                "validation NLL (base 2)", "Validation NLL during training, mean over seeds")
    if all(r.train.valid_epochs is not None for runs in cells.values() for r in runs.values()):
        written.append(out / "valid_nll_epochs.png")
        plot_bands(_per_tying(cells, band), written[-1], "epoch", "validation NLL (base 2)",
                   "Validation NLL per epoch: mean over seeds, band from min to max")
    if all(c.stop is not None for c in summary.values()):  # trained to a plateau
        written.append(out / "bleu_by_stop_epoch.png")
        plot_seed_lines({f"{t} × {la}": [(r.train.stop.epoch, r.eval.bleu)
                                         for r in cells[(t, la)].values()]
                         for t in TYINGS for la in LAYERS if (t, la) in cells},
                        written[-1], "epoch at which the run stopped", "BLEU (sacrebleu)",
                        "BLEU against training length: one dot per seed, a line per cell")
    for t in TYINGS:
        runs = [(la, cells[(t, la)]) for la in LAYERS if (t, la) in cells]
        if runs:
            seed = min(min(r) for _, r in runs)
            chosen = [(la, r[seed]) for la, r in runs
                      if seed in r and r[seed].output_row_norms is not None]
            if not chosen:  # exported with --without-row-norms
                continue
            path = out / f"norms_{t}.png"
            plot_norm_histograms([np.asarray(r.output_row_norms) for _, r in chosen],
                                 [f"{la} (seed {seed})" for la, _ in chosen], path,
                                 title=f"Row norms of the output matrix, tying: {t}")
            written.append(path)
    return written


def _per_tying(cells: Cells, curve: Callable[[Iterable], tuple]) -> dict[str, dict]:
    """Plot panels: per tying mode, ``curve`` of each output layer's runs."""
    return {f"tying: {t}": {la: curve(list(cells[(t, la)].values())) for la in LAYERS
                            if (t, la) in cells}
            for t in TYINGS if any((t, la) in cells for la in LAYERS)}


def _mean_curve(records) -> tuple[list[float], list[float]]:
    """The validation NLL at each update count, averaged over the runs that have it."""
    points: dict[int, list[float]] = defaultdict(list)
    for r in records:
        for updates, nll in r.train.valid_history:
            points[updates].append(nll)
    xs = sorted(points)
    return xs, [sum(points[x]) / len(points[x]) for x in xs]
