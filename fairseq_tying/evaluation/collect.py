"""``collect RUNS_ROOT --out DIR``: tables, significance tests and plots across runs."""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from fairseq_tying.common.atomic import read_lines, write_json, write_text
from fairseq_tying.evaluation.plots import MethodPoints, plot_bleu
from fairseq_tying.evaluation.records import RunRecord, read_run_json
from fairseq_tying.evaluation.significance import paired_bootstrap
from fairseq_tying.evaluation.stats import format_ci, mean_ci
from fairseq_tying.evaluation.tables import markdown_table

METRICS = ("bleu", "tok_bleu", "chrf")
REQUIRED = ("run", *METRICS, "src", "tgt", "subset", "hypotheses", "references",
            "references_sha256")


@dataclass
class Entry:
    record: RunRecord
    result: dict[str, Any]
    run_dir: Path

    @property
    def label(self) -> str:
        return self.record.name

    def hypotheses(self) -> list[str]:
        return read_lines(self.run_dir / self.result["hypotheses"])


def load_entries(root: str | os.PathLike) -> list[Entry]:
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"RUNS_ROOT {root} is not a directory")
    paths = sorted(root.rglob("eval.json"))
    if not paths:
        raise FileNotFoundError(f"no eval.json under {root}; run `evaluate` on the runs first")
    entries = []
    for path in tqdm(paths, desc="reading eval.json", unit="run"):
        with open(path, encoding="utf-8") as f:
            result = json.load(f)
        missing = [k for k in REQUIRED if k not in result]
        if missing or not isinstance(result.get("run"), dict):
            raise ValueError(f"{path} lacks {missing or ['run']}: it was not written by "
                             "`evaluate`; run `python -m fairseq_tying.evaluation evaluate` again")
        data = dict(result.get("run", {}))
        data.update({k: v for k, v in read_run_json(path.parent).items() if k in data})
        entries.append(Entry(RunRecord.from_dict(data), result, path.parent))
    names = [e.label for e in entries]
    if len(set(names)) != len(names):  # same folder name in two places: use relative paths
        for e in entries:
            e.record.name = str(e.run_dir.relative_to(root))
    return entries


def group_title(result: dict[str, Any]) -> str:
    return f"{result.get('corpus') or 'data'} {result['src']}→{result['tgt']} ({result['subset']})"


def choose_baseline(methods: dict[str, list[Entry]], baseline: str | None) -> str:
    if baseline is not None:
        if baseline not in methods:
            raise ValueError(f"--baseline {baseline!r} is not a method here; methods: "
                             f"{sorted(methods)}")
        return baseline
    dot = sorted(m for m, es in methods.items() if es[0].record.output_layer == "dot")
    return dot[0] if dot else sorted(methods)[0]


def paired_tests(
    baseline_runs: list[Entry], others: list[Entry], refs: list[str], n_samples: int
) -> dict[str, dict[str, Any]]:
    """Each run against the baseline run of the same seed (else the first baseline run)."""
    by_seed = {e.record.seed: e for e in baseline_runs}
    pairs: dict[str, list[Entry]] = defaultdict(list)
    for e in others:
        pairs[by_seed.get(e.record.seed, baseline_runs[0]).label].append(e)
    baseline_of = {e.label: e for e in baseline_runs}
    out: dict[str, dict[str, Any]] = {}
    for bl_label, systems in tqdm(pairs.items(), desc="paired bootstrap", unit="baseline"):
        bl = baseline_of[bl_label]
        out.update(paired_bootstrap((bl.label, bl.hypotheses()),
                                    [(s.label, s.hypotheses()) for s in systems], refs, n_samples))
    return out


def _fmt_p(p: float | None) -> str:
    return "" if p is None else f"{p:.4f}"


def summarize_group(entries: list[Entry], baseline: str | None, n_samples: int) -> dict:
    methods: dict[str, list[Entry]] = defaultdict(list)
    for e in entries:
        methods[e.record.method].append(e)
    for runs in methods.values():
        runs.sort(key=lambda e: (e.record.seed is None, e.record.seed or 0, e.label))
    base = choose_baseline(methods, baseline)
    refs = read_lines(entries[0].result["references"])
    others = [e for m, runs in methods.items() if m != base for e in runs]
    tests = paired_tests(methods[base], others, refs, n_samples) if others else {}

    base_mean = mean_ci([e.result["bleu"] for e in methods[base]])[0]
    method_rows, runs_out = [], []
    order = [base] + sorted(m for m in methods if m != base)
    for m in order:
        runs = methods[m]
        stats = {k: mean_ci([e.result[k] for e in runs]) for k in METRICS}
        ps = [tests[e.label]["bleu_p"] for e in runs if e.label in tests]
        rec = runs[0].record
        method_rows.append({
            "method": m, "baseline": m == base, "arch": rec.arch, "tying": rec.tying,
            "output_layer": rec.output_layer, "seeds": [e.record.seed for e in runs],
            **{f"{k}_mean": stats[k][0] for k in METRICS},
            **{f"{k}_ci95": None if math.isnan(stats[k][1]) else stats[k][1] for k in METRICS},
            "delta_bleu": stats["bleu"][0] - base_mean,
            "bleu_p_values": ps,
            "significant_runs": sum(p < 0.05 for p in ps),
        })
        for e in runs:
            t = tests.get(e.label, {})
            runs_out.append({**e.record.as_dict(), **{k: e.result[k] for k in METRICS},
                             "bleu_p": t.get("bleu_p"), "chrf_p": t.get("chrf_p"),
                             "baseline_run": t.get("baseline"), "run_dir": str(e.run_dir)})
    first = entries[0].result
    return {
        "title": group_title(first), "baseline": base, "n_bootstrap": n_samples,
        "signatures": {k: first.get(f"{k}_signature") for k in METRICS},
        "paired_bs_signatures": next(iter(tests.values()))["signatures"] if tests else {},
        "methods": method_rows, "runs": runs_out,
    }


def group_markdown(group: dict) -> str:
    mrows = []
    for m in group["methods"]:
        ci = {k: format_ci(m[f"{k}_mean"], m[f"{k}_ci95"] or math.nan) for k in METRICS}
        sig = "baseline" if m["baseline"] else (
            f"{m['significant_runs']}/{len(m['bleu_p_values'])} "
            f"(p={', '.join(f'{p:.3f}' for p in m['bleu_p_values'])})")
        mrows.append([m["method"], m["tying"], m["output_layer"], len(m["seeds"]), ci["bleu"],
                      ci["tok_bleu"], ci["chrf"],
                      "" if m["baseline"] else f"{m['delta_bleu']:+.2f}", sig])
    rrows = [[r["name"], r["method"], r["seed"], f"{r['bleu']:.2f}", f"{r['tok_bleu']:.2f}",
              f"{r['chrf']:.2f}", _fmt_p(r["bleu_p"]), _fmt_p(r["chrf_p"]), r["baseline_run"] or ""]
             for r in group["runs"]]
    sig = group["signatures"]
    return (
        f"## {group['title']}\n\n"
        f"Mean ± 95% CI over seeds (t distribution). Baseline: `{group['baseline']}`; "
        f"p from sacrebleu's paired bootstrap resampling ({group['n_bootstrap']} samples) of each "
        "run against the baseline run with the same seed; significant: p < 0.05.\n\n"
        + markdown_table(["Method", "Tying", "Output", "Seeds", "BLEU", "tok. BLEU", "chrF",
                          "Δ BLEU", "significant (BLEU)"], mrows)
        + "\n"
        + markdown_table(["Run", "Method", "Seed", "BLEU", "tok. BLEU", "chrF", "p BLEU",
                          "p chrF", "vs"], rrows)
        + f"\nBLEU: `{sig['bleu']}`  \ntok. BLEU: `{sig['tok_bleu']}`  \nchrF: `{sig['chrf']}`\n"
    )


def collect(root: str | os.PathLike, out: str | os.PathLike, baseline: str | None = None,
            n_samples: int = 1000) -> dict:
    entries = load_entries(root)
    groups: dict[tuple, list[Entry]] = defaultdict(list)
    for e in entries:
        r = e.result
        groups[(r.get("corpus"), r["src"], r["tgt"], r["subset"], r["references_sha256"])].append(e)
    keys = sorted(groups, key=lambda k: tuple(str(x) for x in k))
    summaries = [summarize_group(groups[k], baseline, n_samples) for k in keys]
    titles = [g["title"] for g in summaries]
    for g, key in zip(summaries, keys, strict=True):
        if titles.count(g["title"]) > 1:  # same corpus name, different references
            g["title"] += f" [refs {key[-1][:8]}]"
    out = Path(out)
    markdown = "# Results\n\n" + "\n".join(group_markdown(g) for g in summaries)
    results = {"root": str(Path(root).resolve()), "groups": summaries}
    plot_bleu({g["title"]: [MethodPoints(
        m["method"], [r["bleu"] for r in g["runs"] if r["method"] == m["method"]],
        m["bleu_mean"], m["bleu_ci95"] if m["bleu_ci95"] is not None else math.nan,
        m["baseline"]) for m in g["methods"]] for g in summaries}, out / "bleu.png")
    write_json(out / "results.json", results)
    write_text(out / "results.md", markdown)
    return {"markdown": markdown, "results": results}
