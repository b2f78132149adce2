"""What the embeddings learned: word similarity and geometry of every embedding role.

    python -m fairseq_tying.analysis CKPT [CKPT …] --out DIR [--spm MODEL] [--data DIR] \
        [--report docs/results.md]

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
Writes ``analysis.json``, ``analysis.md``, ``norms_vs_frequency.png`` and ``similarity.png``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from fairseq_tying.analysis.figures import plot
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

__all__ = ["MatrixReport", "ModelReport", "main", "markdown", "matrices", "run"]

BLOCK = "analysis"  # the report's marked block: <!-- analysis:begin --> … <!-- analysis:end -->
BEGIN, END = markers(BLOCK)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def markdown(reports: Sequence[ModelReport], vectors: str) -> str:
    names = list(reports[0].matrices[0].similarity)
    head = ["model", "matrix (roles)", *(f"{n} ρ (pairs)" for n in names), "ρ(norm, freq)",
            "mean cos", "mean ‖w‖ (seen rows)", "mean ‖w‖ (unseen rows)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for r in reports:
        for m in r.matrices:
            sims = [f"{_fmt(m.similarity[n]['spearman'])} ({m.similarity[n]['pairs_scored']}/"
                    f"{m.similarity[n]['pairs_total']})" for n in names]
            lines.append("| " + " | ".join([r.label, " = ".join(m.roles), *sims,
                                            _fmt(m.norm_frequency_spearman),
                                            _fmt(m.mean_pairwise_cosine),
                                            f"{_fmt(m.mean_norm, 2)} ({m.rows_seen})",
                                            f"{_fmt(m.mean_norm_unseen, 2)} ({m.rows_unseen})",
                                            ]) + " |")
    lines.append("")
    lines.append(f"Word vectors: {vectors}; ρ from gensim's KeyedVectors.evaluate_word_pairs. "
                 "Geometry over the rows whose token occurs on the role's side of the training "
                 "data (seen); unseen rows apart.")
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
        "models": [asdict(r) for r in reports]}, indent=2)
    table = markdown(reports, vectors)
    write_text(out / "analysis.md", table)
    plot(reports, states, dicts, out)
    if report is not None:
        replace_block(report, block, table)
    return reports


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fairseq_tying.analysis",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+", help="fairseq_tying checkpoints")
    p.add_argument("--out", required=True, type=Path, help="folder for the JSON, table, PNGs")
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
    missing = [c for c in opts.checkpoints if not os.path.isfile(c)]
    if missing:
        p.error(f"no such checkpoint: {', '.join(missing)}")
    if not opts.block.replace("_", "").isalnum():
        p.error(f"--block {opts.block!r}: use letters, digits and _ (it names the report's "
                "<!-- NAME:begin --> marker)")
    try:
        reports = run(opts.checkpoints, opts.out, opts.spm, opts.data, opts.labels, opts.report,
                      opts.block)
    except UnreadableCheckpoint as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(Path(opts.out / "analysis.md").read_text(), end="")
    print(f"wrote {opts.out}/analysis.json, analysis.md, norms_vs_frequency.png, similarity.png "
          f"({len(reports)} checkpoint{'s' * (len(reports) != 1)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
