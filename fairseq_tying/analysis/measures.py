"""The measures of ``python -m fairseq_tying.analysis``: the embedding matrices of a checkpoint
by role, the training data's token counts per side, word similarity through gensim, and the
geometry of the rows (norm–frequency ρ, anisotropy, norms by side)."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm
import torch
from fairseq.data import Dictionary, data_utils
from fairseq.data.data_utils import infer_language_pair

from fairseq_tying.common import LM_TASK, checkpoints
from fairseq_tying.common.extras import require
from fairseq_tying.core import names, output_layers

# its libraries (the analysis extra), imported on use: the package imports without them, and
# python -m fairseq_tying.analysis names the extra (require_libraries)
LIBRARIES = ("gensim.models", "gensim.test.utils", "scipy.stats", "matplotlib")


def library(module: str):
    return require(module, "analysis", "python -m fairseq_tying.analysis")


def require_libraries() -> None:
    for module in LIBRARIES:
        library(module)

ROLES = {  # state-dict key: (role, dictionary side)
    names.ENCODER_EMBED: ("encoder input", "source"),
    names.DECODER_EMBED: ("decoder input", "target"),
    names.SCORER_WEIGHT: ("decoder output", "target"),
}
BENCHMARKS = {"SimLex-999": "simlex999.txt", "WordSim-353": "wordsim353.tsv"}
# every word (mean of its pieces' rows), and only the pairs of words that are one piece each
VARIANTS = {"": False, " whole-word": True}
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
    arch: str | None
    tying: str
    output_layer: str
    num_updates: int
    matrices: list[MatrixReport] = field(default_factory=list)
    # the output layer's learned parameters by name (fixnorm's gain g, ngpt's sz): a scalar's
    # value, a vector's mean, min and max, each with its value before training ("initial")
    parameters: dict[str, dict[str, float]] = field(default_factory=dict)


# --- inputs ---------------------------------------------------------------------------------

def benchmark_pairs(name: str) -> tuple[str, list[tuple[str, str, float]]]:
    """The path gensim ships for a benchmark and its word pairs with their human rating, in
    the file's order (gensim's evaluate_word_pairs reads them alike)."""
    path = library("gensim.test.utils").datapath(BENCHMARKS[name])
    pairs = []
    for line in Path(path).read_text(encoding="utf8").splitlines():
        fields = line.split("\t")
        if not line.startswith("#") and len(fields) == 3:
            pairs.append((fields[0], fields[1], float(fields[2])))
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
    config = checkpoints.CheckpointConfig.of(state)
    folder = Path(data or config.data or "")
    if config.task == LM_TASK:
        if not (folder / "dict.txt").is_file():
            raise SystemExit(f"dictionary {folder / 'dict.txt'} not found: pass --data, the "
                             "fairseq-preprocess output the language model was trained on")
        return {"target": _side(folder / "dict.txt", folder / "train", "LM text")}
    src, tgt = config.source_lang, config.target_lang
    if src is None or tgt is None:  # fairseq-train infers them from the binarized files
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
    folder = Path(data or checkpoints.CheckpointConfig.of(state).data or ".")
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
    """gensim's evaluate_word_pairs on the benchmark, with the number of pairs it scored and
    each pair's cosine (None where not scored), which a paired test of two matrices needs."""
    path, pairs = benchmark_pairs(name)
    scored = sum(a.lower() in vectors and b.lower() in vectors for a, b, _ in pairs)
    result: dict[str, Any] = {"spearman": None, "pvalue": None, "pairs_scored": scored,
                              "pairs_total": len(pairs)}
    if scored < 3:
        return result  # too few pairs for a rank correlation
    kv = library("gensim.models").KeyedVectors(vector_size=dim)
    kv.add_vectors(list(vectors), np.stack(list(vectors.values())))
    logging.getLogger("gensim").setLevel(logging.WARNING)
    _pearson, spearman, oov_percent = kv.evaluate_word_pairs(path, restrict_vocab=len(kv))
    # gensim's own cosine of each pair it scored: its ρ is theirs with the ratings
    cosines = [float(kv.similarity(a.lower(), b.lower()))
               if a.lower() in vectors and b.lower() in vectors else None for a, b, _ in pairs]
    result.update(spearman=_number(spearman[0]), pvalue=_number(spearman[1]),
                  pairs_scored=round(len(pairs) * (1 - oov_percent / 100)), cosines=cosines)
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
    rho = library("scipy.stats").spearmanr(norms, side.counts[keep])[0]
    return {"norm_frequency_spearman": _number(rho),
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
    trained = checkpoints.CheckpointConfig.of(state).identity(Path(path).name)
    history = (state.get("optimizer_history") or [{}])[-1]
    report = ModelReport(str(path), label, trained.arch, trained.tying, trained.output_layer,
                         int(history.get("num_updates", 0)))
    report.parameters = learned_parameters(state["model"], trained.output_layer)
    words = {w.lower() for name in BENCHMARKS for *pair, _ in benchmark_pairs(name)[1]
             for w in pair}
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


def learned_parameters(model: dict[str, torch.Tensor], output_layer: str
                       ) -> dict[str, dict[str, float]]:
    """Each learned parameter of the layer in a checkpoint's state dict, by name: a scalar's
    value, or a vector's mean, min and max, with the same of its initial value."""
    layer = output_layers.get(output_layer)
    initial = layer.initial_values(*model[names.SCORER_WEIGHT].shape)
    found = {}
    for name in layer.parameters:
        if (value := model.get(names.SCORER_PREFIX + name)) is None:
            continue
        found[name] = {**_summary(value), **{f"initial_{k}": v for k, v in
                                             _summary(torch.as_tensor(initial[name])).items()}}
    return found


def _summary(value: torch.Tensor) -> dict[str, float]:
    value = value.double()
    if value.numel() == 1:
        return {"value": float(value)}
    return {"mean": float(value.mean()), "min": float(value.min()), "max": float(value.max())}


def default_label(path: str, state: dict) -> str:
    config = checkpoints.CheckpointConfig.of(state)
    trained = config.identity(Path(path).name)
    extras = [f for f in ("tied_projection", "output_bias") if getattr(config.model, f, False)]
    return " ".join([f"{trained.tying}·{trained.output_layer}", *(f"+{e}" for e in extras)])
