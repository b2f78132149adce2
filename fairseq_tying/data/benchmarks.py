"""Standard benchmarks: download, parse and split IWSLT'14 (De/Es/Ro-En) and WMT'16 En-De.

The splits follow fairseq's ``examples/translation/prepare-iwslt14.sh`` and the WMT'16 En-De
setup of the Transformer papers, but the text stays detokenized (the BLEU references); subwords
and binarization are then done by :mod:`fairseq_tying.data.prepare`'s command line.
"""

from __future__ import annotations

import argparse
import html
import re
import tarfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path

from tqdm import tqdm

from fairseq_tying.common import moses
from fairseq_tying.common.atomic import building_dir, write_lines
from fairseq_tying.data import prepare
from fairseq_tying.data.build import SUBWORDS

IWSLT_URLS = {
    "de-en": "http://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz",
    "es-en": "https://wit3.fbk.eu/archive/2014-01/texts/es/en/es-en.tgz",
    "ro-en": "https://wit3.fbk.eu/archive/2014-01/texts/ro/en/ro-en.tgz",
}
# (valid sets, test sets) from the archive's XML files; None: every 23rd training line is valid.
IWSLT_SETS: dict[str, tuple[list[str] | None, list[str]]] = {
    "de-en": (None, ["TED.dev2010", "TEDX.dev2012", "TED.tst2010", "TED.tst2011", "TED.tst2012"]),
    "es-en": (["TED.dev2010"], ["TED.tst2010", "TED.tst2011", "TED.tst2012"]),
    "ro-en": (["TED.dev2010"], ["TED.tst2010", "TED.tst2011", "TED.tst2012"]),
}
WMT16_URLS = {
    "training-parallel-europarl-v7.tgz": "http://statmt.org/wmt13/training-parallel-europarl-v7.tgz",
    "training-parallel-commoncrawl.tgz": "http://statmt.org/wmt13/training-parallel-commoncrawl.tgz",
    "training-parallel-nc-v11.tgz": (
        "http://data.statmt.org/wmt16/translation-task/training-parallel-nc-v11.tgz"
    ),
    "dev.tgz": "http://data.statmt.org/wmt16/translation-task/dev.tgz",
    "test-full.tgz": "http://statmt.org/wmt14/test-full.tgz",
}
WMT16_TRAIN = (
    "training/europarl-v7.de-en",
    "commoncrawl.de-en",
    "training-parallel-nc-v11/news-commentary-v11.de-en",
)

Pairs = dict[str, tuple[list[str], list[str]]]  # split -> (source lines, target lines)


class DownloadError(RuntimeError):
    pass


def download(url: str, dest: Path, timeout: float = 30.0) -> Path:
    """Fetch ``url`` to ``dest`` (kept if already there); a clear error when offline."""
    dest = Path(dest)
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.part")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, open(tmp, "wb") as f:
            total = int(resp.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=dest.name) as bar:
                while chunk := resp.read(1 << 20):
                    f.write(chunk)
                    bar.update(len(chunk))
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        tmp.unlink(missing_ok=True)
        reason = getattr(e, "reason", e)
        raise DownloadError(
            f"could not download {url} ({reason}). This machine cannot reach it: download the "
            f"file elsewhere and put it at {dest} (or pass it with --archive), then rerun."
        ) from e
    tmp.replace(dest)
    return dest


def extract_tgz(archive: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")


# ---- parsing -------------------------------------------------------------------------------

_DROP_TAG_LINE = ("<url>", "<talkid>", "<keywords>", "<speaker>", "<reviewer", "<translator")
_STRIP_TAGS = re.compile(r"</?(?:title|description)>")
_SEG = re.compile(r"<seg id=\"?\d+\"?>\s*(.*?)\s*</seg>")


def iwslt_train_lines(text: str) -> list[str]:
    """Sentences of an IWSLT ``train.tags`` file, as fairseq's recipe takes them.

    Lines containing ``<url>``, ``<talkid>`` or ``<keywords>`` are dropped; the ``<title>`` and
    ``<description>`` tags are removed and their text is kept as a sentence. Lines of the
    metadata tags of later IWSLT releases (``<speaker>``, ``<reviewer>``, ``<translator>``) are
    dropped too.
    """
    lines = []
    for line in text.splitlines():
        if any(tag in line for tag in _DROP_TAG_LINE):
            continue
        lines.append(_STRIP_TAGS.sub("", line).strip())
    return lines


def seg_lines(text: str) -> list[str]:
    """The ``<seg id=N>`` contents of an IWSLT ``.xml`` or WMT ``.sgm`` file, in order.

    As in fairseq's recipes ’ becomes ', and the XML entities are unescaped.
    """
    segs = []
    for line in text.splitlines():
        m = _SEG.search(line)
        if m:
            segs.append(html.unescape(m.group(1)).replace("\u2019", "'").strip())
    return segs


def clean_pairs(
    src: list[str],
    tgt: list[str],
    ratio: float = 1.5,
    min_len: int = 1,
    max_len: int = 175,
    src_tok: Callable[[str], list[str]] = str.split,
    tgt_tok: Callable[[str], list[str]] = str.split,
) -> tuple[list[str], list[str]]:
    """Moses ``clean-corpus-n.perl``: keep pairs of ``min_len``..``max_len`` tokens a side whose
    token counts differ by at most ``ratio`` times (tokens as ``src_tok``/``tgt_tok`` split)."""
    if len(src) != len(tgt):
        raise ValueError(f"parallel files differ in length: {len(src)} vs {len(tgt)} lines")
    out_s, out_t = [], []
    for s, t in zip(src, tgt, strict=True):
        s, t = " ".join(s.split()), " ".join(t.split())
        ns, nt = len(src_tok(s)), len(tgt_tok(t))
        if not (min_len <= ns <= max_len and min_len <= nt <= max_len):
            continue
        if ns / nt > ratio or nt / ns > ratio:
            continue
        out_s.append(s)
        out_t.append(t)
    return out_s, out_t


def every_nth(lines: list[str], n: int) -> tuple[list[str], list[str]]:
    """(lines kept, every ``n``-th line held out), as ``awk 'NR%n == 0'``."""
    held = [x for i, x in enumerate(lines, 1) if i % n == 0]
    kept = [x for i, x in enumerate(lines, 1) if i % n != 0]
    return kept, held


def _read(path: Path) -> str:
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the extracted archive")
    return path.read_text(encoding="utf-8")


def build_iwslt14(root: Path, pair: str, lowercase: bool = True) -> Pairs:
    """Train/valid/test of an extracted IWSLT'14 archive directory ``root`` (``<pair>/...``)."""
    src, tgt = pair.split("-")
    d = Path(root) / pair
    train = {lang: iwslt_train_lines(_read(d / f"train.tags.{pair}.{lang}")) for lang in (src, tgt)}
    # The recipe cleans after Moses tokenization: count Moses tokens.
    tr_s, tr_t = clean_pairs(
        train[src], train[tgt], 1.5, 1, 175,
        partial(moses.tokens, lang=src), partial(moses.tokens, lang=tgt),
    )
    valid_sets, test_sets = IWSLT_SETS[pair]

    def sets(names: Iterable[str]) -> tuple[list[str], list[str]]:
        s_lines: list[str] = []
        t_lines: list[str] = []
        for name in names:
            s = seg_lines(_read(d / f"IWSLT14.{name}.{pair}.{src}.xml"))
            t = seg_lines(_read(d / f"IWSLT14.{name}.{pair}.{tgt}.xml"))
            if len(s) != len(t):
                raise ValueError(f"IWSLT14.{name}.{pair}: {len(s)} vs {len(t)} segments")
            s_lines += s
            t_lines += t
        return s_lines, t_lines

    if valid_sets is None:
        tr_s, va_s = every_nth(tr_s, 23)
        tr_t, va_t = every_nth(tr_t, 23)
    else:
        va_s, va_t = sets(valid_sets)
    te_s, te_t = sets(test_sets)
    out = {"train": (tr_s, tr_t), "valid": (va_s, va_t), "test": (te_s, te_t)}
    if lowercase:
        out = {k: ([x.lower() for x in s], [x.lower() for x in t]) for k, (s, t) in out.items()}
    return out


def build_wmt16_en_de(root: Path) -> Pairs:
    """WMT'16 En-De from the extracted archives in ``root``: Europarl v7, Common Crawl and
    News Commentary v11 for training (cleaned to 1..250 tokens, ratio 1.5), newstest2013 valid,
    newstest2014 test (the full test set's SGML)."""
    root = Path(root)
    tr_s: list[str] = []
    tr_t: list[str] = []
    for corpus in WMT16_TRAIN:
        s = _read(root / f"{corpus}.en").splitlines()
        t = _read(root / f"{corpus}.de").splitlines()
        s, t = clean_pairs(s, t, max_len=250)
        tr_s += s
        tr_t += t
    va_s = seg_lines(_read(root / "dev" / "newstest2013-src.en.sgm"))
    va_t = seg_lines(_read(root / "dev" / "newstest2013-ref.de.sgm"))
    te_s = seg_lines(_read(root / "test-full" / "newstest2014-deen-src.en.sgm"))
    te_t = seg_lines(_read(root / "test-full" / "newstest2014-deen-ref.de.sgm"))
    for name, s, t in (("newstest2013", va_s, va_t), ("newstest2014", te_s, te_t)):
        if len(s) != len(t) or not s:
            raise ValueError(f"{name}: {len(s)} source vs {len(t)} reference segments")
    return {"train": (tr_s, tr_t), "valid": (va_s, va_t), "test": (te_s, te_t)}


def write_pairs(pairs: Pairs, out: Path, src: str, tgt: str) -> Path:
    """Write ``out/{split}.{src,tgt}`` (a corpus directory for ``prepare --corpus``) atomically."""
    out = Path(out)
    with building_dir(out) as tmp:
        for split, (s, t) in pairs.items():
            for lang, lines in ((src, s), (tgt, t)):
                write_lines(tmp / f"{split}.{lang}", lines)
    return out


def add_prepare_args(p: argparse.ArgumentParser, subword: str, spm_type: str, vocab_size: int,
                     vocab_help: str) -> None:
    """The flags a benchmark script passes on to :func:`prepare.prepare`, with its defaults."""
    p.add_argument("--out", type=Path, required=True, help="the prepared data dir to create")
    p.add_argument("--work", type=Path, help="downloads and plain-text corpus (default OUT.orig)")
    p.add_argument("--subword", choices=SUBWORDS, default=subword)
    p.add_argument("--spm-type", choices=("unigram", "bpe"), default=spm_type)
    p.add_argument("--vocab-size", type=int, default=vocab_size, help=vocab_help)
    p.add_argument("--force", action="store_true")


def work_dir(args: argparse.Namespace) -> Path:
    return args.work or args.out.with_name(args.out.name + ".orig")


def prepare_pairs(pairs: Pairs, args: argparse.Namespace, src: str, tgt: str) -> int:
    """Write the corpus under the work dir, then segment and binarize it into ``--out``."""
    corpus = write_pairs(pairs, work_dir(args) / "corpus", src, tgt)
    print(", ".join(f"{k} {len(s):,}" for k, (s, _) in pairs.items()) + f" pairs -> {corpus}")
    return prepare.prepare(prepare.Prepare(
        corpus=str(corpus), src=src, tgt=tgt, subword=args.subword, spm_type=args.spm_type,
        vocab_size=args.vocab_size, out=str(args.out), force=args.force))
