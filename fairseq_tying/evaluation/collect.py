"""``collect RUNS_ROOT --out DIR``: tables, significance tests and plots across the evaluated runs
of a sweep, one table per test set, methods against a baseline method.

The launcher's view of ``aggregate``'s pipeline (the study's is ``study``): each ``eval.json``
becomes a record, a method's runs a cell, compared with the baseline method seed by seed."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import fields
from pathlib import Path
from typing import Any

from tqdm import tqdm

from fairseq_tying.common import EVAL_JSON
from fairseq_tying.common.atomic import read_lines, write_json, write_text
from fairseq_tying.evaluation.aggregate import (
    Record,
    compare,
    format_delta,
    format_stat,
    points,
    stats_of,
)
from fairseq_tying.evaluation.plots import plot_methods
from fairseq_tying.evaluation.records import RunRecord, read_run_json
from fairseq_tying.evaluation.tables import markdown_table

METRICS = ("bleu", "tok_bleu", "chrf")
REQUIRED = ("run", *METRICS, "src", "tgt", "subset", "hypotheses", "references",
            "references_sha256")
VALUES = {k: (lambda r, k=k: r["eval"][k]) for k in METRICS}
RUN_KEYS = [f.name for f in fields(RunRecord)]


def read_eval(path: Path) -> Record:
    """A run's ``eval.json`` as an ``aggregate`` record: the run's settings (``run.json``
    overriding what the evaluation read from the checkpoint), ``eval`` and the hypotheses."""
    with open(path, encoding="utf-8") as f:
        result = json.load(f)
    missing = [k for k in REQUIRED if k not in result]
    if missing or not isinstance(result.get("run"), dict):
        raise ValueError(f"{path} lacks {missing or ['run']}: it was not written by "
                         "`evaluate`; run `python -m fairseq_tying.evaluation evaluate` again")
    run = dict(result["run"])
    run.update({k: v for k, v in read_run_json(path.parent).items() if k in run})
    run = RunRecord.from_dict(run).as_dict()
    return {**run, "eval": result, "run_dir": path.parent,
            "hypotheses": read_lines(path.parent / result["hypotheses"])}


def load_records(root: str | os.PathLike) -> list[Record]:
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"RUNS_ROOT {root} is not a directory")
    paths = sorted(root.rglob(EVAL_JSON))
    if not paths:
        raise FileNotFoundError(f"no {EVAL_JSON} under {root}; run `evaluate` on the runs first")
    records = [read_eval(p) for p in tqdm(paths, desc=f"reading {EVAL_JSON}", unit="run")]
    names = [r["name"] for r in records]
    if len(set(names)) != len(names):  # same folder name in two places: use relative paths
        for r in records:
            r["name"] = str(r["run_dir"].relative_to(root))
    return records


def group_title(result: dict[str, Any]) -> str:
    return f"{result.get('corpus') or 'data'} {result['src']}→{result['tgt']} ({result['subset']})"


def choose_baseline(methods: dict[str, list[Record]], baseline: str | None) -> str:
    if baseline is not None:
        if baseline not in methods:
            raise ValueError(f"--baseline {baseline!r} is not a method here; methods: "
                             f"{sorted(methods)}")
        return baseline
    dot = sorted(m for m, runs in methods.items() if runs[0]["output_layer"] == "dot")
    return dot[0] if dot else sorted(methods)[0]


def baseline_pairs(runs: list[Record], base: list[Record]) -> list[tuple[str, Record, Record]]:
    """Each run with the baseline run of the same seed (else the first baseline run)."""
    by_seed = {r["seed"]: r for r in base}
    return [(r["name"], r, by_seed.get(r["seed"], base[0])) for r in runs]


def by_method(records: list[Record]) -> dict[str, list[Record]]:
    methods: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        methods[r["method"]].append(r)
    for runs in methods.values():
        runs.sort(key=lambda r: (r["seed"] is None, r["seed"] or 0, r["name"]))
    return methods


def summarize_method(method: str, runs: list[Record], tests: dict[str, Any] | None
                     ) -> dict[str, Any]:
    """One method's row: mean ± CI of each metric and, but for the baseline, the paired
    comparison against it (``tests``: ``aggregate.compare`` of BLEU and chrF)."""
    stats = stats_of(runs, VALUES)
    ps = list(tests["bleu"]["per_seed_p"].values()) if tests else []
    return {
        "method": method, "baseline": tests is None,
        **{k: runs[0][k] for k in ("arch", "tying", "output_layer")},
        "seeds": [r["seed"] for r in runs],
        **{f"{k}_mean": stats[k]["mean"] for k in METRICS},
        **{f"{k}_ci95": stats[k]["ci95"] for k in METRICS},
        "bleu_values": stats["bleu"]["values"],
        "delta_bleu": tests["bleu"]["delta_bleu"] if tests else 0.0,
        "vs_baseline": tests["bleu"] if tests else None,
        "bleu_p_values": ps,
        "significant_runs": sum(p < 0.05 for p in ps),
    }


def run_rows(runs: list[Record], pairs: list[tuple[str, Record, Record]] | None,
             tests: dict[str, Any] | None) -> list[dict[str, Any]]:
    base_of = {name: base["name"] for name, _, base in pairs or []}
    return [{**{k: r[k] for k in RUN_KEYS}, **{k: r["eval"][k] for k in METRICS},
             "bleu_p": tests["bleu"]["per_seed_p"][r["name"]] if tests else None,
             "chrf_p": tests["chrf"]["per_seed_p"][r["name"]] if tests else None,
             "baseline_run": base_of.get(r["name"]), "run_dir": str(r["run_dir"])}
            for r in runs]


def summarize_group(records: list[Record], baseline: str | None, n_samples: int) -> dict:
    methods = by_method(records)
    base = choose_baseline(methods, baseline)
    refs = read_lines(records[0]["eval"]["references"])
    method_rows, runs_out = [], []
    for m in [base] + sorted(m for m in methods if m != base):
        pairs = tests = None
        if m != base:
            pairs = baseline_pairs(methods[m], methods[base])
            tests = {k: compare(pairs, refs, n_samples, k) for k in ("bleu", "chrf")}
        method_rows.append(summarize_method(m, methods[m], tests))
        runs_out += run_rows(methods[m], pairs, tests)
    first = records[0]["eval"]
    return {
        "title": group_title(first), "baseline": base, "n_bootstrap": n_samples,
        "signatures": {k: first.get(f"{k}_signature") for k in METRICS},
        "methods": method_rows, "runs": runs_out,
    }


def _fmt_p(p: float | None) -> str:
    return "" if p is None else f"{p:.4f}"


def method_table(group: dict) -> str:
    rows = []
    for m in group["methods"]:
        ci = {k: format_stat({"mean": m[f"{k}_mean"], "ci95": m[f"{k}_ci95"]}) for k in METRICS}
        sig = "baseline" if m["baseline"] else (
            f"{m['significant_runs']}/{len(m['bleu_p_values'])} "
            f"(p={', '.join(f'{p:.3f}' for p in m['bleu_p_values'])})")
        delta = "" if m["baseline"] else format_delta(m["vs_baseline"], per_seed=False)
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
        "its 95% CI over the pairs, p of the paired bootstrap resampling "
        f"({group['n_bootstrap']} samples) pooled over the pairs; per run, p of its own pair "
        "(sacrebleu's paired bootstrap test); significant: p < 0.05.\n\n"
        + method_table(group)
        + "\n"
        + markdown_table(["Run", "Method", "Seed", "BLEU", "tok. BLEU", "chrF", "p BLEU",
                          "p chrF", "vs"], rrows)
        + f"\nBLEU: `{sig['bleu']}`  \ntok. BLEU: `{sig['tok_bleu']}`  \nchrF: `{sig['chrf']}`\n"
    )


def collect(root: str | os.PathLike, out: str | os.PathLike, baseline: str | None = None,
            n_samples: int = 1000) -> dict:
    records = load_records(root)
    groups: dict[tuple, list[Record]] = defaultdict(list)
    for rec in records:
        r = rec["eval"]
        groups[(r.get("corpus"), r["src"], r["tgt"], r["subset"], r["references_sha256"])].append(
            rec)
    keys = sorted(groups, key=lambda k: tuple(str(x) for x in k))
    summaries = [summarize_group(groups[k], baseline, n_samples) for k in keys]
    titles = [g["title"] for g in summaries]
    for g, key in zip(summaries, keys, strict=True):
        if titles.count(g["title"]) > 1:  # same corpus name, different references
            g["title"] += f" [refs {key[-1][:8]}]"
    out = Path(out)
    markdown = "# Results\n\n" + "\n".join(group_markdown(g) for g in summaries)
    results = {"root": str(Path(root).resolve()), "groups": summaries}
    plot_methods({g["title"]: [points(m["method"], {"values": m["bleu_values"],
                                                    "mean": m["bleu_mean"],
                                                    "ci95": m["bleu_ci95"]}, m["baseline"])
                               for m in g["methods"]] for g in summaries}, out / "bleu.png")
    write_json(out / "results.json", results)
    write_text(out / "results.md", markdown)
    return {"markdown": markdown, "results": results}
