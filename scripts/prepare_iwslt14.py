#!/usr/bin/env python
"""Prepare IWSLT'14 De-En (fairseq's standard split), Es-En or Ro-En (dev2010 valid,
tst2010-2012 test) as a fairseq_tying data dir.

    python scripts/prepare_iwslt14.py --pair de-en --out data-bin/iwslt14-de-en
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fairseq_tying.data import benchmarks, prepare


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", choices=sorted(benchmarks.IWSLT_URLS), default="de-en")
    p.add_argument("--out", type=Path, required=True, help="the prepared data dir to create")
    p.add_argument("--work", type=Path, help="downloads and plain-text corpus (default OUT.orig)")
    p.add_argument("--archive", type=Path, help="an already downloaded <pair>.tgz")
    p.add_argument("--cased", action="store_true", help="keep case (fairseq's recipe lowercases)")
    p.add_argument("--subword", choices=prepare.SUBWORDS, default="subword_nmt")
    p.add_argument("--spm-type", choices=("unigram", "bpe"), default="unigram")
    p.add_argument("--vocab-size", type=int, default=10000, help="10k joint BPE as fairseq")
    p.add_argument("--force", action="store_true")
    args = p.parse_args(argv)
    work = args.work or args.out.with_name(args.out.name + ".orig")
    src, tgt = args.pair.split("-")
    try:
        archive = args.archive
        if archive is None:
            url = benchmarks.IWSLT_URLS[args.pair]
            archive = benchmarks.download(url, work / f"{args.pair}.tgz")
        elif not archive.is_file():
            raise FileNotFoundError(f"--archive {archive} does not exist")
        benchmarks.extract_tgz(archive, work / "extracted")
        pairs = benchmarks.build_iwslt14(work / "extracted", args.pair, not args.cased)
        corpus = benchmarks.write_pairs(pairs, work / "corpus", src, tgt)
    except (benchmarks.DownloadError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(", ".join(f"{k} {len(s):,}" for k, (s, _) in pairs.items()) + f" pairs -> {corpus}")
    cmd = ["--corpus", str(corpus), "--src", src, "--tgt", tgt, "--subword", args.subword,
           "--spm-type", args.spm_type, "--vocab-size", str(args.vocab_size),
           "--out", str(args.out)] + (["--force"] if args.force else [])  # fmt: skip
    return prepare.main(cmd)


if __name__ == "__main__":
    sys.exit(main())
