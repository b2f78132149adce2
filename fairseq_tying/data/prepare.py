"""Subword segmentation and fairseq binarization of a parallel corpus into a prepared data dir.

    python -m fairseq_tying.data.prepare --corpus bible --src es --tgt en \
        --subword sentencepiece --vocab-size 8000 --out data-bin/bible-spm8k

The command line of :mod:`.build` (what the data dir holds, and how it is built): a pair is
binarized with ``fairseq-preprocess --joined-dictionary``, ready for three-way tying; ``--lm
LANG`` prepares one language for a language model instead (:mod:`.lm`). A program calls
:func:`prepare` with a :class:`Prepare`, the command line's options.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from fairseq_tying.data.build import SUBWORDS, PrepareError, prepare_pair
from fairseq_tying.data.lm import prepare_lm

SUBWORD_CHOICES = (*SUBWORDS, "word")
SPM_TYPES = ("unigram", "bpe")


@dataclass(frozen=True)
class Prepare:
    """What to prepare (the command line's options): a corpus's pair ``src``-``tgt``, or its
    language ``lm`` for a language model, segmented and binarized into ``out``."""

    corpus: str
    vocab_size: int
    out: str | None = None  # required to prepare; a study gives its sweep's dataset folder
    src: str | None = None
    tgt: str | None = None
    lm: str | None = None
    subword: str = "sentencepiece"
    spm_type: str = "unigram"
    train_limit: int | None = None
    train_fraction: float | None = None
    sample_seed: int = 1
    force: bool = False

    def argv(self) -> list[str]:
        """The command line's arguments that give these options (defaults left out)."""
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                out += [flag] if value else []
            elif value is not None and value != f.default:
                out += [flag, str(value)]
        return out


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str):  # a ValueError for the caller instead of sys.exit
        raise ValueError(f"{self.prog}: {message}")


def options(args: Sequence[str], out_required: bool = True) -> Prepare:
    """The :class:`Prepare` of the command line's arguments ``args``; a ValueError names a
    wrong one (``--out`` may be left out unless ``out_required``)."""
    return Prepare(**vars(parser(_RaisingParser, out_required).parse_args(list(args))))


def parser(cls: type[argparse.ArgumentParser] = argparse.ArgumentParser,
           out_required: bool = True) -> argparse.ArgumentParser:
    p = cls(prog="python -m fairseq_tying.data.prepare", description=__doc__.split("\n")[0])
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
    p.add_argument("--subword", choices=SUBWORD_CHOICES, default=Prepare.subword,
                   help="word (--lm only): Moses tokens, lower case, --vocab-size words + <unk>")
    p.add_argument(
        "--spm-type", choices=SPM_TYPES, default=Prepare.spm_type, help="sentencepiece model type"
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
    p.add_argument(
        "--train-fraction",
        type=float,
        default=None,
        metavar="F",
        help="use a random F of the training pairs (e.g. 0.25: floor(F x pairs), drawn with "
        "--sample-seed, kept in corpus order); valid and test stay whole",
    )
    p.add_argument("--sample-seed", type=int, default=Prepare.sample_seed, metavar="S",
                   help=f"the seed of --train-fraction's draw (default {Prepare.sample_seed})")
    p.add_argument("--out", required=out_required, help="the data dir to create")
    p.add_argument("--force", action="store_true", help="replace an --out prepared differently")
    return p


def main(argv: list[str] | None = None) -> int:
    return prepare(Prepare(**vars(parser().parse_args(argv))))


def prepare(args: Prepare) -> int:
    """Check the settings, prepare, say what was done; 0, or 2 after an error message."""
    try:
        if args.out is None:
            raise PrepareError("--out: the data dir to create is required")
        if args.subword not in SUBWORD_CHOICES or args.spm_type not in SPM_TYPES:
            raise PrepareError(f"--subword {args.subword} --spm-type {args.spm_type}: expected "
                               f"one of {', '.join(SUBWORD_CHOICES)} and one of "
                               f"{', '.join(SPM_TYPES)}")
        if args.vocab_size < 10:
            raise PrepareError(f"--vocab-size {args.vocab_size} is too small (use >= 10)")
        if args.train_limit is not None and args.train_limit < 1:
            raise PrepareError(f"--train-limit {args.train_limit} must be positive")
        if args.train_fraction is not None:
            if not 0 < args.train_fraction <= 1:
                raise PrepareError(f"--train-fraction {args.train_fraction}: a fraction in "
                                   "(0, 1], e.g. 0.25 for a quarter of the training pairs")
            if args.train_limit is not None:
                raise PrepareError("--train-limit and --train-fraction both cut the training "
                                   "set: give one (a random sample: --train-fraction)")
        out, built = _prepare_lm(args) if args.lm else _prepare_pair(args)
    except (PrepareError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    prep = json.loads((out / "prep.json").read_text())
    state = "prepared" if built else "already prepared, skipped"
    what = f"language model, {prep['subword']}" if args.lm else prep["subword"]
    counted = "sentences" if args.lm else "pairs"
    print(f"{out}: {state} ({what}, dictionary of {prep['dict_size']} types, "
          f"{counted} {prep[counted]})")
    return 0


def _prepare_pair(args: Prepare) -> tuple[Path, bool]:
    if not (args.src and args.tgt):
        raise PrepareError("--src and --tgt are required (or --lm LANG for a language model)")
    if args.subword == "word":
        raise PrepareError("--subword word is for language models (--lm LANG); translation "
                           "uses sentencepiece or subword_nmt")
    if args.src == args.tgt:
        raise PrepareError("--src and --tgt must differ")
    return prepare_pair(args)


def _prepare_lm(args: Prepare) -> tuple[Path, bool]:
    if args.src or args.tgt:
        raise PrepareError(f"--lm {args.lm} prepares one language: drop --src/--tgt")
    return prepare_lm(args)


if __name__ == "__main__":
    sys.exit(main())
