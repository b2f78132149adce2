"""The perplexity study's tables and plots (``specs.LM``): test perplexity per cell, its per-seed
difference to the untied and to the decoder-tied dot-product model, each comparison's verdict
under the per-seed form of the verdict rule (``verdicts.lower``) with what its seeds can show,
the convergence check of every cell, and Press & Wolf's finding beside ours, under the study's
scope (no comparison's Δ per test document: the records keep no per-token scores)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from fairseq_tying.common.tables import markdown_table
from fairseq_tying.studies.engine.engine import Key, Section, band
from fairseq_tying.studies.engine.specs import LM_BASELINE, LM_TIED, lm_label
from fairseq_tying.studies.records.record import Record
from fairseq_tying.studies.statistics import verdicts
from fairseq_tying.studies.statistics.cells import Cell, Learning, SeedDifference, Stat, Summary
from fairseq_tying.studies.statistics.stats import POWER
from fairseq_tying.studies.views.formatting import (
    epochs_text,
    format_ps,
    format_stat,
    holm_changes,
    power_text,
    scope,
    seeds_label,
    still_learning,
)
from fairseq_tying.studies.views.plots import plot_bands, plot_methods, points

COMPARISONS = (("vs_untied_dot", "untied dot"), ("vs_tied_dot", "tied dot"))
BY_DOCUMENT = ("Δ by test document: none, since the records keep each run's test perplexity "
               "over the whole test set and no per-token log-probabilities to split by "
               "document.")


def _epochs(cell: Cell) -> str:
    return "–" if cell.stop is None else epochs_text(cell)


def _delta(cell: Cell, to: str, base: Key) -> str:
    if (diff := cell.test(to)) is None:
        head = cell.head
        return "baseline" if (head.tying, head.output_layer, head.tag) == \
            (*base[:2], None) else "–"
    return f"{format_stat(diff.stat)} ({verdicts.outcome(diff.verdict)})"


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


def comparisons(summary: Summary) -> list[tuple[str, SeedDifference]]:
    """Every comparison of the study, ``decoder × l2norm vs untied dot``, with its test."""
    return [(f"{name} vs {against}", diff) for name, cell in summary.items()
            for key, against in COMPARISONS if (diff := cell.test(key)) is not None]


def _learning(summary: Summary) -> Learning | None:
    return next((c.learning for c in summary.values() if c.learning is not None), None)


def legend(summary: Summary) -> str:
    """The verdicts' legend: the rule's version and its per-seed form, the convergence check,
    the family, why the t-test stands in for the bootstrap, and what the power column says."""
    found = comparisons(summary)
    m = next((d.family for _, d in found if d.family is not None), len(found))
    learning = _learning(summary)
    check = "" if learning is None else \
        f"; {verdicts.learning_rule(learning.window, learning.threshold)}"
    return (f"version {verdicts.VERSION} of the verdict rule (`studies/statistics/verdicts.py`, "
            "`lower`) as far as the records allow. Each comparison is the claim that the cell's "
            f"test perplexity is lower than its baseline's: {verdicts.SEED_RULE}{check}. "
            "Supported or contradicted: the difference counts and lies below or above 0; "
            "otherwise unresolved, with the test that failed in brackets. The study's tests are "
            f"its m = {m} comparisons. The translation studies test a difference with the paired "
            "bootstrap over test sentences pooled over the seeds; the records keep each run's "
            "test perplexity, not its per-token log-probabilities, so here the t-test of the "
            "per-seed differences stands in for it and the test set's own variance is not "
            "tested. Power: from the spread (sd) of a comparison's per-seed differences, the "
            f"smallest |Δ| the t-test over them detects with {100 * POWER:g} % power at "
            f"α = {verdicts.ALPHA} (before Holm)")


def claims_table(summary: Summary) -> str:
    """A row per comparison: its Δ with each seed's, the t-test's p (raw, Holm), the verdict
    and what its seeds can show."""
    rows = [[what, f"{format_stat(diff.stat)} ("
             + ", ".join(f"{v:+.2f}" for v in diff.stat.values) + ")",
             format_ps(diff), diff.verdict,
             power_text(diff.stat.values).replace("|", "\\|") or "–"]  # | splits a cell
            for what, diff in comparisons(summary)]
    return markdown_table(["comparison (lower test perplexity)",
                           "Δ test perplexity ± 95 % CI (each seed)", "p (raw, Holm)", "verdict",
                           "power"], rows)


def changes(summary: Summary) -> list[tuple[str, str, str]]:
    """The comparisons whose verdict Holm–Bonferroni changed (raw p: the rule without it)."""
    out = []
    for what, diff in comparisons(summary):
        before = verdicts.outcome(verdicts.lower(verdicts.without_holm(diff)))
        if before != verdicts.outcome(diff.verdict):
            out.append((what, before, diff.verdict))
    return out


def perplexity_gain(record: Record, window: int) -> float | None:
    """The fraction by which the run's validation perplexity (2^loss, the loss in bits) fell
    over its last ``window`` epochs below its best before them, 1 − 2^(min(last) − min(before))
    (the plateau rule's gain, ``Plateau.gain``, read as perplexity); None with ``window``
    epochs or fewer."""
    values = [v for _e, _u, v in record.train.valid_epochs or ()]
    if len(values) <= window:
        return None
    return 1.0 - 2.0 ** (min(values[-window:]) - min(values[:-window]))


def _percents(gains: list[float | None]) -> str:
    """``+0.33 % (+0.34, +0.42, +0.23)``: the mean of the seeds' gains and each seed's."""
    def pct(gain: float | None) -> str:
        return "?" if gain is None else f"{100 * gain:+.2f}"

    mean = None if None in gains else float(np.mean(gains))
    return f"{pct(mean)} % ({', '.join(pct(g) for g in gains)})"


def convergence(section: Section) -> str:
    """The convergence check, a row per cell: the updates at each seed's stop, the validation
    loss there, the plateau rule's gain over the last epochs (``cells.Learning``: the mean of
    the seeds decides) and the same gain in validation perplexity, and the validation loss
    after the last epoch every run reached (the cells at equal training); then the cells still
    learning, or none. "" where the cells have no validation history."""
    summary = section.summary
    learning = _learning(summary)
    if learning is None or any(c.valid_nll_common is None for c in summary.values()):
        return ""  # no validation history, or a run not trained under a stopping rule
    rows = []
    for (_key, runs), (name, cell) in zip(section.cells.items(), summary.items(), strict=True):
        records: list[Record] = list(runs.values())
        updates = " / ".join(f"{r.train.stop.update:,}" for r in records)
        last = [r.train.valid_epochs[-1][2] for r in records]
        rows.append([name, updates, format_stat(Stat.of(last), 3),
                     _percents(list(cell.learning.gains)),
                     _percents([perplexity_gain(r, learning.window) for r in records]),
                     "yes" if cell.learning.still else "no",
                     format_stat(cell.valid_nll_common.stat, 3)])
    epoch = next(iter(summary.values())).valid_nll_common.epoch
    table = markdown_table(["tying × output layer", "updates at the stop (per seed)",
                            "validation loss at the stop (bits)",
                            f"its gain over the last {learning.window} epochs (each seed)",
                            "the same in validation perplexity", "still learning",
                            f"validation loss after epoch {epoch}"], rows)
    found = still_learning(summary) or (
        f"No cell still learns at its budget: every cell's mean gain is below "
        f"{100 * learning.threshold:g} %.")
    loss = float(np.mean([r.train.valid_epochs[-1][2] for runs in section.cells.values()
                          for r in runs.values()]))
    scale = (f" At the runs' validation loss, {loss:.2f} bits a token on average at the stop, "
             f"a gain of {100 * learning.threshold:g} % of the loss is "
             f"{100 * (1 - 2.0 ** (-learning.threshold * loss)):.1f} % of the perplexity "
             "(1 − 2^(−gain · loss)).")
    return f"{table}\n{found}{scale}"


def _in_words(diff: SeedDifference) -> str:
    """Whether our comparison shows Press & Wolf's finding: "yes (supported)"; "not replicated
    here" where a difference that counts goes against it (our model and corpus are not theirs,
    so it contradicts nothing of theirs, ``verdicts.PAPER_RULE``); else the verdict, unresolved
    with its reason."""
    outcome = verdicts.outcome(diff.verdict)
    if outcome == "supported":
        return "yes (supported)"
    if outcome == "contradicted":
        return f"{verdicts.NOT_REPLICATED} (tying raised it)"
    return diff.verdict


def finding(summary: Summary) -> str:
    """Press & Wolf's finding beside ours (decoder-tied vs untied, dot product)."""
    tied = summary.get(lm_label(LM_TIED, []))
    ours, answer = "no paired runs", "unresolved (no paired runs)"
    if tied and (diff := tied.test("vs_untied_dot")) is not None:
        base = summary[lm_label(LM_BASELINE, [])].stat("test_ppl")
        ours = (f"{format_stat(base)} → {format_stat(tied.stat('test_ppl'))}; Δ "
                f"{format_stat(diff.stat)} over {seeds_label(diff.seeds)}")
        answer = _in_words(diff)
    rows = [["Press & Wolf (2017), LSTM LMs, Penn Treebank and others",
             "significantly lower with tying, on a variety of models", "yes (their finding)"],
            ["this study, Transformer LM, Bible English (word level)", ours, answer]]
    return markdown_table(["", "untied → tied test perplexity", "tying lowers perplexity"],
                          rows)


def render(sections: list[Section]) -> tuple[str, Any]:
    """The block's text and ``summary.json`` of the perplexity study."""
    (section,) = sections
    summary = section.summary
    check = convergence(section)
    text = "\n".join([
        scope(sections).rstrip() + "\n",
        "Test perplexity (fairseq-eval-lm) of the average "
        "of the last epoch checkpoints, and of the best single checkpoint (lowest validation "
        "loss); mean ± 95 % CI (Student t over seeds). Δ: per-seed difference to the untied "
        "dot-product model, and for the decoder-tied cells to the decoder-tied dot-product "
        "model, mean ± 95 % CI, with its verdict (below).\n",
        main_table(summary),
        f"\n**Verdicts**: {legend(summary)}.\n",
        claims_table(summary),
        f"\n{BY_DOCUMENT}",
        *([f"\n{holm_changes(found)}"] if (found := changes(summary)) else []),
        *(["\n**Convergence check**: each run's best validation loss (base 2, per token) "
           "over its last epochs against its best before them, the plateau rule's gain; the mean "
           "of a cell's seeds decides whether it still learns at its budget. Last column: the "
           "cells at equal training, after the last epoch every run reached.\n", check]
          if check else []),
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
