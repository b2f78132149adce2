#!/usr/bin/env python
"""Prepare IWSLT'14 De-En (fairseq's standard split), Es-En or Ro-En (dev2010 valid,
tst2010-2012 test) as a fairseq_tying data dir.

    python scripts/prepare_iwslt14.py --pair de-en --out data-bin/iwslt14-de-en
    python scripts/prepare_iwslt14.py --pair es-en --archive 2014-01.tgz --out data-bin/es-en

De-En is downloaded from fairseq's copy. WIT3's links for Es-En and Ro-En answer 404: download
WIT3's 2014-01.tgz by hand (https://wit3.fbk.eu/2014-01) and pass it with --archive.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fairseq_tying.data import benchmarks


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", choices=sorted(benchmarks.IWSLT_URLS), default="de-en")
    p.add_argument("--archive", type=Path,
                   help="an already downloaded <pair>.tgz, or WIT3's 2014-01.tgz that holds it")
    p.add_argument("--cased", action="store_true", help="keep case (fairseq's recipe lowercases)")
    benchmarks.add_prepare_args(p, "subword_nmt", "unigram", 10000, "10k joint BPE as fairseq")
    args = p.parse_args(argv)
    work = benchmarks.work_dir(args)
    src, tgt = args.pair.split("-")
    try:
        archive = args.archive
        if archive is None:
            url = benchmarks.IWSLT_URLS[args.pair]
            archive = benchmarks.download(url, work / f"{args.pair}.tgz",
                                          by_hand=benchmarks.iwslt_by_hand(args.pair))
        extracted = benchmarks.unpack_iwslt(archive, args.pair, work)
        pairs = benchmarks.build_iwslt14(extracted, args.pair, not args.cased)
    except (benchmarks.DownloadError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return benchmarks.prepare_pairs(pairs, args, src, tgt)


if __name__ == "__main__":
    sys.exit(main())
