"""The perplexity study's table and plots (``specs.LM``): test perplexity per cell, its per-seed
difference to the untied and to the decoder-tied dot-product model with the interval rule's
verdict, and Press & Wolf's finding beside ours."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from fairseq_tying.common.tables import markdown_table
from fairseq_tying.studies.engine.engine import Key, Section, band
from fairseq_tying.studies.engine.specs import LM_BASELINE, LM_TIED, lm_label
from fairseq_tying.studies.statistics import verdicts
from fairseq_tying.studies.statistics.cells import Cell, Summary
from fairseq_tying.studies.views.formatting import (
    epochs_text,
    format_stat,
    holm_changes,
    seeds_label,
)
from fairseq_tying.studies.views.plots import plot_bands, plot_methods, points


def _epochs(cell: Cell) -> str:
    return "–" if cell.stop is None else epochs_text(cell)


def _delta(cell: Cell, to: str, base: Key) -> str:
    if (diff := cell.test(to)) is None:
        head = cell.head
        return "baseline" if (head.tying, head.output_layer, head.tag) == \
            (*base[:2], None) else "–"
    return f"{format_stat(diff.stat)} ({diff.verdict})"


def main_table(summary: Summary) -> str:
    untied = base.params[0] if (base := summary.get(lm_label(LM_BASELINE, []))) is not None \
        else None
    rows = []
    for name, c in summary.items():
        params = "/".join(f"{n:,}" for n in c.params)
        rel = f" ({c.params[0] / untied:.1%})" if untied and len(c.params) == 1 else ""
        best = c.stat("test_ppl_best")
        rows.append([name, f"{format_stat(c.stat('test_ppl'))} (n={len(c.seeds)})",
                     "–" if best is None else format_stat(best),
                     _delta(c, "vs_untied_dot", LM_BASELINE), _delta(c, "vs_tied_dot", LM_TIED),
                     params + rel, _epochs(c)])
    return markdown_table(["tying × output layer", "test perplexity", "best checkpoint",
                           "Δ vs untied dot", "Δ vs tied dot", "parameters (of untied)",
                           "epochs (per seed; stop)"], rows)


def finding(summary: Summary) -> str:
    """Press & Wolf's finding beside ours (decoder-tied vs untied, dot product)."""
    tied = summary.get(lm_label(LM_TIED, []))
    ours, answer = "no paired runs", "unresolved"
    if tied and (diff := tied.test("vs_untied_dot")) is not None:
        base = summary[lm_label(LM_BASELINE, [])].stat("test_ppl")
        ours = (f"{format_stat(base)} → {format_stat(tied.stat('test_ppl'))}; Δ "
                f"{format_stat(diff.stat)} over {seeds_label(diff.seeds)}")
        answer = diff.verdict
    rows = [["Press & Wolf (2017), LSTM LMs, Penn Treebank and others",
             "significantly lower with tying, on a variety of models", "yes (their finding)"],
            ["this study, Transformer LM, Bible English (word level)", ours, answer]]
    return markdown_table(["", "untied → tied test perplexity", "tying lowers perplexity"],
                          rows)


def changes(summary: Summary) -> list[tuple[str, str, str]]:
    """The comparisons whose verdict Holm–Bonferroni changed (raw p: the 95 % CI rule)."""
    out = []
    for name, cell in summary.items():
        for key, against in (("vs_untied_dot", "untied dot"), ("vs_tied_dot", "tied dot")):
            if (diff := cell.test(key)) is None:
                continue
            before = verdicts.outcome(verdicts.interval(verdicts.without_holm(diff)))
            if before != verdicts.outcome(diff.verdict):
                out.append((f"{name} vs {against}", before, diff.verdict))
    return out


def render(sections: list[Section]) -> tuple[str, Any]:
    """The block's text and ``summary.json`` of the perplexity study."""
    (section,) = sections
    summary = section.summary
    seeds = sorted({s for c in summary.values() for s in c.seeds})
    text = "\n".join([
        f"Seeds: {', '.join(map(str, seeds))}. Test perplexity (fairseq-eval-lm) of the average "
        "of the last epoch checkpoints, and of the best single checkpoint (lowest validation "
        "loss); mean ± 95 % CI (Student t over seeds). Δ: per-seed difference to the untied "
        "dot-product model, and for the decoder-tied cells to the decoder-tied dot-product "
        f"model, mean ± 95 % CI; {verdicts.INTERVAL_RULE}.\n",
        main_table(summary),
        *([f"\n{holm_changes(found)}"] if (found := changes(summary)) else []),
        "\n**Press & Wolf's finding side by side**\n",
        finding(summary)])
    return text, summary


def plots(sections: list[Section], out: Path) -> list[Path]:
    """Test perplexity per cell (seeds, mean ± CI); validation perplexity against epochs, one
    panel per tying, one line per cell."""
    (section,) = sections
    cells, summary = section.cells, section.summary
    out.mkdir(parents=True, exist_ok=True)
    test = out / "test_ppl.png"
    plot_methods({"test set, average of the last epoch checkpoints": [
        points(name, c.stat("test_ppl"), baseline=key == LM_BASELINE)
        for key, (name, c) in zip(cells, summary.items(), strict=True)]}, test,
        metric="test perplexity (fairseq-eval-lm)")
    if not all(r.train.valid_epochs is not None for runs in cells.values()
               for r in runs.values()):
        return [test]
    panels: dict[str, dict[str, tuple]] = defaultdict(dict)
    for (key, runs), name in zip(cells.items(), summary, strict=True):
        panels[f"tying: {key[0]}"][name] = band(list(runs.values()), lambda loss: 2.0 ** loss)
    path = out / "valid_ppl_epochs.png"
    plot_bands(dict(panels), path, "epoch", "validation perplexity",
               "Validation perplexity per epoch: mean over seeds, band from min to max")
    return [test, path]
