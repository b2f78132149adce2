"""``collect RUNS_ROOT --out DIR``: tables, significance tests and plots across the evaluated runs
of a sweep, one table per test set, methods against a baseline method.

The run folders' view of the engine (``specs.runs_spec``): each ``eval.json`` is a record, a
method's runs a cell, compared with the baseline method run by run (the baseline run of the
same seed)."""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from fairseq_tying.common.atomic import read_lines, write_json, write_text
from fairseq_tying.common.run_spec import SHOWN
from fairseq_tying.common.tables import markdown_table
from fairseq_tying.studies.engine import engine
from fairseq_tying.studies.engine.specs import RUN_METRICS, default_baseline, runs_spec, test_set
from fairseq_tying.studies.records.record import Record, Translation
from fairseq_tying.studies.records.records import load_evaluated
from fairseq_tying.studies.statistics import verdicts
from fairseq_tying.studies.statistics.cells import Bootstrap, Cell, Stat
from fairseq_tying.studies.views.formatting import format_delta, format_stat, p_digits
from fairseq_tying.studies.views.plots import plot_methods, points


def choose_baseline(records: list[Record], baseline: str | None) -> str:
    methods = sorted({r.run.method for r in records})
    if baseline is not None and baseline not in methods:
        raise ValueError(f"--baseline {baseline!r} is not a method here; methods: {methods}")
    return baseline or default_baseline(records)


def method_row(cell: Cell) -> dict[str, Any]:
    """One method's row of ``results.json``: mean ± CI of each metric and, but for the
    baseline, the paired comparison against it."""
    tests = cell.test("vs_baseline")
    ps = list(tests.bleu.per_seed_p.values()) if tests else []
    return {
        **asdict(cell.head),
        "seeds": list(cell.seeds),
        **{f"{k}_mean": cell.stat(k).mean for k in RUN_METRICS},
        **{f"{k}_ci95": cell.stat(k).ci95 for k in RUN_METRICS},
        "bleu_values": list(cell.stat("bleu").values),
        "delta_bleu": tests.bleu.delta if tests else 0.0,
        "vs_baseline": tests.bleu.to_dict() if tests else None,
        "bleu_p_values": ps,
        "significant_runs": sum(map(verdicts.significant, ps)),
    }


def run_rows(runs: engine.Runs, cell: Cell) -> list[dict[str, Any]]:
    """Each run's row of ``results.json``: its scores and its own pair's p."""
    tests = cell.test("vs_baseline")
    return [{**{k: getattr(r.run, k) for k in SHOWN},
             **{k: getattr(r.eval, k) for k in RUN_METRICS},
             "bleu_p": tests.bleu.per_seed_p[r.name] if tests else None,
             "chrf_p": tests.chrf.per_seed_p[r.name] if tests else None,
             "baseline_run": tests.pairs[r.name] if tests else None,
             "run_dir": str(r.run_dir)}
            for r in runs.values()]


def summarize_group(records: list[Record], baseline: str | None, n_samples: int) -> dict:
    base = choose_baseline(records, baseline)
    refs = read_lines(records[0].eval.references)
    (section,) = engine.sections(runs_spec(base), records, refs, n_samples)
    cells = list(section.summary.values())
    first = records[0].eval
    return {
        "title": group_title(first), "baseline": base, "n_bootstrap": n_samples,
        "signatures": {k: getattr(first, f"{k}_signature") for k in RUN_METRICS},
        "methods": [method_row(c) for c in cells],
        "runs": [row for runs, c in zip(section.cells.values(), cells, strict=True)
                 for row in run_rows(runs, c)],
    }


def group_title(ev: Translation) -> str:
    return f"{ev.corpus or 'data'} {ev.src}→{ev.tgt} ({ev.subset})"


def _fmt_p(p: float | None) -> str:
    return "" if p is None else f"{p:.4f}"


def paired_means(group: dict, method: str) -> str:
    """``paired runs: 30.84 − 29.56``: the method's mean BLEU and its paired baseline runs' mean,
    whose difference its Δ is, where those baseline runs are not the baseline's runs, one each
    (the baseline has other seeds, or a run stands in for a missing seed); else ""."""
    bleu = {r["name"]: r["bleu"] for r in group["runs"]}
    mine = [r for r in group["runs"] if r["method"] == method]
    paired = sorted(r["baseline_run"] for r in mine)
    if paired == sorted(r["name"] for r in group["runs"] if r["method"] == group["baseline"]):
        return ""
    return (f"paired runs: {np.mean([r['bleu'] for r in mine]):.2f} − "
            f"{np.mean([bleu[name] for name in paired]):.2f}")


def method_table(group: dict) -> str:
    rows = []
    for m in group["methods"]:
        ci = {k: format_stat(Stat((), m[f"{k}_mean"], m[f"{k}_ci95"])) for k in RUN_METRICS}
        sig = "baseline" if m["baseline"] else (
            f"{m['significant_runs']}/{len(m['bleu_p_values'])} "
            f"(p={', '.join(p_digits(p, compact=True) for p in m['bleu_p_values'])})")
        delta = "" if m["baseline"] else format_delta(Bootstrap.from_dict(m["vs_baseline"]),
                                                      per_seed=False,
                                                      note=paired_means(group, m["method"]))
        rows.append([m["method"], m["tying"], m["output_layer"], len(m["seeds"]), ci["bleu"],
                     ci["tok_bleu"], ci["chrf"], delta, sig])
    return markdown_table(["Method", "Tying", "Output", "Seeds", "BLEU", "tok. BLEU", "chrF",
                           "Δ BLEU (paired)", "significant runs (BLEU)"], rows)


def group_markdown(group: dict) -> str:
    rrows = [[r["name"], r["method"], r["seed"], f"{r['bleu']:.2f}", f"{r['tok_bleu']:.2f}",
              f"{r['chrf']:.2f}", _fmt_p(r["bleu_p"]), _fmt_p(r["chrf_p"]), r["baseline_run"] or ""]
             for r in group["runs"]]
    sig = group["signatures"]
    return (
        f"## {group['title']}\n\n"
        f"Mean ± 95% CI over seeds (t distribution). Baseline: `{group['baseline']}`. Each run is "
        "paired with the baseline run of the same seed; Δ BLEU: mean of the paired differences ± "
        "its 95% CI over the pairs (where the paired baseline runs are not the baseline's runs, "
        "the two means over the pairs first), p of the paired bootstrap resampling "
        f"({group['n_bootstrap']} samples) pooled over the pairs; per run, p of its own pair "
        f"(sacrebleu's paired bootstrap test); significant: p < {verdicts.ALPHA}.\n\n"
        + method_table(group)
        + "\n"
        + markdown_table(["Run", "Method", "Seed", "BLEU", "tok. BLEU", "chrF", "p BLEU",
                          "p chrF", "vs"], rrows)
        + f"\nBLEU: `{sig['bleu']}`  \ntok. BLEU: `{sig['tok_bleu']}`  \nchrF: `{sig['chrf']}`\n"
    )


def collect(root: str | os.PathLike, out: str | os.PathLike, baseline: str | None = None,
            n_samples: int = 1000) -> dict:
    """``results.md``, ``results.json`` and ``bleu.png`` in ``out`` for the runs under
    ``root``."""
    groups: dict[tuple, list[Record]] = defaultdict(list)
    for rec in load_evaluated(root):
        groups[test_set(rec)].append(rec)
    keys = sorted(groups, key=lambda k: tuple(str(x) for x in k))
    summaries = [summarize_group(groups[k], baseline, n_samples) for k in keys]
    titles = [g["title"] for g in summaries]
    for g, key in zip(summaries, keys, strict=True):
        if titles.count(g["title"]) > 1:  # same corpus name, different references
            g["title"] += f" [refs {key[-1][:8]}]"
    out = Path(out)
    markdown = "# Results\n\n" + "\n".join(group_markdown(g) for g in summaries)
    results = {"root": str(Path(root).resolve()), "groups": summaries}
    plot_methods({g["title"]: [points(m["method"], Stat(tuple(m["bleu_values"]), m["bleu_mean"],
                                                        m["bleu_ci95"]), m["baseline"])
                               for m in g["methods"]] for g in summaries}, out / "bleu.png")
    write_json(out / "results.json", results)
    write_text(out / "results.md", markdown)
    return {"markdown": markdown, "results": results}
