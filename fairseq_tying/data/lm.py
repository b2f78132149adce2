"""Language-modelling sets: one side of a corpus, segmented and binarized for fairseq's
``language_modeling`` task (``python -m fairseq_tying.data.prepare --lm LANG``).

    python -m fairseq_tying.data.prepare --corpus bible --lm en --subword sentencepiece \
        --vocab-size 4000 --out data-bin/bible-lm-spm4k
    python -m fairseq_tying.data.prepare --corpus bible --lm en --subword word \
        --vocab-size 10000 --out data-bin/bible-lm-word10k

The splits are the translation corpus's (the Bible: held-out books for valid and test).
``word`` is Press & Wolf's word-level setting (Mikolov et al.'s Penn Treebank): Moses
tokenization, lower case, the ``--vocab-size`` most frequent training words and ``<unk>`` for
every other word. ``D/raw/`` holds the plain text, ``D/subword/`` what the model reads, ``D/bin/``
the output of ``fairseq-preprocess --only-source`` and ``D/prep.json`` what was done; the
directory is built aside and renamed into place when complete.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

from fairseq_tying.common.atomic import building_dir
from fairseq_tying.common.moses import moses_tokenize
from fairseq_tying.data import bible
from fairseq_tying.data.prepare import (
    SPLITS,
    PrepareError,
    _sentencepiece,
    _subword_nmt,
    _write,
)

LM_SUBWORDS = ("sentencepiece", "subword_nmt", "word")


def read_side(corpus: str, lang: str, train_limit: int | None) -> dict[tuple[str, str], list]:
    """``{(split, lang): lines}`` of one language of the Bible or of a text directory."""
    if corpus == "bible":
        if lang not in bible.LANGS:
            raise PrepareError(f"--corpus bible has languages {bible.LANGS}, not --lm {lang}")
        data = {(s, lang): bible.read_split(s, lang) for s in SPLITS}
    else:
        root = Path(corpus)
        missing = [root / f"{s}.{lang}" for s in SPLITS if not (root / f"{s}.{lang}").is_file()]
        if missing:
            raise PrepareError(f"--corpus {corpus}: {missing[0]} is missing; a language-modelling "
                               f"corpus needs {{train,valid,test}}.{lang}, one sentence per line")
        data = {(s, lang): (root / f"{s}.{lang}").read_text(encoding="utf-8").splitlines()
                for s in SPLITS}
    for (s, _), lines in data.items():
        if not lines:
            raise PrepareError(f"--corpus {corpus}: {s}.{lang} is empty")
    if train_limit is not None:
        data[("train", lang)] = data[("train", lang)][:train_limit]
    return data


def lm_record(args: Namespace) -> dict:
    corpus = "bible" if args.corpus == "bible" else str(Path(args.corpus).resolve())
    return {"task": "language_modeling", "corpus": corpus, "lang": args.lm,
            "subword": args.subword, "vocab_size": args.vocab_size,
            "spm_type": args.spm_type if args.subword == "sentencepiece" else None,
            "train_limit": args.train_limit,
            "post_process": args.subword if args.subword != "word" else None}


def segment(work: Path, data: dict, args: Namespace) -> dict:
    langs = (args.lm,)
    if args.subword == "sentencepiece":
        return _sentencepiece(work, data, langs, args)
    if args.subword == "subword_nmt":
        return _subword_nmt(work, data, langs, args)
    return {key: [line.lower() for line in moses_tokenize(lines, key[1])]
            for key, lines in data.items()}


def binarize_lm(text_dir: Path, bin_dir: Path, lang: str, n_words: int | None) -> None:
    """fairseq-preprocess --only-source; ``n_words`` keeps that many types (others <unk>)."""
    cmd = [sys.executable, "-m", "fairseq_cli.preprocess", "--only-source", "--destdir",
           str(bin_dir), "--workers", "1"]
    for s in SPLITS:
        cmd += [f"--{s}pref", str(text_dir / f"{s}.{lang}")]
    if n_words is not None:
        cmd += ["--nwordssrc", str(n_words)]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"fairseq-preprocess failed:\n{proc.stdout}\n{proc.stderr}")


def is_prepared(out: Path, record: dict) -> bool:
    try:
        done = json.loads((out / "prep.json").read_text())
    except (OSError, ValueError):
        return False
    return all(done.get(k) == v for k, v in record.items()) and (out / "bin/dict.txt").is_file()


def prepare_lm(args: Namespace) -> tuple[Path, bool]:
    """Build the data dir; returns it and whether work was done (False: already prepared)."""
    out, record = Path(args.out), lm_record(args)
    if is_prepared(out, record):
        return out, False
    if out.exists() and not args.force:
        raise PrepareError(f"--out {out} exists but was not prepared with these settings; "
                           "choose another --out or pass --force to replace it")
    data = read_side(args.corpus, args.lm, args.train_limit)
    with building_dir(out) as work:
        for folder, texts in (("raw", data), ("subword", segment(work, data, args))):
            (work / folder).mkdir()
            for (s, lang), lines in texts.items():
                _write(work / folder / f"{s}.{lang}", lines)
        n_words = args.vocab_size if args.subword == "word" else None
        binarize_lm(work / "subword", work / "bin", args.lm, n_words)
        record["sentences"] = {s: len(data[(s, args.lm)]) for s in SPLITS}
        record["dict_size"] = len((work / "bin/dict.txt").read_text().splitlines())
        (work / "prep.json").write_text(json.dumps(record, indent=2) + "\n")
    return out, True
