#!/usr/bin/env python
"""Prepare WMT'16 En-De (Europarl v7 + Common Crawl + News Commentary v11; newstest2013 valid,
newstest2014 test; 32k joint vocabulary) as a fairseq_tying data dir.

    python scripts/prepare_wmt16_en_de.py --out data-bin/wmt16-en-de
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fairseq_tying.data import benchmarks, prepare


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the prepared data dir to create")
    p.add_argument("--work", type=Path, help="downloads and plain-text corpus (default OUT.orig)")
    p.add_argument("--subword", choices=prepare.SUBWORDS, default="sentencepiece")
    p.add_argument("--spm-type", choices=("unigram", "bpe"), default="bpe")
    p.add_argument("--vocab-size", type=int, default=32000, help="32k joint vocabulary")
    p.add_argument("--force", action="store_true")
    args = p.parse_args(argv)
    work = args.work or args.out.with_name(args.out.name + ".orig")
    try:
        for name, url in benchmarks.WMT16_URLS.items():
            archive = benchmarks.download(url, work / name)
            benchmarks.extract_tgz(archive, work / "extracted")
        pairs = benchmarks.build_wmt16_en_de(work / "extracted")
        corpus = benchmarks.write_pairs(pairs, work / "corpus", "en", "de")
    except (benchmarks.DownloadError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(", ".join(f"{k} {len(s):,}" for k, (s, _) in pairs.items()) + f" pairs -> {corpus}")
    cmd = ["--corpus", str(corpus), "--src", "en", "--tgt", "de", "--subword", args.subword,
           "--spm-type", args.spm_type, "--vocab-size", str(args.vocab_size),
           "--out", str(args.out)] + (["--force"] if args.force else [])  # fmt: skip
    return prepare.main(cmd)


if __name__ == "__main__":
    sys.exit(main())
