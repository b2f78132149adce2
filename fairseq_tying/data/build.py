"""Building a prepared data dir: reading a corpus, subword segmentation, fairseq binarization
and the rerun check, for a translation pair (:func:`prepare_pair`) and, through
:mod:`fairseq_tying.data.lm`, for a language model.

``D/raw/{split}.{lang}`` holds the plain text (the BLEU references; ``D/raw/test.TGT.docs`` the
test pairs' documents, from the corpus's ``test.docs``), ``D/subword/`` the
segmented text, ``D/spm.model`` or ``D/bpe.codes`` the subword model, ``D/bin/`` the binarized
data and ``D/prep.json`` what was done. The directory is built aside and renamed into place
when complete. The command line is :mod:`fairseq_tying.data.prepare`'s.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2
from subword_nmt.apply_bpe import BPE
from subword_nmt.learn_bpe import learn_bpe
from tqdm import tqdm

from fairseq_tying.common import DOCS_SUFFIX
from fairseq_tying.common.atomic import building_dir, read_lines, write_lines
from fairseq_tying.common.moses import moses_tokenize
from fairseq_tying.data import bible

SPLITS = ("train", "valid", "test")
TEST_DOCS = "test.docs"  # a corpus directory's document of each test pair, one name per line
SUBWORDS = ("sentencepiece", "subword_nmt")
# (work dir, {(split, lang): lines}, langs, args) -> the same lines in subword units
Segmenter = Callable[[Path, dict, tuple, argparse.Namespace], dict]


class PrepareError(Exception):
    """Bad input to the preparation (the message names the flag or file and the fix)."""


def read_corpus(corpus: str, langs: tuple[str, ...], train_limit: int | None,
                train_fraction: float | None = None, sample_seed: int = 1) -> dict:
    """``{(split, lang): lines}`` of the embedded Bible or of a directory of plain text files:
    a translation pair (``langs`` = src, tgt) or one language (a language model); the
    training set cut to its first ``train_limit`` lines or to a random ``train_fraction``."""
    if corpus == "bible":
        if not set(langs) <= set(bible.LANGS):
            raise PrepareError(f"--corpus bible has languages {' and '.join(bible.LANGS)}, "
                               f"not {_lang_flags(langs)}")
        data = {(s, lang): bible.read_split(s, lang) for s in SPLITS for lang in langs}
    else:
        data = _read_dir(corpus, langs)
    for s in SPLITS:
        n = [len(data[(s, lang)]) for lang in langs]
        if len(set(n)) > 1:
            raise PrepareError(f"--corpus {corpus}: {s}.{langs[0]} has {n[0]} lines, "
                               f"{s}.{langs[1]} {n[1]}")
        if n[0] == 0:
            raise PrepareError(f"--corpus {corpus}: {s}.{langs[0]} is empty")
    if train_limit is not None:
        for lang in langs:
            data[("train", lang)] = data[("train", lang)][:train_limit]
    if train_fraction is not None:
        keep = sample_indices(len(data[("train", langs[0])]), train_fraction, sample_seed)
        for lang in langs:
            data[("train", lang)] = [data[("train", lang)][i] for i in keep]
    return data


def test_documents(corpus: str, langs: tuple[str, ...], n_test: int) -> list[str] | None:
    """The document of each test pair, from the corpus directory's ``test.docs`` (None when it
    has none): the answer gives each claim's Δ on each document alone."""
    path = Path(corpus) / TEST_DOCS
    if corpus == "bible" or not path.is_file():
        return None
    if len(langs) == 1:
        raise PrepareError(f"{path}: test documents are for a translation pair's answer; a "
                           "language model's has none: move the file out of --corpus")
    names = read_lines(path)
    if len(names) != n_test:
        raise PrepareError(f"{path} has {len(names)} lines for {n_test} test pairs: give the "
                           "document of each test pair, one name per line, or remove it")
    blank = next((i for i, name in enumerate(names, 1) if not name.strip()), None)
    if blank is not None:
        raise PrepareError(f"{path}: line {blank} is empty; name the document of each test "
                           "pair")
    return names


def sample_indices(n: int, fraction: float, seed: int) -> list[int]:
    """``floor(fraction x n)`` of ``range(n)`` drawn without replacement by ``seed``, in order:
    a sample spread over the whole corpus (a corpus in book or document order cut at its
    start would change the domain along with the size)."""
    k = max(1, math.floor(fraction * n))
    return sorted(random.Random(seed).sample(range(n), k))


def _lang_flags(langs: tuple[str, ...]) -> str:
    """The flags that chose ``langs``, for error messages: a pair or a language model's."""
    return f"--src {langs[0]} --tgt {langs[1]}" if len(langs) == 2 else f"--lm {langs[0]}"


def _read_dir(corpus: str, langs: tuple[str, ...]) -> dict:
    root = Path(corpus)
    if not root.is_dir():
        raise PrepareError(f"--corpus {corpus}: not 'bible' nor a directory")
    exts = "{" + ",".join(langs) + "}" if len(langs) > 1 else langs[0]
    data = {}
    for s in SPLITS:
        for lang in langs:
            path = root / f"{s}.{lang}"
            if not path.is_file():
                raise PrepareError(
                    f"--corpus {corpus}: {path} is missing; a corpus directory needs "
                    f"{{train,valid,test}}.{exts} with one sentence per line"
                )
            # a carriage return inside a line is a line break to fairseq-preprocess (Python's
            # universal newlines): a space here keeps the two sides aligned
            data[(s, lang)] = [line.replace("\r", " ") for line in read_lines(path)]
    return data


def _train_text(data: dict, langs: tuple[str, ...]) -> list[str]:
    """The training lines the subword model learns from: every language's, each once."""
    return [line for lang in dict.fromkeys(langs) for line in data[("train", lang)]]


def segment(work: Path, data: dict, langs: tuple[str, ...], args) -> dict:
    """``data`` in ``--subword`` units (sentencepiece or subword_nmt), the model learnt from the
    training lines of ``langs`` and saved in ``work``."""
    learn = sentencepiece if args.subword == "sentencepiece" else subword_nmt
    return learn(work, data, langs, args)


def sentencepiece(work: Path, data: dict, langs: tuple[str, ...], args) -> dict:
    """Learn ``work/spm.model`` and segment ``data`` into its pieces."""
    train = work / "spm.train.txt"
    write_lines(train, _train_text(data, langs))
    spm.SentencePieceTrainer.train(
        input=str(train),
        model_prefix=str(work / "spm"),
        vocab_size=args.vocab_size,
        model_type=args.spm_type,
        character_coverage=1.0,
        hard_vocab_limit=False,  # a small --train-limit may not support the full size
        num_threads=1,
        minloglevel=2,
    )
    train.unlink()
    stable_trainer_spec(work / "spm.model")
    sp = spm.SentencePieceProcessor(model_file=str(work / "spm.model"))
    out = {}
    for key, lines in tqdm(data.items(), desc="sentencepiece", unit="file"):
        out[key] = [" ".join(p) for p in sp.encode(lines, out_type=str)]
    return out


def stable_trainer_spec(model: Path) -> None:
    """Name the training file and the prefix in the model's trainer spec by their file names,
    not by the paths of the temporary build folder they had: the same corpus and flags then give
    the same ``spm.model`` bytes (the pieces and scores are the same either way)."""
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model.read_bytes())
    proto.trainer_spec.input[:] = [Path(p).name for p in proto.trainer_spec.input]
    proto.trainer_spec.model_prefix = Path(proto.trainer_spec.model_prefix).name
    model.write_bytes(proto.SerializeToString())


def subword_nmt(work: Path, data: dict, langs: tuple[str, ...], args) -> dict:
    """Moses-tokenize ``data``, learn ``work/bpe.codes`` and apply them."""
    tok = {
        key: moses_tokenize(lines, key[1])
        for key, lines in tqdm(data.items(), desc="moses tokenize", unit="file")
    }
    codes = work / "bpe.codes"
    with open(codes, "w", encoding="utf-8") as f:
        learn_bpe(_train_text(tok, langs), f, args.vocab_size)
    with open(codes, encoding="utf-8") as f:
        bpe = BPE(f)
    return {
        key: [bpe.segment(line) for line in lines]
        for key, lines in tqdm(tok.items(), desc="apply bpe", unit="file")
    }


def dictionary_name(langs: tuple[str, ...]) -> str:
    """The dictionary :func:`preprocess` writes: one per language of a pair (both the same
    here), ``dict.txt`` for one language."""
    return f"dict.{langs[0]}.txt" if len(langs) == 2 else "dict.txt"


def preprocess(text_dir: Path, bin_dir: Path, langs: tuple[str, ...],
               n_words: int | None = None, workers: int = 1) -> Path:
    """fairseq-preprocess of ``text_dir/{split}.{lang}``; returns the dictionary's path.

    A pair (``langs`` = src, tgt) gets one dictionary shared by both languages
    (``--joined-dictionary``); one language gets ``--only-source``, and ``n_words`` keeps that
    many types (every other one becomes <unk>)."""
    if len(langs) == 2:
        cmd = ["--source-lang", langs[0], "--target-lang", langs[1], "--joined-dictionary"]
        prefixes = [text_dir / s for s in SPLITS]
    else:
        cmd = ["--only-source"]
        prefixes = [text_dir / f"{s}.{langs[0]}" for s in SPLITS]
    cmd += ["--destdir", str(bin_dir), "--workers", str(workers)]
    for s, prefix in zip(SPLITS, prefixes, strict=True):
        cmd += [f"--{s}pref", str(prefix)]
    if n_words is not None:
        cmd += ["--nwordssrc", str(n_words)]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    proc = subprocess.run([sys.executable, "-m", "fairseq_cli.preprocess", *cmd],
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"fairseq-preprocess failed:\n{proc.stdout}\n{proc.stderr}")
    return bin_dir / dictionary_name(langs)


def corpus_id(corpus: str) -> str:
    """``--corpus`` as prep.json records it: 'bible' or the directory's absolute path."""
    return "bible" if corpus == "bible" else str(Path(corpus).resolve())


def prep_record(args) -> dict:
    return {
        "corpus": corpus_id(args.corpus),
        "src": args.src,
        "tgt": args.tgt,
        "subword": args.subword,
        "post_process": args.subword,
        "detokenizer": "moses" if args.subword == "subword_nmt" else None,
        "vocab_size": args.vocab_size,
        "spm_type": args.spm_type if args.subword == "sentencepiece" else None,
        "train_limit": args.train_limit,
        "train_fraction": args.train_fraction,
        "sample_seed": args.sample_seed if args.train_fraction is not None else None,
        "test_docs": _digest(Path(args.corpus) / TEST_DOCS) if args.corpus != "bible" else None,
    }


def _digest(path: Path) -> str | None:
    """A file's sha256 (None if absent): a data dir is prepared again when it changes."""
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def is_prepared(out: Path, record: dict, langs: tuple[str, ...]) -> bool:
    """Whether ``out`` is a complete data dir made with the same settings."""
    try:
        done = json.loads((out / "prep.json").read_text())
    except (OSError, ValueError):
        return False
    same = all(done.get(k) == v for k, v in record.items())
    return same and (out / "bin" / dictionary_name(langs)).is_file()


def build_data_dir(args, record: dict, langs: tuple[str, ...], segmenter: Segmenter = segment,
                   n_words: int | None = None) -> tuple[Path, bool]:
    """Build ``--out`` from ``langs`` of ``--corpus``, recording ``record`` in its prep.json;
    returns it and whether work was done (False: already prepared)."""
    out = Path(args.out)
    if is_prepared(out, record, langs):
        return out, False
    if out.exists() and not args.force:
        raise PrepareError(
            f"--out {out} exists but was not prepared with these settings; "
            "choose another --out or pass --force to replace it"
        )
    data = read_corpus(args.corpus, langs, args.train_limit, args.train_fraction,
                       args.sample_seed)
    with building_dir(out) as work:
        for folder, texts in (("raw", data), ("subword", segmenter(work, data, langs, args))):
            (work / folder).mkdir()
            for (s, lang), lines in texts.items():
                write_lines(work / folder / f"{s}.{lang}", lines)
        docs = test_documents(args.corpus, langs, len(data[("test", langs[0])]))
        if docs is not None:
            write_lines(work / "raw" / f"test.{langs[-1]}{DOCS_SUFFIX}", docs)
        dictionary = preprocess(work / "subword", work / "bin", langs, n_words)
        counted = "pairs" if len(langs) == 2 else "sentences"
        record[counted] = {s: len(data[(s, langs[0])]) for s in SPLITS}
        record["dict_size"] = len(dictionary.read_text().splitlines())
        (work / "prep.json").write_text(json.dumps(record, indent=2) + "\n")
    return out, True


def prepare_pair(args) -> tuple[Path, bool]:
    """Build a translation pair's data dir (``--src``, ``--tgt``); returns it and whether work
    was done (False: already prepared)."""
    return build_data_dir(args, prep_record(args), (args.src, args.tgt))
