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
directory is built aside and renamed into place when complete. Reading, segmenting into
subwords, binarizing and the rerun check are :mod:`fairseq_tying.data.build`'s.
"""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

from fairseq_tying.common import LM_TASK
from fairseq_tying.common.moses import moses_tokenize
from fairseq_tying.data import build


def lm_record(args: Namespace) -> dict:
    return {"task": LM_TASK, "corpus": build.corpus_id(args.corpus),
            "lang": args.lm, "subword": args.subword, "vocab_size": args.vocab_size,
            "spm_type": args.spm_type if args.subword == "sentencepiece" else None,
            "train_limit": args.train_limit, "train_fraction": args.train_fraction,
            "sample_seed": args.sample_seed if args.train_fraction is not None else None,
            "post_process": args.subword if args.subword != "word" else None}


def segment(work: Path, data: dict, langs: tuple[str, ...], args: Namespace) -> dict:
    """Subwords as for translation, or (``word``) Moses tokens in lower case."""
    if args.subword != "word":
        return build.segment(work, data, langs, args)
    return {key: [line.lower() for line in moses_tokenize(lines, key[1])]
            for key, lines in data.items()}


def prepare_lm(args: Namespace) -> tuple[Path, bool]:
    """Build the data dir; returns it and whether work was done (False: already prepared)."""
    n_words = args.vocab_size if args.subword == "word" else None
    return build.build_data_dir(args, lm_record(args), (args.lm,), segment, n_words)
