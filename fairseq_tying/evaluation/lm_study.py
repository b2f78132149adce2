"""The perplexity study's report: the ``study`` view of language-model records.

    python -m fairseq_tying.evaluation study --runs work/lm/runs --records docs/lm/records \\
        --report docs/language_models.md --plots docs/lm --block lm

``study`` hands records of fairseq's ``language_modeling`` task here (``study.build``): the same
export and the same statistics (``aggregate.stat``: mean ± 95 % CI over seeds) as the
translation study, with test perplexity in place of BLEU. A cell is (tying, output layer, tag);
Press & Wolf's finding (tying lowers perplexity) is decided from the 95 % CI of the per-seed
difference between the decoder-tied and the untied dot-product model; every other decoder-tied
cell (the normalized layers, tied+L) is also compared with the decoder-tied dot-product model,
the one it changes.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from fairseq_tying.common.atomic import replace_block, write_json
from fairseq_tying.core.scoring import OUTPUT_LAYERS as LAYERS
from fairseq_tying.evaluation.aggregate import format_stat, points, shared_seeds, stat, stats_of
from fairseq_tying.evaluation.plots import plot_bands, plot_methods
from fairseq_tying.evaluation.tables import markdown_table

Record = dict[str, Any]
CellKey = tuple[str, str, str]  # (tying, output layer, tag or "")
CELL_VALUES = {"test_ppl": lambda r: r["eval"]["perplexity"],
               "test_loss": lambda r: r["eval"]["loss"]}
BASELINE: CellKey = ("none", "dot", "")
TIED: CellKey = ("decoder", "dot", "")


def cell_key(record: Record) -> CellKey:
    return record["tying"], record["output_layer"], record.get("tag") or ""


def _order(key: CellKey) -> tuple:
    tying, layer, tag = key
    return (tag != "", tag, tying != "none", LAYERS.index(layer) if layer in LAYERS else 99)


def group(records: list[Record]) -> dict[CellKey, dict[int, Record]]:
    cells: dict[CellKey, dict[int, Record]] = defaultdict(dict)
    for r in records:
        if r["seed"] in cells[cell_key(r)]:
            raise ValueError(f"two records for {cell_key(r)} seed {r['seed']} ({r['name']})")
        cells[cell_key(r)][r["seed"]] = r
    return dict(sorted(cells.items(), key=lambda kv: _order(kv[0])))


def label(key: CellKey, records: list[Record]) -> str:
    tying, layer, tag = key
    text = f"{tying} × {layer}"
    if tag:
        dims = sorted({_flag(r["train_args"], "--tied-embed-dim") for r in records} - {None})
        text += f" + {tag}" + (f" (D = {', '.join(dims)})" if dims else "")
    return text


def _flag(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def difference(runs: dict[int, Record], base: dict[int, Record] | None) -> dict[str, Any] | None:
    """Per-seed test perplexity of ``runs`` minus ``base`` (paired by seed): ``stat`` of the
    differences and the verdict on "lower than the base"; None without shared seeds."""
    shared = shared_seeds(runs, base)
    if not shared or base is None:
        return None
    diff = stat([runs[s]["eval"]["perplexity"] - base[s]["eval"]["perplexity"] for s in shared])
    return {**diff, "seeds": shared, "verdict": verdict(diff)}


def verdict(diff: dict[str, Any]) -> str:
    """``supported`` (the whole 95 % CI of the difference is below 0), ``contradicted`` (above
    0) or ``unresolved`` (it contains 0, or one seed gives no CI)."""
    if diff["ci95"] is None:
        return "unresolved"
    if diff["mean"] + diff["ci95"] < 0:
        return "supported"
    if diff["mean"] - diff["ci95"] > 0:
        return "contradicted"
    return "unresolved"


def summarize(cells: dict[CellKey, dict[int, Record]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, runs in cells.items():
        records = [runs[s] for s in sorted(runs)]
        cell: dict[str, Any] = {"label": label(key, records), "tying": key[0],
                                "output_layer": key[1], "tag": key[2] or None,
                                "seeds": sorted(runs), **stats_of(records, CELL_VALUES),
                                "params": sorted({r["train"]["params"] for r in records})}
        if all("eval_best" in r for r in records):
            cell["test_ppl_best"] = stat([r["eval_best"]["perplexity"] for r in records])
        if all("stop" in r["train"] for r in records):
            cell["stop"] = {"epochs": [r["train"]["stop"]["epoch"] for r in records],
                            "reasons": [r["train"]["stop"]["reason"] for r in records]}
        if key != BASELINE and (diff := difference(runs, cells.get(BASELINE))):
            cell["vs_untied_dot"] = diff
        if key[0] == TIED[0] and key != TIED and (diff := difference(runs, cells.get(TIED))):
            cell["vs_tied_dot"] = diff
        out[cell["label"]] = cell
    return out


def _epochs(cell: dict[str, Any]) -> str:
    if "stop" not in cell:
        return "–"
    stop = cell["stop"]
    reasons = ", ".join(f"{stop['reasons'].count(r)} {r}" for r in sorted(set(stop["reasons"])))
    return f"{np.mean(stop['epochs']):.1f} ({'/'.join(map(str, stop['epochs']))}; {reasons})"


def _delta(cell: dict[str, Any], to: str, base: CellKey) -> str:
    if to not in cell:
        return "baseline" if (cell["tying"], cell["output_layer"], cell["tag"]) == \
            (*base[:2], None) else "–"
    diff = cell[to]
    return f"{format_stat(diff)} ({diff['verdict']})"


def main_table(summary: dict[str, Any]) -> str:
    untied = summary.get(label(BASELINE, []), {}).get("params", [None])[0]
    rows = []
    for name, c in summary.items():
        params = "/".join(f"{n:,}" for n in c["params"])
        rel = f" ({c['params'][0] / untied:.1%})" if untied and len(c["params"]) == 1 else ""
        rows.append([name, f"{format_stat(c['test_ppl'])} (n={len(c['seeds'])})",
                     format_stat(c["test_ppl_best"]) if "test_ppl_best" in c else "–",
                     _delta(c, "vs_untied_dot", BASELINE), _delta(c, "vs_tied_dot", TIED),
                     params + rel, _epochs(c)])
    return markdown_table(["tying × output layer", "test perplexity", "best checkpoint",
                           "Δ vs untied dot", "Δ vs tied dot", "parameters (of untied)",
                           "epochs (per seed; stop)"], rows)


def finding(summary: dict[str, Any]) -> str:
    """Press & Wolf's finding beside ours (decoder-tied vs untied, dot product)."""
    tied = summary.get(label(TIED, []))
    ours, answer = "no paired runs yet", "unresolved"
    if tied and "vs_untied_dot" in tied:
        diff = tied["vs_untied_dot"]
        base = summary[label(BASELINE, [])]["test_ppl"]
        ours = (f"{format_stat(base)} → {format_stat(tied['test_ppl'])}; Δ "
                f"{format_stat(diff)} over seed{'s' * (len(diff['seeds']) > 1)} "
                f"{', '.join(map(str, diff['seeds']))}")
        answer = diff["verdict"]
    rows = [["Press & Wolf (2017), LSTM LMs, Penn Treebank and others",
             "significantly lower with tying, on a variety of models", "yes (their finding)"],
            ["this study, Transformer LM, Bible English (word level)", ours, answer]]
    return markdown_table(["", "untied → tied test perplexity", "tying lowers perplexity"],
                          rows)


def tables(summary: dict[str, Any]) -> str:
    seeds = sorted({s for c in summary.values() for s in c["seeds"]})
    return "\n".join([
        f"Seeds: {', '.join(map(str, seeds))}. Test perplexity (fairseq-eval-lm) of the average "
        "of the last epoch checkpoints, and of the best single checkpoint (lowest validation "
        "loss); mean ± 95 % CI (Student t over seeds). Δ: per-seed difference to the untied "
        "dot-product model, and for the decoder-tied cells to the decoder-tied dot-product "
        "model, mean ± 95 % CI; supported / contradicted / unresolved (lower perplexity): the "
        "CI lies below 0 / above 0 / contains 0.\n",
        main_table(summary),
        "\n**Press & Wolf's finding side by side**\n",
        finding(summary)])


def _ppl_band(records: list[Record]) -> tuple[list, list, list, list]:
    """Per epoch: mean, min and max validation perplexity (2^loss) over the seeds."""
    points: dict[int, list[float]] = defaultdict(list)
    for r in records:
        for epoch, _update, loss in r["train"]["valid_epochs"]:
            points[epoch].append(2.0 ** loss)
    xs = sorted(points)
    return (xs, [float(np.mean(points[x])) for x in xs], [min(points[x]) for x in xs],
            [max(points[x]) for x in xs])


def plot(cells: dict[CellKey, dict[int, Record]], summary: dict[str, Any], out: Path
         ) -> list[Path]:
    """Test perplexity per cell (seeds, mean ± CI); validation perplexity against epochs, one
    panel per tying, one line per cell."""
    test = out / "test_ppl.png"
    plot_methods({"test set, average of the last epoch checkpoints": [
        points(name, c["test_ppl"], baseline=key == BASELINE)
        for key, (name, c) in zip(cells, summary.items(), strict=True)]}, test,
        metric="test perplexity (fairseq-eval-lm)")
    if not all("valid_epochs" in r["train"] for runs in cells.values() for r in runs.values()):
        return [test]
    panels: dict[str, dict[str, tuple]] = defaultdict(dict)
    for (key, runs), name in zip(cells.items(), summary, strict=True):
        panels[f"tying: {key[0]}"][name] = _ppl_band(list(runs.values()))
    path = out / "valid_ppl_epochs.png"
    plot_bands(dict(panels), path, "epoch", "validation perplexity",
               "Validation perplexity per epoch: mean over seeds, band from min to max")
    return [test, path]


def build(records: list[Record], report: str | os.PathLike, plots_dir: str | os.PathLike,
          block: str) -> dict[str, Any]:
    """The report's ``block``, ``summary.json`` and the plot, from language-model records."""
    cells = group(records)
    summary = summarize(cells)
    plots_dir = Path(plots_dir)
    plots_dir.mkdir(parents=True, exist_ok=True)
    pngs = plot(cells, summary, plots_dir)
    write_json(plots_dir / "summary.json", summary, indent=1)
    text = tables(summary)
    replace_block(report, block, text, new_file="# Language models\n")
    return {"markdown": text,
            "written": [str(report), str(plots_dir / "summary.json"), *map(str, pngs)]}
