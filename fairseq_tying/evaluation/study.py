"""The reproduction study's report: committed records → tables (in docs/results.md) and plots.

    python -m fairseq_tying.evaluation study --runs work/study/runs \\
        --records docs/study/records --report docs/results.md --plots docs/study

``--runs`` first exports the records of newly evaluated runs; without it the report is rebuilt
from the committed records alone. The tables replace the text between the report's
``<!-- study:begin -->`` and ``<!-- study:end -->`` markers; the rest is left as written.
"""

from __future__ import annotations

import hashlib
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import pearsonr

from fairseq_tying.common import LM_TASK
from fairseq_tying.common.atomic import markers, replace_block, write_json
from fairseq_tying.core.models.tying import TYING_MODES as TYINGS
from fairseq_tying.core.scoring import OUTPUT_LAYERS as LAYERS
from fairseq_tying.evaluation import claims, study_records
from fairseq_tying.evaluation.aggregate import (
    compare_seeds,
    format_delta,
    format_p,
    format_stat,
    points,
    stat,
    stats_of,
)
from fairseq_tying.evaluation.plots import (
    plot_bands,
    plot_bleu_grid,
    plot_curves,
    plot_norm_histograms,
    plot_seed_lines,
)
from fairseq_tying.evaluation.tables import markdown_table

BEGIN, END = markers("study")
# Liu et al. (2020), Transformer on IWSLT'14 Es→En, shared input–output embeddings.
PAPER_IWSLT14_ES_EN = {"dot": 34.24, "l2norm": 34.65, "sqnorm": 34.97, "distance": 34.54,
                       "cosine": 34.81}

Cells = dict[tuple[str, str], dict[int, dict[str, Any]]]  # (tying, layer) -> seed -> record


def group(records: Sequence[dict[str, Any]]) -> Cells:
    cells: Cells = defaultdict(dict)
    for r in records:
        key = (r["tying"], r["output_layer"])
        if r["seed"] in cells[key]:
            raise ValueError(f"two records for {key} seed {r['seed']} ({r['name']})")
        cells[key][r["seed"]] = r
    return cells


def check_references(records: Sequence[dict[str, Any]], refs: Sequence[str]) -> None:
    digest = hashlib.sha256(("\n".join(refs) + "\n").encode("utf-8")).hexdigest()
    for r in records:
        if r["eval"]["references_sha256"] != digest:
            raise ValueError(f"{r['name']} was scored against other references than --references"
                             f" (sha256 {r['eval']['references_sha256'][:12]}…, "
                             f"given {digest[:12]}…)")
        if len(r["hypotheses"]) != len(refs):
            raise ValueError(f"{r['name']}: {len(r['hypotheses'])} hypotheses for "
                             f"{len(refs)} references")


CELL_VALUES = {"bleu": lambda r: r["eval"]["bleu"], "chrf": lambda r: r["eval"]["chrf"],
               "valid_nll": lambda r: r["train"]["valid"]["nll_loss"]}


def common_epoch(cells: Cells) -> int | None:
    """The last epoch that every run trained to a plateau reached (None unless all were, with
    their per-epoch validation): where the runs compare at equal training."""
    records = [r for runs in cells.values() for r in runs.values()]
    if not records or not all("stop" in r["train"] and "valid_epochs" in r["train"]
                              for r in records):
        return None
    return min(r["train"]["stop"]["epoch"] for r in records)


def valid_nll_at(record: dict[str, Any], epoch: int) -> float:
    return next(v for e, _update, v in record["train"]["valid_epochs"] if e == epoch)


def summarize(cells: Cells, refs: Sequence[str], n_samples: int) -> dict[str, Any]:
    """Per cell: BLEU/chrF/valid NLL mean ± 95% CI, and the paired comparisons
    (``aggregate.compare``) against ``dot`` with the same tying and against the untied model
    with the same layer; for runs trained to a plateau, also the validation NLL at the
    ``common_epoch``, since the rule stops runs at different epochs."""
    out: dict[str, Any] = {}
    epoch = common_epoch(cells)
    for (tying, layer), runs in sorted(cells.items()):
        seeds = sorted(runs)
        records = [runs[s] for s in seeds]
        cell: dict[str, Any] = {"tying": tying, "output_layer": layer, "seeds": seeds,
                                **stats_of(records, CELL_VALUES)}
        cell["params"] = sorted({r["train"]["params"] for r in records})
        if all("stop" in r["train"] for r in records):  # trained to a plateau
            cell["stop"] = {"epochs": [r["train"]["stop"]["epoch"] for r in records],
                            "reasons": [r["train"]["stop"]["reason"] for r in records]}
        if all("eval_best" in r for r in records):
            cell["bleu_best"] = stat([r["eval_best"]["bleu"] for r in records])
        if epoch is not None:
            cell["valid_nll_common"] = {"epoch": epoch,
                                        **stat([valid_nll_at(r, epoch) for r in records])}
        if layer != "dot" and (test := compare_seeds(runs, cells.get((tying, "dot")), refs,
                                                     n_samples)):
            cell["vs_dot"] = test
        if tying != "none" and (test := compare_seeds(runs, cells.get(("none", layer)), refs,
                                                      n_samples)):
            cell["vs_untied"] = test
        out[f"{tying}/{layer}"] = cell
    return out


def _cell(summary: dict[str, Any], tying: str, layer: str) -> dict[str, Any] | None:
    return summary.get(f"{tying}/{layer}")


def _delta(cell: dict[str, Any], key: str, is_baseline: bool, per_seed: bool = True) -> str:
    if is_baseline:
        return "baseline"
    if key not in cell:
        return "no baseline run"
    return format_delta(cell[key], per_seed)


def stop_correlation(summary: dict[str, Any]) -> tuple[float, float, int] | None:
    """Pearson r (and its p) between the epoch at which each run stopped and its BLEU, over
    every run trained to a plateau: how much of a BLEU difference is training length. None
    when fewer than 3 runs have a stop or they all stopped at the same epoch."""
    pairs = [(e, b) for c in summary.values() if "stop" in c
             for e, b in zip(c["stop"]["epochs"], c["bleu"]["values"], strict=True)]
    if len(pairs) < 3 or len({e for e, _ in pairs}) < 2:
        return None
    r, p = pearsonr(*zip(*pairs, strict=True))
    return float(r), float(p), len(pairs)


def tables(summary: dict[str, Any]) -> str:
    tyings = [t for t in TYINGS if any(_cell(summary, t, la) for la in LAYERS)]
    seeds = sorted({s for c in summary.values() for s in c["seeds"]})

    def grid(fmt) -> str:
        rows = [[la] + [fmt(c) if (c := _cell(summary, t, la)) else "–" for t in tyings]
                for la in LAYERS]
        return markdown_table(["output layer", *tyings], rows)

    parts = [f"Seeds: {', '.join(map(str, seeds))}. Mean ± 95 % CI (Student t over seeds).\n",
             "**BLEU** (sacrebleu, detokenized, test set)\n",
             grid(lambda c: f"{format_stat(c['bleu'])} (n={len(c['seeds'])})"),
             "\n**Δ BLEU against `dot` with the same tying**: mean over seeds of the paired "
             "difference ± its 95 % CI over seeds (training variance); p of the paired bootstrap "
             "over test sentences, pooled over the seeds (test-set variance); per-seed p in "
             "brackets\n"]

    parts += [grid(lambda c: _delta(c, "vs_dot", c["output_layer"] == "dot")),
              "\n**Δ BLEU of tying against the untied model with the same output layer** "
              "(p as above)\n",
              grid(lambda c: _delta(c, "vs_untied", c["tying"] == "none")),
              "\n**chrF**\n", grid(lambda c: format_stat(c["chrf"])),
              "\n**Validation NLL** (base 2, per token, last validation)\n",
              grid(lambda c: format_stat(c["valid_nll"], 3))]
    if all("stop" in c for c in summary.values()):
        parts += ["\n**Epochs trained** (mean over seeds; stop reasons)\n",
                  grid(_epochs),
                  "\n**BLEU of the best single checkpoint** (lowest validation NLL), beside the "
                  "average of the last epochs above\n",
                  grid(lambda c: format_stat(c["bleu_best"]) if "bleu_best" in c else "–")]
    if corr := stop_correlation(summary):
        r, p, n = corr
        parts += [f"\n**BLEU and training length**: over the {n} runs, test BLEU against the "
                  f"epoch at which the run stopped has Pearson r = {r:.2f} ({format_p(p)}).\n"]
    if all("valid_nll_common" in c for c in summary.values()):
        epoch = next(iter(summary.values()))["valid_nll_common"]["epoch"]
        parts += [f"\n**Validation NLL after epoch {epoch}**, the last epoch every run reached: "
                  "the runs at equal training, where the plateau rule stops them at different "
                  "epochs\n",
                  grid(lambda c: format_stat(c["valid_nll_common"], 3))]
    parts += ["\n**Parameters** (fairseq's count of the trained model)\n", params_table(summary)]
    parts += ["\n**Side by side with the paper** (Transformer, IWSLT'14 Es→En; ours: three-way "
              "tying on the Bible, mean over seeds)\n", paper_table(summary)]
    if table := claims.claims_table(summary):
        parts += [f"\n**The papers' claims**: {claims.RULE} (Δ and p as above)\n", table]
    return "\n".join(parts)


def _epochs(cell: dict[str, Any]) -> str:
    stop = cell["stop"]
    reasons = ", ".join(f"{stop['reasons'].count(r)} {r}" for r in sorted(set(stop["reasons"])))
    epochs = "/".join(str(e) for e in stop["epochs"])
    return f"{np.mean(stop['epochs']):.1f} ({epochs}; {reasons})"


def params_table(summary: dict[str, Any]) -> str:
    rows, untied = [], None
    for t in TYINGS:
        counts = sorted({n for la in LAYERS if (c := _cell(summary, t, la)) for n in c["params"]})
        if not counts:
            continue
        if len(counts) > 1:
            raise ValueError(f"tying {t}: output layers disagree on the parameter count {counts}")
        untied = counts[0] if t == "none" else untied
        rel = f"{counts[0] / untied:.1%}" if untied else "–"
        rows.append([t, f"{counts[0]:,}", rel])
    return markdown_table(["tying", "parameters", "of untied"], rows)


def paper_table(summary: dict[str, Any]) -> str:
    rows = []
    base = PAPER_IWSLT14_ES_EN["dot"]
    for la in LAYERS:
        c = _cell(summary, "three_way", la)
        paper = PAPER_IWSLT14_ES_EN[la]
        ours = format_stat(c["bleu"]) if c else "–"
        if la == "dot":
            ours_delta = "baseline"
        elif c and "vs_dot" in c:
            ours_delta = _delta(c, "vs_dot", False, per_seed=False)
        else:
            ours_delta = "–"
        rows.append([la, f"{paper:.2f}", "baseline" if la == "dot" else f"{paper - base:+.2f}",
                     ours, ours_delta])
    return markdown_table(["output layer", "paper BLEU", "paper Δ", "our BLEU", "our Δ"], rows)


def plots(cells: Cells, summary: dict[str, Any], out: Path) -> list[Path]:
    groups = {}
    for t in TYINGS:
        marks = [points(la, c["bleu"], baseline=la == "dot")
                 for la in LAYERS if (c := _cell(summary, t, la))]
        if marks:
            groups[t] = marks
    written = [out / "bleu.png"]
    plot_bleu_grid(groups, written[0])
    written.append(out / "valid_nll.png")
    plot_curves(_per_tying(cells, _mean_curve), written[-1], "updates",
                "validation NLL (base 2)", "Validation NLL during training, mean over seeds")
    if all("valid_epochs" in r["train"] for runs in cells.values() for r in runs.values()):
        written.append(out / "valid_nll_epochs.png")
        plot_bands(_per_tying(cells, _epoch_band), written[-1], "epoch",
                   "validation NLL (base 2)",
                   "Validation NLL per epoch: mean over seeds, band from min to max")
    if all("stop" in c for c in summary.values()):  # trained to a plateau
        written.append(out / "bleu_by_stop_epoch.png")
        plot_seed_lines({f"{t} × {la}": [(r["train"]["stop"]["epoch"], r["eval"]["bleu"])
                                         for r in cells[(t, la)].values()]
                         for t in TYINGS for la in LAYERS if (t, la) in cells},
                        written[-1], "epoch at which the run stopped", "BLEU (sacrebleu)",
                        "BLEU against training length: one dot per seed, a line per cell")
    for t in TYINGS:
        runs = [(la, cells[(t, la)]) for la in LAYERS if (t, la) in cells]
        if runs:
            seed = min(min(r) for _, r in runs)
            chosen = [(la, r[seed]) for la, r in runs
                      if seed in r and r[seed]["output_row_norms"] is not None]
            if not chosen:  # exported with --without-row-norms
                continue
            path = out / f"norms_{t}.png"
            plot_norm_histograms([np.asarray(r["output_row_norms"]) for _, r in chosen],
                                 [f"{la} (seed {seed})" for la, _ in chosen], path,
                                 title=f"Row norms of the output matrix, tying: {t}")
            written.append(path)
    return written


def _per_tying(cells: Cells, curve: Callable[[Iterable[dict]], tuple]) -> dict[str, dict]:
    """Plot panels: per tying mode, ``curve`` of each output layer's runs."""
    return {f"tying: {t}": {la: curve(cells[(t, la)].values()) for la in LAYERS if (t, la) in cells}
            for t in TYINGS if any((t, la) in cells for la in LAYERS)}


def _mean_curve(records) -> tuple[list[float], list[float]]:
    """The validation NLL at each update count, averaged over the runs that have it."""
    points: dict[int, list[float]] = defaultdict(list)
    for r in records:
        for updates, nll in r["train"]["valid_history"]:
            points[updates].append(nll)
    xs = sorted(points)
    return xs, [sum(points[x]) / len(points[x]) for x in xs]


def _epoch_band(records) -> tuple[list[float], list[float], list[float], list[float]]:
    """Per epoch: mean, min and max of the validation value over the runs that reached it."""
    points: dict[int, list[float]] = defaultdict(list)
    for r in records:
        for epoch, _update, value in r["train"]["valid_epochs"]:
            points[epoch].append(value)
    xs = sorted(points)
    return (xs, [float(np.mean(points[x])) for x in xs], [min(points[x]) for x in xs],
            [max(points[x]) for x in xs])


def build(records_dir: str | os.PathLike, report: str | os.PathLike, plots_dir: str | os.PathLike,
          references: Sequence[str], runs: str | os.PathLike | None = None,
          n_samples: int = 1000, block: str = "study", row_norms: bool = True
          ) -> dict[str, Any]:
    """Export new records (``runs``), then rebuild the tables of ``block`` in ``report`` and the
    plots from the records alone. Records of a second architecture (e.g. DynamicConv beside
    the Transformer) get their own tables below the first one's."""
    exported = study_records.export(runs, records_dir, row_norms) if runs else []
    records = study_records.load(records_dir)
    lm = [r for r in records if r.get("task") == LM_TASK]
    if lm:  # the perplexity study: its own view on the same statistics
        if len(lm) != len(records):
            raise ValueError(f"{records_dir}: language-model and translation records mixed; "
                             "keep each study's records in a folder of its own")
        from fairseq_tying.evaluation import lm_study

        done = lm_study.build(lm, report, plots_dir, block)
        return {"exported": exported, "records": len(records), **done}
    check_references(records, references)
    by_arch: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_arch[r["arch"]].append(r)
    archs = sorted(by_arch, key=lambda a: -len(by_arch[a]))  # the main architecture first
    plots_dir = Path(plots_dir)
    plots_dir.mkdir(parents=True, exist_ok=True)
    texts, summaries, pngs = [], {}, []
    for i, arch in enumerate(archs):
        cells = group(by_arch[arch])
        summaries[arch] = summarize(cells, references, n_samples)
        out = plots_dir if i == 0 else plots_dir / arch
        out.mkdir(parents=True, exist_ok=True)
        pngs += plots(cells, summaries[arch], out)
        text = tables(summaries[arch])
        texts.append(text if i == 0 else f"### `{arch}`\n\n{text}")
    summary = summaries[archs[0]] if len(archs) == 1 else summaries
    write_json(plots_dir / "summary.json", summary, indent=1)
    text = "\n\n".join(texts)
    replace_block(report, block, text, new_file="# Results\n")
    return {"exported": exported, "records": len(records), "markdown": text,
            "written": [str(report), str(plots_dir / "summary.json"), *map(str, pngs)]}
