#!/usr/bin/env python
"""Prepare WMT'16 En-De (Europarl v7 + Common Crawl + News Commentary v11; newstest2013 valid,
newstest2014 test; 32k joint vocabulary) as a fairseq_tying data dir.

    python scripts/prepare_wmt16_en_de.py --out data-bin/wmt16-en-de
"""

from __future__ import annotations

import argparse
import sys

from fairseq_tying.data import benchmarks


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benchmarks.add_prepare_args(p, "sentencepiece", "bpe", 32000, "32k joint vocabulary")
    args = p.parse_args(argv)
    work = benchmarks.work_dir(args)
    try:
        for name, url in benchmarks.WMT16_URLS.items():
            archive = benchmarks.download(url, work / name)
            benchmarks.extract_tgz(archive, work / "extracted")
        pairs = benchmarks.build_wmt16_en_de(work / "extracted")
    except (benchmarks.DownloadError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return benchmarks.prepare_pairs(pairs, args, "en", "de")


if __name__ == "__main__":
    sys.exit(main())
