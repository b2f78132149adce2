"""What the embeddings learned: word similarity and geometry of every embedding role.

    python -m fairseq_tying.analysis CKPT [CKPT …] --out DIR [--spm MODEL] [--data DIR] \
        [--report docs/results.md]
    python -m fairseq_tying.analysis --table-from DIR [--report docs/results.md]

For each checkpoint and each embedding matrix it holds (encoder input, decoder input, decoder
output; one matrix when tied) it reports

- word similarity (Press & Wolf 2017, Tables 2–3): Spearman ρ between the cosine similarity of
  two words' vectors and the human ratings of SimLex-999 and WordSim-353, as computed by
  gensim's ``KeyedVectors.evaluate_word_pairs`` on the copies gensim ships. A word's vector is
  the mean of the rows of its subword pieces (the ``--spm`` sentencepiece model); a word with a
  piece missing from the dictionary is out of vocabulary, and coverage says how many pairs
  were scored. A subword model splits almost any word, so the "whole-word" variant scores
  only the pairs whose two words are each a single piece. A word-level vocabulary (``--spm
  none``, or data prepared with ``--subword word``) gives each word its own row;
- geometry: Spearman ρ between a row's norm and its token's frequency on that role's side of
  the binarized training data (source side for the encoder, target side for the decoder, both
  for a three-way tied matrix; a language model's one text), and
  the mean pairwise cosine of the rows (anisotropy), both over the rows seen on that side; the
  rows never seen there (the other language's pieces of a joined dictionary) are counted apart.

The rows are the stored parameters (under ``l2norm``, ``cosine`` and ``sqnorm`` the model
only uses their directions for scoring; cosine similarities of one-piece words are the same).
Each ρ comes with its 95 % interval, and the ρ of two matrices of one model on the same pairs
with a test of their difference (:mod:`.intervals`).

Writes ``analysis.json``, ``analysis.md``, ``pair_scores.json`` (each pair's human rating and
cosine per matrix, for the paired test), ``norms_vs_frequency.png`` and ``similarity.png``;
``--table-from DIR`` rebuilds ``DIR/analysis.md`` (and the report's block) from those files
alone, without the checkpoints.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from itertools import combinations
from pathlib import Path

import numpy as np

from fairseq_tying.analysis.figures import plot
from fairseq_tying.analysis.intervals import (
    DRAWS,
    SEED,
    Difference,
    bound_difference,
    fisher_interval,
    paired_bootstrap,
)
from fairseq_tying.analysis.measures import (
    BENCHMARKS,
    WORDS,
    MatrixReport,
    ModelReport,
    analyse,
    benchmark_pairs,
    default_label,
    matrices,
    require_libraries,
    sides,
    subword_model,
)
from fairseq_tying.common import checkpoints
from fairseq_tying.common.atomic import write_json, write_text
from fairseq_tying.common.blocks import markers, replace_block
from fairseq_tying.core.checkpoint_compat import UnreadableCheckpoint

__all__ = ["MatrixReport", "ModelReport", "load", "main", "markdown", "matrices", "rebuild",
           "run"]

BLOCK = "analysis"  # the report's marked block: <!-- analysis:begin --> … <!-- analysis:end -->
BEGIN, END = markers(BLOCK)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _rho(sim: dict) -> str:
    """``0.253 [0.08, 0.41] (117/999)``: ρ, its 95 % interval, the pairs scored."""
    ci = fisher_interval(sim["spearman"], sim["pairs_scored"])
    interval = "" if ci is None else f" [{ci[0]:.2f}, {ci[1]:.2f}]"
    return f"{_fmt(sim['spearman'])}{interval} ({sim['pairs_scored']}/{sim['pairs_total']})"


def markdown(reports: Sequence[ModelReport], vectors: str,
             ratings: dict[str, list[float]] | None = None) -> str:
    """The table; ``ratings`` (each benchmark's human ratings, with each pair's cosine in the
    reports) make the differences between matrices paired tests."""
    names = list(reports[0].matrices[0].similarity)
    head = ["model", "matrix (roles)", *(f"{n} ρ [95 % CI] (pairs)" for n in names),
            "ρ(norm, freq)", "mean cos", "mean ‖w‖ (seen rows)", "mean ‖w‖ (unseen rows)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for r in reports:
        for m in r.matrices:
            sims = [_rho(m.similarity[n]) for n in names]
            lines.append("| " + " | ".join([r.label, " = ".join(m.roles), *sims,
                                            _fmt(m.norm_frequency_spearman),
                                            _fmt(m.mean_pairwise_cosine),
                                            f"{_fmt(m.mean_norm, 2)} ({m.rows_seen})",
                                            f"{_fmt(m.mean_norm_unseen, 2)} ({m.rows_unseen})",
                                            ]) + " |")
    lines.append("")
    lines.append(f"Word vectors: {vectors}; ρ from gensim's KeyedVectors.evaluate_word_pairs, "
                 "its 95 % interval by Fisher's z with Bonett & Wright's (2000) standard error "
                 "for Spearman's ρ, √((1 + ρ²/2)/(n − 3)) over the n pairs scored. Geometry over "
                 "the rows whose token occurs on the role's side of the training data (seen); "
                 "unseen rows apart.")
    lines += difference_table(reports, names, ratings)
    if by_side := [(r.label, m.norm_by_side) for r in reports for m in r.matrices
                   if m.norm_by_side]:
        lines.append("")
        lines.append("Rows of a three-way tied matrix by where their piece occurs in the training "
                     "data, mean ‖w‖ (rows): " + "; ".join(
                         f"{label}: " + ", ".join(f"{name} {_fmt(g['mean_norm'], 2)} ({g['rows']})"
                                                  for name, g in groups.items())
                         for label, groups in by_side) + ".")
    if learned := [r for r in reports if r.parameters]:
        lines.append("")
        lines.append("The output layer's learned parameters, trained (from their initial "
                     "value): " + "; ".join(
                         f"{r.label} " + ", ".join(learned_summary(name, p)
                                                   for name, p in r.parameters.items())
                         for r in learned) + ".")
    return "\n".join(lines) + "\n"


METHODS = {
    "bootstrap": f"a paired bootstrap over the word pairs both matrices scored ({DRAWS:,} "
                 f"resamples, seed {SEED}): the percentile 95 % interval of the resampled "
                 "differences and p = 2·min(share ≤ 0, share ≥ 0)",
    "bound": "the pairs' cosines were not kept with this analysis, so no paired test: a bound "
             "that holds whatever the two matrices' cosines correlate, [low_a − high_b, "
             "high_a − low_b] from the two ρ's 97.5 % intervals (Bonferroni: both hold "
             "together with at least 95 %), and p = min(1, 4·(1 − Φ(|z_a − z_b|/(se_a + "
             "se_b)))), where it reaches 0; wider than a paired test's",
}


def difference_table(reports: Sequence[ModelReport], names: list[str],
                     ratings: dict[str, list[float]] | None) -> list[str]:
    """The lines of the table of ρ differences between each two matrices of one model (a
    later role's minus an earlier one's), on the same benchmark pairs; none for models of one
    matrix."""
    rows, methods = [], set()
    for r in reports:
        for earlier, later in combinations(r.matrices, 2):
            found = [difference(later.similarity[n], earlier.similarity[n],
                                (ratings or {}).get(_benchmark(n))) for n in names]
            methods |= {d.method for d in found if d is not None}
            rows.append("| " + " | ".join([r.label, f"{' = '.join(later.roles)} − "
                                           f"{' = '.join(earlier.roles)}",
                                           *map(_difference_cell, found)]) + " |")
    if not rows:
        return []
    head = ["model", "ρ difference (same pairs)", *names]
    how = "; ".join(METHODS[m] for m in sorted(methods)) or "no two ρ to compare"
    return ["", "| " + " | ".join(head) + " |", "|---|---|" + "---:|" * len(names), *rows, "",
            "Difference of two matrices' ρ on one benchmark: the estimate, its 95 % interval "
            f"and two-sided p; {how}."]


def _benchmark(name: str) -> str:
    """The benchmark of a similarity column ("SimLex-999 whole-word": SimLex-999)."""
    return next(b for b in BENCHMARKS if name.startswith(b))


def difference(a: dict, b: dict, ratings: list[float] | None) -> Difference | None:
    """ρ_a − ρ_b: paired over the pairs both scored when their cosines and the ratings are
    known, else the bound from the two ρ."""
    ca, cb = a.get("cosines"), b.get("cosines")
    if ratings is not None and ca is not None and cb is not None:
        both = [k for k in range(len(ratings)) if ca[k] is not None and cb[k] is not None]
        if len(both) >= 4:
            return paired_bootstrap(*(np.take(v, both) for v in (ratings, ca, cb)))
    return bound_difference(a["spearman"], a["pairs_scored"], b["spearman"], b["pairs_scored"])


def _difference_cell(d: Difference | None) -> str:
    if d is None:
        return "–"
    p = "< 0.001" if d.p < 0.001 else f"{d.p:.3f}" if d.p < 0.01 else f"{d.p:.2f}"
    estimate = f"{d.estimate:+.3f}" if round(d.estimate, 3) else "0.000"  # not "-0.000"
    return f"{estimate} [{d.low:+.2f}, {d.high:+.2f}], p {p}"


def learned_summary(name: str, p: dict[str, float]) -> str:
    """``gain 4.52 (from 4.00)``, or for a vector ``sz mean 0.09, 0.05 to 0.12 (from 0.09)``."""
    if "value" in p:
        return f"{name} {p['value']:.2f} (from {p['initial_value']:.2f})"
    return (f"{name} mean {p['mean']:.3g}, {p['min']:.3g} to {p['max']:.3g} "
            f"(from {p['initial_mean']:.3g})")


def run(paths: Sequence[str], out: Path, spm_path: str | None = None, data: str | None = None,
        labels: Sequence[str] | None = None, report: Path | None = None,
        block: str = BLOCK) -> list[ModelReport]:
    if labels and len(labels) != len(paths):
        raise SystemExit(f"--labels has {len(labels)} entries for {len(paths)} checkpoints")
    states = {str(p): checkpoints.load(p) for p in paths}
    dicts = {p: sides(s, data) for p, s in states.items()}
    subword, sp = subword_model(spm_path, next(iter(states.values())), data)
    reports = [analyse(p, labels[i] if labels else default_label(p, s), dicts[p], sp, s)
               for i, (p, s) in enumerate(states.items())]
    benchmarks = {n: {"file": f"gensim.test.utils.datapath('{f}')",
                      "pairs": len(benchmark_pairs(n)[1])} for n, f in BENCHMARKS.items()}
    if sp is None:
        vectors = "the lower-cased word's own row (a word-level vocabulary)"
    else:  # the model's name and size, not the machine's path to it: the table is committed
        vectors = (f"mean of the rows of the word's pieces under the sentencepiece model "
                   f"{Path(subword).name} ({sp.get_piece_size()} pieces) (whole-word: only "
                   "pairs of words that are one piece each)")
    write_json(out / "analysis.json", {
        "subword_model": None if subword is None else str(subword), "benchmarks": benchmarks,
        "word_vector": vectors,
        "token_counts": {p: {k: v.counted_in for k, v in d.items()} for p, d in dicts.items()},
        "models": [_without_cosines(asdict(r)) for r in reports]}, indent=2)
    ratings = {n: [rating for *_, rating in benchmark_pairs(n)[1]] for n in BENCHMARKS}
    write_text(out / PAIR_SCORES, _pair_scores(reports, ratings))
    table = markdown(reports, vectors, ratings)
    write_text(out / "analysis.md", table)
    plot(reports, states, dicts, out)
    if report is not None:
        replace_block(report, block, table)
    return reports


PAIR_SCORES = "pair_scores.json"


def _pair_scores(reports: Sequence[ModelReport], ratings: dict[str, list[float]]) -> str:
    """Each benchmark's ratings and, a model a line, each matrix's cosine of every pair (None:
    not scored): thousands of numbers that analysis.json stays readable without."""
    lines = [json.dumps([{n: sim.get("cosines") for n, sim in m.similarity.items()}
                         for m in r.matrices]) for r in reports]
    return (f'{{"ratings": {json.dumps(ratings)},\n"cosines": [\n' + ",\n".join(lines)
            + "]}\n")


def _without_cosines(model: dict) -> dict:
    for m in model["matrices"]:
        for sim in m["similarity"].values():
            sim.pop("cosines", None)
    return model


def load(folder: Path) -> tuple[list[ModelReport], str, dict[str, list[float]] | None]:
    """The reports, word-vector note and ratings an analysis folder holds, each pair's cosine
    put back in its report when ``pair_scores.json`` is there (analyses before it have none)."""
    data = json.loads((folder / "analysis.json").read_text())
    reports = [ModelReport(**{**m, "matrices": [MatrixReport(**x) for x in m["matrices"]]})
               for m in data["models"]]
    if not (folder / PAIR_SCORES).is_file():
        return reports, data["word_vector"], None
    scores = json.loads((folder / PAIR_SCORES).read_text())
    for r, by_matrix in zip(reports, scores["cosines"], strict=True):
        for m, cosines in zip(r.matrices, by_matrix, strict=True):
            for name, sim in m.similarity.items():
                sim["cosines"] = cosines[name]
    return reports, data["word_vector"], scores["ratings"]


def rebuild(folder: Path, report: Path | None = None, block: str = BLOCK) -> str:
    """``folder/analysis.md`` (and the report's block) again from the folder's files alone."""
    table = markdown(*load(folder))
    write_text(folder / "analysis.md", table)
    if report is not None:
        replace_block(report, block, table)
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fairseq_tying.analysis",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="*", help="fairseq_tying checkpoints")
    p.add_argument("--out", type=Path, help="folder for the JSON, table, PNGs (required with "
                                            "checkpoints)")
    p.add_argument("--table-from", type=Path, metavar="DIR",
                   help="instead of checkpoints: rebuild DIR/analysis.md (and the --report "
                        f"block) from DIR/analysis.json and DIR/{PAIR_SCORES}")
    p.add_argument("--spm", help="sentencepiece model of the training data (default: spm.model "
                                 f"beside the binarized data folder); {WORDS}: a word-level "
                                 "vocabulary, found from prep.json when the data says so")
    p.add_argument("--data", help="fairseq-preprocess folder with the dictionaries "
                                  "(default: the checkpoint's own data path)")
    p.add_argument("--labels", nargs="+", help="one name per checkpoint for the table and plots")
    p.add_argument("--report", type=Path, help=f"Markdown file whose {BEGIN} … {END} block "
                                                "gets the table (appended if missing)")
    p.add_argument("--block", default=BLOCK, help="the report's block name, for a report with "
                   f"several analyses (default: {BLOCK})")
    opts = p.parse_args(argv)
    require_libraries()  # the analysis extra: named before any work
    # the report is the output: fairseq's and gensim's INFO lines would bury it
    logging.basicConfig(level=logging.WARNING, force=True)
    if not opts.block.replace("_", "").isalnum():
        p.error(f"--block {opts.block!r}: use letters, digits and _ (it names the report's "
                "<!-- NAME:begin --> marker)")
    if opts.table_from is not None:
        if opts.checkpoints or opts.out:
            p.error("--table-from DIR rebuilds DIR's table: give no checkpoints and no --out")
        if not (opts.table_from / "analysis.json").is_file():
            p.error(f"--table-from {opts.table_from}: no analysis.json there")
        print(rebuild(opts.table_from, opts.report, opts.block), end="")
        print(f"wrote {opts.table_from / 'analysis.md'}")
        return 0
    if not opts.checkpoints or opts.out is None:
        p.error("give the checkpoints and --out (or --table-from DIR)")
    missing = [c for c in opts.checkpoints if not os.path.isfile(c)]
    if missing:
        p.error(f"no such checkpoint: {', '.join(missing)}")
    try:
        reports = run(opts.checkpoints, opts.out, opts.spm, opts.data, opts.labels, opts.report,
                      opts.block)
    except UnreadableCheckpoint as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(Path(opts.out / "analysis.md").read_text(), end="")
    print(f"wrote {opts.out}/analysis.json, analysis.md, {PAIR_SCORES}, norms_vs_frequency.png, "
          "similarity.png "
          f"({len(reports)} checkpoint{'s' * (len(reports) != 1)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
