"""``collect RUNS_ROOT --out DIR``: the scores of the evaluated runs under a folder, one table per
test set: each method's mean ± CI over its runs, each run's scores, and a plot.

It compares nothing. A sweep's differences, their p-values and verdicts are its answer's
(``studies answer SWEEP.yaml``, which the launcher runs after a sweep's last evaluation:
``studies.sweep_summary``), each cell against its own baseline; a table of every method against
one baseline here would be a second set of Δs of the same runs. The run folders' view of the
engine (``specs.RUNS``): each ``eval.json`` is a record, a method's runs a cell."""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fairseq_tying.common.atomic import write_json, write_text
from fairseq_tying.common.run_spec import SHOWN
from fairseq_tying.common.tables import markdown_table
from fairseq_tying.studies.engine import engine
from fairseq_tying.studies.engine.specs import RUN_METRICS, RUNS, test_set
from fairseq_tying.studies.records.record import Record, Translation
from fairseq_tying.studies.records.records import load_evaluated
from fairseq_tying.studies.statistics.cells import Cell, Stat
from fairseq_tying.studies.views.formatting import format_stat
from fairseq_tying.studies.views.plots import plot_methods, points

COMPARISONS = ("No Δ or p here: a sweep's comparisons and their verdicts are its answer's, "
               "each cell against its own baseline (`python -m fairseq_tying.studies answer "
               "SWEEP.yaml`; the launcher writes it into the sweep's output folder).")


def method_row(cell: Cell) -> dict[str, Any]:
    """One method's row of ``results.json``: mean ± CI of each metric over its runs."""
    return {
        **asdict(cell.head),
        "seeds": list(cell.seeds),
        **{f"{k}_mean": cell.stat(k).mean for k in RUN_METRICS},
        **{f"{k}_ci95": cell.stat(k).ci95 for k in RUN_METRICS},
        "bleu_values": list(cell.stat("bleu").values),
    }


def run_rows(runs: engine.Runs) -> list[dict[str, Any]]:
    """Each run's row of ``results.json``: its identity and scores."""
    return [{**{k: getattr(r.run, k) for k in SHOWN},
             **{k: getattr(r.eval, k) for k in RUN_METRICS},
             "run_dir": str(r.run_dir)}
            for r in runs.values()]


def summarize_group(records: list[Record]) -> dict:
    (section,) = engine.sections(RUNS, records)
    first = records[0].eval
    return {
        "title": group_title(first),
        "signatures": {k: getattr(first, f"{k}_signature") for k in RUN_METRICS},
        "methods": [method_row(c) for c in section.summary.values()],
        "runs": [row for runs in section.cells.values() for row in run_rows(runs)],
    }


def group_title(ev: Translation) -> str:
    return f"{ev.corpus or 'data'} {ev.src}→{ev.tgt} ({ev.subset})"


def method_table(group: dict) -> str:
    rows = []
    for m in group["methods"]:
        ci = {k: format_stat(Stat((), m[f"{k}_mean"], m[f"{k}_ci95"])) for k in RUN_METRICS}
        rows.append([m["method"], m["tying"], m["output_layer"], len(m["seeds"]), ci["bleu"],
                     ci["tok_bleu"], ci["chrf"]])
    return markdown_table(["Method", "Tying", "Output", "Seeds", "BLEU", "tok. BLEU", "chrF"],
                          rows)


def run_table(rows: list[dict[str, Any]]) -> str:
    """Each run's scores: name, method, seed, BLEU, tokenized BLEU, chrF."""
    return markdown_table(["Run", "Method", "Seed", "BLEU", "tok. BLEU", "chrF"],
                          [[r["name"], r["method"], r["seed"], f"{r['bleu']:.2f}",
                            f"{r['tok_bleu']:.2f}", f"{r['chrf']:.2f}"] for r in rows])


def group_markdown(group: dict) -> str:
    sig = group["signatures"]
    return (
        f"## {group['title']}\n\n"
        "Mean ± 95% CI over each method's runs (t distribution), then each run.\n\n"
        + method_table(group)
        + "\n"
        + run_table(group["runs"])
        + f"\nBLEU: `{sig['bleu']}`  \ntok. BLEU: `{sig['tok_bleu']}`  \nchrF: `{sig['chrf']}`\n"
    )


def collect(root: str | os.PathLike, out: str | os.PathLike) -> dict:
    """``results.md``, ``results.json`` and ``bleu.png`` in ``out`` for the runs under
    ``root``."""
    groups: dict[tuple, list[Record]] = defaultdict(list)
    for rec in load_evaluated(root):
        groups[test_set(rec)].append(rec)
    keys = sorted(groups, key=lambda k: tuple(str(x) for x in k))
    summaries = [summarize_group(groups[k]) for k in keys]
    titles = [g["title"] for g in summaries]
    for g, key in zip(summaries, keys, strict=True):
        if titles.count(g["title"]) > 1:  # same corpus name, different references
            g["title"] += f" [refs {key[-1][:8]}]"
    out = Path(out)
    markdown = ("# Scores\n\n" + COMPARISONS + "\n\n"
                + "\n".join(group_markdown(g) for g in summaries))
    results = {"root": str(Path(root).resolve()), "groups": summaries}
    plot_methods({g["title"]: [points(m["method"], Stat(tuple(m["bleu_values"]), m["bleu_mean"],
                                                        m["bleu_ci95"]))
                               for m in g["methods"]] for g in summaries}, out / "bleu.png")
    write_json(out / "results.json", results)
    write_text(out / "results.md", markdown)
    return {"markdown": markdown, "results": results}
