"""Subword segmentation and fairseq binarization of a parallel corpus into a prepared data dir.

    python -m fairseq_tying.data.prepare --corpus bible --src es --tgt en \
        --subword sentencepiece --vocab-size 8000 --out data-bin/bible-spm8k

``D/raw/{split}.{src,tgt}`` holds the plain text (the BLEU references), ``D/subword/`` the
segmented text, ``D/spm.model`` or ``D/bpe.codes`` the subword model, ``D/bin/`` the binarized
data (``fairseq-preprocess --joined-dictionary``, ready for three-way tying) and ``D/prep.json``
what was done. The directory is built aside and renamed into place when complete.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from tqdm import tqdm

from fairseq_tying.common.atomic import building_dir
from fairseq_tying.common.moses import moses_tokenize
from fairseq_tying.data import bible

SPLITS = ("train", "valid", "test")
SUBWORDS = ("sentencepiece", "subword_nmt")


class PrepareError(Exception):
    """Bad input to the preparation (the message names the flag or file and the fix)."""


def read_corpus(corpus: str, src: str, tgt: str, train_limit: int | None) -> dict:
    """``{(split, lang): lines}`` of the embedded Bible or of a directory of plain text files."""
    if corpus == "bible":
        if {src, tgt} != set(bible.LANGS):
            raise PrepareError(
                f"--corpus bible has languages es and en, not --src {src} --tgt {tgt}"
            )
        data = {(s, lang): bible.read_split(s, lang) for s in SPLITS for lang in bible.LANGS}
    else:
        root = Path(corpus)
        if not root.is_dir():
            raise PrepareError(f"--corpus {corpus}: not 'bible' nor a directory")
        data = {}
        for s in SPLITS:
            for lang in (src, tgt):
                path = root / f"{s}.{lang}"
                if not path.is_file():
                    raise PrepareError(
                        f"--corpus {corpus}: {path} is missing; a corpus directory needs "
                        f"{{train,valid,test}}.{{{src},{tgt}}} with one sentence per line"
                    )
                data[(s, lang)] = path.read_text(encoding="utf-8").splitlines()
    for s in SPLITS:
        n_src, n_tgt = len(data[(s, src)]), len(data[(s, tgt)])
        if n_src != n_tgt:
            raise PrepareError(f"--corpus {corpus}: {s}.{src} has {n_src} lines, {s}.{tgt} {n_tgt}")
        if n_src == 0:
            raise PrepareError(f"--corpus {corpus}: {s}.{src} is empty")
    if train_limit is not None:
        for lang in (src, tgt):
            data[("train", lang)] = data[("train", lang)][:train_limit]
    return data


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _train_text(data: dict, langs: tuple[str, ...]) -> list[str]:
    """The training lines the subword model learns from: every language's, each once."""
    return [line for lang in dict.fromkeys(langs) for line in data[("train", lang)]]


def _sentencepiece(work: Path, data: dict, langs: tuple[str, str], args) -> dict:
    import sentencepiece as spm

    train = work / "spm.train.txt"
    _write(train, _train_text(data, langs))
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
    sp = spm.SentencePieceProcessor(model_file=str(work / "spm.model"))
    out = {}
    for key, lines in tqdm(data.items(), desc="sentencepiece", unit="file"):
        out[key] = [" ".join(p) for p in sp.encode(lines, out_type=str)]
    return out


def _subword_nmt(work: Path, data: dict, langs: tuple[str, str], args) -> dict:
    from subword_nmt.apply_bpe import BPE
    from subword_nmt.learn_bpe import learn_bpe

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


def binarize(subword_dir: Path, bin_dir: Path, src: str, tgt: str, workers: int = 1) -> None:
    """fairseq-preprocess with one dictionary shared by both languages."""
    cmd = [
        sys.executable,
        "-m",
        "fairseq_cli.preprocess",
        "--source-lang",
        src,
        "--target-lang",
        tgt,
        "--joined-dictionary",
        "--destdir",
        str(bin_dir),
        "--workers",
        str(workers),
    ]
    for s in SPLITS:
        cmd += [f"--{s}pref", str(subword_dir / s)]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"fairseq-preprocess failed:\n{proc.stdout}\n{proc.stderr}")


def prep_record(args) -> dict:
    corpus = "bible" if args.corpus == "bible" else str(Path(args.corpus).resolve())
    return {
        "corpus": corpus,
        "src": args.src,
        "tgt": args.tgt,
        "subword": args.subword,
        "post_process": args.subword,
        "detokenizer": "moses" if args.subword == "subword_nmt" else None,
        "vocab_size": args.vocab_size,
        "spm_type": args.spm_type if args.subword == "sentencepiece" else None,
        "train_limit": args.train_limit,
    }


def is_prepared(out: Path, record: dict) -> bool:
    """Whether ``out`` is a complete data dir made with the same settings."""
    try:
        done = json.loads((out / "prep.json").read_text())
    except (OSError, ValueError):
        return False
    same = all(done.get(k) == v for k, v in record.items())
    return same and (out / "bin" / f"dict.{record['src']}.txt").is_file()


def prepare(args) -> tuple[Path, bool]:
    """Build the data dir; returns it and whether work was done (False: already prepared)."""
    out = Path(args.out)
    record = prep_record(args)
    if is_prepared(out, record):
        return out, False
    if out.exists() and not args.force:
        raise PrepareError(
            f"--out {out} exists but was not prepared with these settings; "
            "choose another --out or pass --force to replace it"
        )
    data = read_corpus(args.corpus, args.src, args.tgt, args.train_limit)
    langs = (args.src, args.tgt)
    with building_dir(out) as work:
        (work / "raw").mkdir()
        (work / "subword").mkdir()
        for (s, lang), lines in data.items():
            _write(work / "raw" / f"{s}.{lang}", lines)
        segment = _sentencepiece if args.subword == "sentencepiece" else _subword_nmt
        for (s, lang), lines in segment(work, data, langs, args).items():
            _write(work / "subword" / f"{s}.{lang}", lines)
        binarize(work / "subword", work / "bin", args.src, args.tgt)
        record["pairs"] = {s: len(data[(s, args.src)]) for s in SPLITS}
        dict_lines = (work / "bin" / f"dict.{args.src}.txt").read_text().splitlines()
        record["dict_size"] = len(dict_lines)
        (work / "prep.json").write_text(json.dumps(record, indent=2) + "\n")
    return out, True


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m fairseq_tying.data.prepare", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--corpus",
        required=True,
        help="'bible' (the embedded es-en corpus) or a directory holding "
        "{train,valid,test}.{SRC,TGT} plain text",
    )
    p.add_argument("--src", help="source language code, e.g. es")
    p.add_argument("--tgt", help="target language code, e.g. en")
    p.add_argument("--lm", metavar="LANG",
                   help="a language-modelling set of this language instead of a translation "
                        "pair (fairseq's language_modeling task; see fairseq_tying/data/lm.py)")
    p.add_argument("--subword", choices=(*SUBWORDS, "word"), default="sentencepiece",
                   help="word (--lm only): Moses tokens, lower case, --vocab-size words + <unk>")
    p.add_argument(
        "--spm-type", choices=("unigram", "bpe"), default="unigram", help="sentencepiece model type"
    )
    p.add_argument(
        "--vocab-size",
        type=int,
        required=True,
        help="sentencepiece vocabulary size, the number of subword-nmt merges, or (word) "
        "the number of words kept",
    )
    p.add_argument(
        "--train-limit",
        type=int,
        default=None,
        metavar="N",
        help="use only the first N training pairs",
    )
    p.add_argument("--out", required=True, help="the data dir to create")
    p.add_argument("--force", action="store_true", help="replace an --out prepared differently")
    return p


def main(argv: list[str] | None = None) -> int:
    return run(parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Check the settings, prepare, say what was done; 0, or 2 after an error message."""
    try:
        if args.vocab_size < 10:
            raise PrepareError(f"--vocab-size {args.vocab_size} is too small (use >= 10)")
        if args.train_limit is not None and args.train_limit < 1:
            raise PrepareError(f"--train-limit {args.train_limit} must be positive")
        if args.lm:
            return _main_lm(args)
        if not (args.src and args.tgt):
            raise PrepareError("--src and --tgt are required (or --lm LANG for a language model)")
        if args.subword == "word":
            raise PrepareError("--subword word is for language models (--lm LANG); translation "
                               "uses sentencepiece or subword_nmt")
        if args.src == args.tgt:
            raise PrepareError("--src and --tgt must differ")
        out, built = prepare(args)
    except (PrepareError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    prep = json.loads((out / "prep.json").read_text())
    state = "prepared" if built else "already prepared, skipped"
    print(
        f"{out}: {state} ({prep['subword']}, dictionary of {prep['dict_size']} types, "
        f"pairs {prep['pairs']})"
    )
    return 0


def _main_lm(args) -> int:
    from fairseq_tying.data.lm import prepare_lm as build

    if args.src or args.tgt:
        raise PrepareError(f"--lm {args.lm} prepares one language: drop --src/--tgt")
    out, built = build(args)
    prep = json.loads((out / "prep.json").read_text())
    state = "prepared" if built else "already prepared, skipped"
    print(f"{out}: {state} (language model, {prep['subword']}, dictionary of "
          f"{prep['dict_size']} types, sentences {prep['sentences']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
