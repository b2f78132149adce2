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
import json
import logging
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from fairseq.data import Dictionary
from scipy.stats import spearmanr

from fairseq_tying.common import LM_TASK, checkpoints
from fairseq_tying.common.atomic import (
    atomic_write,
    markers,
    replace_block,
    write_json,
    write_text,
)
from fairseq_tying.core import names

ROLES = {  # state-dict key: (role, dictionary side)
    names.ENCODER_EMBED: ("encoder input", "source"),
    names.DECODER_EMBED: ("decoder input", "target"),
    names.SCORER_WEIGHT: ("decoder output", "target"),
}
BENCHMARKS = {"SimLex-999": "simlex999.txt", "WordSim-353": "wordsim353.tsv"}
# every word (mean of its pieces' rows), and only the pairs of words that are one piece each
VARIANTS = {"": False, " whole-word": True}
BLOCK = "analysis"  # the report's marked block: <!-- analysis:begin --> … <!-- analysis:end -->
BEGIN, END = markers(BLOCK)
WORDS = "none"  # --spm value of a word-level vocabulary: a word is its own row


@dataclass
class MatrixReport:
    key: str
    roles: list[str]
    rows: int
    dim: int
    similarity: dict[str, dict[str, Any]]
    norm_frequency_spearman: float
    mean_pairwise_cosine: float
    mean_norm: float
    rows_seen: int
    rows_unseen: int
    mean_norm_unseen: float | None
    norm_by_side: dict[str, dict[str, Any]] | None = None  # a matrix of both sides: norm_by_side()


@dataclass
class ModelReport:
    checkpoint: str
    label: str
    arch: str
    tying: str
    output_layer: str
    num_updates: int
    matrices: list[MatrixReport] = field(default_factory=list)


# --- inputs ---------------------------------------------------------------------------------

def benchmark_pairs(name: str) -> tuple[str, list[tuple[str, str]]]:
    """The path gensim ships for a benchmark and its word pairs."""
    from gensim.test.utils import datapath

    path = datapath(BENCHMARKS[name])
    pairs = []
    for line in Path(path).read_text(encoding="utf8").splitlines():
        fields = line.split("\t")
        if not line.startswith("#") and len(fields) == 3:
            pairs.append((fields[0], fields[1]))
    return path, pairs


@dataclass
class Side:
    """One side's dictionary and how often each entry occurs on that side of the training data
    (a joined dictionary's own counts add both sides)."""

    dictionary: Dictionary
    counts: np.ndarray
    counted_in: str
    label: str  # for plots: the side's language ("es+en" for both), or a language model's text


def token_counts(prefix: Path, dictionary: Dictionary) -> np.ndarray | None:
    from fairseq.data import data_utils

    dataset = data_utils.load_indexed_dataset(str(prefix), dictionary)
    if dataset is None:
        return None
    tokens = np.concatenate([dataset[i].numpy() for i in range(len(dataset))])
    return np.bincount(tokens, minlength=len(dictionary)).astype(np.float64)


def _side(dict_path: Path, prefix: Path, label: str) -> Side:
    dictionary = Dictionary.load(str(dict_path))
    counts = token_counts(prefix, dictionary)
    if counts is None:  # no binarized training split: the dictionary's own counts
        counts, prefix = np.array(dictionary.count, dtype=np.float64), dict_path
    return Side(dictionary, counts, str(prefix), label)


def sides(state: dict, data: str | None) -> dict[str, Side]:
    """Dictionaries and per-side token counts of the checkpoint's training data (a language
    model's one text is its decoder's, the target side)."""
    folder = Path(data or checkpoints.config_value(state, "data", "task") or "")
    if checkpoints.task_of(state) == LM_TASK:
        if not (folder / "dict.txt").is_file():
            raise SystemExit(f"dictionary {folder / 'dict.txt'} not found: pass --data, the "
                             "fairseq-preprocess output the language model was trained on")
        return {"target": _side(folder / "dict.txt", folder / "train", "LM text")}
    src = checkpoints.config_value(state, "source_lang", "task")
    tgt = checkpoints.config_value(state, "target_lang", "task")
    if src is None or tgt is None:  # fairseq-train infers them from the binarized files
        from fairseq.data.data_utils import infer_language_pair

        src, tgt = infer_language_pair(str(folder))
    paths = {"source": folder / f"dict.{src}.txt", "target": folder / f"dict.{tgt}.txt"}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise SystemExit(f"dictionaries {missing} not found: pass --data, the "
                         "fairseq-preprocess output the checkpoint was trained on")
    return {side: _side(path, folder / f"train.{src}-{tgt}.{lang}", lang)
            for (side, path), lang in zip(paths.items(), (src, tgt), strict=True)}


def subword_model(path: str | None, state: dict, data: str | None):
    """(path, processor) of the sentencepiece model: --spm, or ``spm.model`` beside the
    binarized data; (None, None) for a word-level vocabulary (``--spm none``, or ``prep.json``
    beside the data saying ``"subword": "word"``)."""
    import sentencepiece as spm

    folder = Path(data or checkpoints.config_value(state, "data", "task") or ".")
    prep = folder.parent / "prep.json"
    if path == WORDS or (path is None and prep.is_file()
                         and json.loads(prep.read_text()).get("subword") == "word"):
        return None, None
    candidate = Path(path) if path else folder.parent / "spm.model"
    if not candidate.is_file():
        raise SystemExit(f"no sentencepiece model at {candidate}: pass --spm MODEL (the subword "
                         f"model the training data was encoded with), or --spm {WORDS} for a "
                         "word-level vocabulary")
    return candidate, spm.SentencePieceProcessor(model_file=str(candidate))


# --- measures -------------------------------------------------------------------------------

def word_pieces(words: set[str], dictionary: Dictionary, sp) -> dict[str, list[int]]:
    """The dictionary ids of every word's pieces, for words whose pieces all are entries
    (``sp`` None: a word-level vocabulary, the word is its one piece)."""
    found = {}
    for word in sorted(words):
        ids = [dictionary.index(p) for p in (sp.encode(word, out_type=str) if sp else [word])]
        if ids and dictionary.unk() not in ids:
            found[word] = ids
    return found


def word_vectors(pieces: dict[str, list[int]], matrix: np.ndarray,
                 whole_words: bool = False) -> dict[str, np.ndarray]:
    """Mean of the pieces' rows per word; only one-piece words if ``whole_words``."""
    return {w: matrix[ids].mean(axis=0) for w, ids in pieces.items()
            if not whole_words or len(ids) == 1}


def similarity(vectors: dict[str, np.ndarray], dim: int, name: str) -> dict[str, Any]:
    """gensim's evaluate_word_pairs on the benchmark, with the number of pairs it scored."""
    from gensim.models import KeyedVectors

    path, pairs = benchmark_pairs(name)
    scored = sum(a.lower() in vectors and b.lower() in vectors for a, b in pairs)
    result: dict[str, Any] = {"spearman": None, "pvalue": None, "pairs_scored": scored,
                              "pairs_total": len(pairs)}
    if scored < 3:
        return result  # too few pairs for a rank correlation
    kv = KeyedVectors(vector_size=dim)
    kv.add_vectors(list(vectors), np.stack(list(vectors.values())))
    logging.getLogger("gensim").setLevel(logging.WARNING)
    _pearson, spearman, oov_percent = kv.evaluate_word_pairs(path, restrict_vocab=len(kv))
    result.update(spearman=_number(spearman[0]), pvalue=_number(spearman[1]),
                  pairs_scored=round(len(pairs) * (1 - oov_percent / 100)))
    return result


def seen_rows(matrix: np.ndarray, side: Side) -> np.ndarray:
    """The non-special rows whose token occurs on this side of the training data."""
    counts = side.counts[: len(matrix)]
    return (np.arange(len(matrix)) >= side.dictionary.nspecial) & (counts > 0)


def geometry(matrix: np.ndarray, side: Side) -> dict[str, float]:
    """ρ(row norm, token count) and mean pairwise cosine over the rows seen on this side, and
    the mean norm of the rows never seen there."""
    keep = seen_rows(matrix, side)
    unseen = ~keep & (np.arange(len(matrix)) >= side.dictionary.nspecial)
    rows = matrix[keep].astype(np.float64)
    norms = np.linalg.norm(rows, axis=1)
    units = rows / np.maximum(norms, 1e-12)[:, None]
    n = len(units)
    # mean over i != j of u_i·u_j = (‖Σu‖² − n) / (n(n − 1))
    mean_cos = (np.square(units.sum(axis=0)).sum() - n) / (n * (n - 1))
    unseen_norms = np.linalg.norm(matrix[unseen].astype(np.float64), axis=1)
    return {"norm_frequency_spearman": _number(spearmanr(norms, side.counts[keep])[0]),
            "mean_pairwise_cosine": float(mean_cos), "mean_norm": float(norms.mean()),
            "rows_seen": int(keep.sum()), "rows_unseen": int(unseen.sum()),
            "mean_norm_unseen": float(unseen_norms.mean()) if unseen.any() else None}


def norm_by_side(matrix: np.ndarray, source: Side, target: Side) -> dict[str, dict[str, Any]]:
    """A three-way tied matrix's rows by where their piece occurs in the training data (source
    only, target only, both): how many and their mean norm. Only target pieces are ever the
    softmax's correct class, so ``dot`` can give the two sides different lengths."""
    n = len(matrix)
    real = np.arange(n) >= source.dictionary.nspecial
    src, tgt = source.counts[:n] > 0, target.counts[:n] > 0
    norms = np.linalg.norm(matrix.astype(np.float64), axis=1)
    groups = {"source only": src & ~tgt, "target only": tgt & ~src, "both": src & tgt}
    return {name: {"rows": int((rows := mask & real).sum()),
                   "mean_norm": float(norms[rows].mean()) if rows.any() else None}
            for name, mask in groups.items()}


def _number(x: float) -> float | None:
    return None if x is None or math.isnan(float(x)) else float(x)


# --- per checkpoint -------------------------------------------------------------------------

def side_of(roles: list[str], sides: dict[str, Side]) -> Side:
    """The side a matrix serves; a three-way tied matrix serves both (one joined dictionary),
    so its token counts are the sum of both sides'."""
    wanted = sorted({side for role, side in ROLES.values() if role in roles})
    if len(wanted) == 1:
        return sides[wanted[0]]
    both = [sides[w] for w in wanted]
    return Side(both[0].dictionary, sum(s.counts for s in both),
                " + ".join(s.counted_in for s in both), "+".join(s.label for s in both))


def matrices(model: dict[str, torch.Tensor]) -> list[tuple[str, list[str]]]:
    """(first key, roles) per distinct matrix: tied roles share one storage, or hold equal
    copies (an averaged checkpoint averages each key on its own)."""
    groups: list[tuple[str, list[str]]] = []
    for key, (role, _side) in ROLES.items():
        if key not in model:
            continue
        same = next((g for g in groups if _same_matrix(model[g[0]], model[key])), None)
        if same is None:
            groups.append((key, [role]))
        else:
            same[1].append(role)
    return groups


def _same_matrix(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() or (a.shape == b.shape and torch.equal(a, b))


def analyse(path: str, label: str, dicts: dict[str, Side], sp, state: dict) -> ModelReport:
    args = checkpoints.model_args(state)
    history = (state.get("optimizer_history") or [{}])[-1]
    report = ModelReport(str(path), label, checkpoints.arch_of(state) or "?",
                         getattr(args, "tying", "?"), getattr(args, "output_layer", "?"),
                         int(history.get("num_updates", 0)))
    words = {w.lower() for name in BENCHMARKS for pair in benchmark_pairs(name)[1] for w in pair}
    for key, roles in matrices(state["model"]):
        matrix = state["model"][key].float().numpy()
        side = side_of(roles, dicts)
        pieces = word_pieces(words, side.dictionary, sp)
        sims = {}
        for name in BENCHMARKS:  # whole-word is every word when words are the vocabulary
            for variant, whole in (VARIANTS if sp is not None else {"": False}).items():
                vectors = word_vectors(pieces, matrix, whole_words=whole)
                sims[name + variant] = similarity(vectors, matrix.shape[1], name)
        serves = {side for role, side in ROLES.values() if role in roles}
        by_side = norm_by_side(matrix, dicts["source"], dicts["target"]) \
            if serves == {"source", "target"} else None
        report.matrices.append(MatrixReport(key, roles, matrix.shape[0], matrix.shape[1], sims,
                                            **geometry(matrix, side), norm_by_side=by_side))
    return report


def default_label(path: str, state: dict) -> str:
    args = checkpoints.model_args(state)
    tying, output_layer = getattr(args, "tying", "?"), getattr(args, "output_layer", "?")
    extras = [f for f in ("tied_projection", "output_bias") if getattr(args, f, False)]
    return " ".join([f"{tying}·{output_layer}", *(f"+{e}" for e in extras)])


# --- outputs --------------------------------------------------------------------------------

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
    return "\n".join(lines) + "\n"


def plot(reports: Sequence[ModelReport], states: dict[str, dict], dicts: dict[str, dict],
         out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(r, m) for r in reports for m in r.matrices]
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for ax, (r, m) in zip(axes.flat, panels, strict=False):
        side = side_of(m.roles, dicts[r.checkpoint])
        matrix = states[r.checkpoint]["model"][m.key].float().numpy()
        keep = seen_rows(matrix, side)
        ax.scatter(side.counts[keep], np.linalg.norm(matrix[keep], axis=1), s=3, alpha=0.4)
        ax.set_xscale("log")
        ax.set_title(f"{r.label}\n{' = '.join(m.roles)}", fontsize=8)
        ax.set_xlabel(f"token frequency in training ({side.label})")
        ax.set_ylabel("row norm ‖w‖")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    _save(fig, out / "norms_vs_frequency.png")

    roles = [role for role, _ in ROLES.values()
             if any(role in m.roles for r in reports for m in r.matrices)]
    fig, axes = plt.subplots(1, len(BENCHMARKS), figsize=(max(6, 1.6 * len(reports)) * 2, 3.8),
                             squeeze=False)
    width = 0.8 / len(roles)
    for ax, name in zip(axes.flat, BENCHMARKS, strict=True):
        for j, role in enumerate(roles):
            values = [next((m.similarity[name]["spearman"] or 0.0 for m in r.matrices
                            if role in m.roles), np.nan) for r in reports]
            offset = (j - (len(roles) - 1) / 2) * width
            ax.bar(np.arange(len(reports)) + offset, values, width, label=role)
        ax.axhline(0, color="black", linewidth=0.5)
        ax.set_xticks(np.arange(len(reports)), [r.label for r in reports], rotation=30,
                      ha="right", fontsize=8)
        ax.set_ylabel(f"{name} Spearman ρ")
        ax.legend(fontsize=7)
    fig.tight_layout()
    _save(fig, out / "similarity.png")
    plt.close("all")


def _save(fig, path: Path) -> None:
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))


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
    # the report is the output: fairseq's and gensim's INFO lines would bury it
    logging.basicConfig(level=logging.WARNING, force=True)
    missing = [c for c in opts.checkpoints if not os.path.isfile(c)]
    if missing:
        p.error(f"no such checkpoint: {', '.join(missing)}")
    if not opts.block.replace("_", "").isalnum():
        p.error(f"--block {opts.block!r}: use letters, digits and _ (it names the report's "
                "<!-- NAME:begin --> marker)")
    reports = run(opts.checkpoints, opts.out, opts.spm, opts.data, opts.labels, opts.report,
                  opts.block)
    print(Path(opts.out / "analysis.md").read_text(), end="")
    print(f"wrote {opts.out}/analysis.json, analysis.md, norms_vs_frequency.png, similarity.png "
          f"({len(reports)} checkpoint{'s' * (len(reports) != 1)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
