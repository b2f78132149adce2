"""Standard benchmarks: download, parse and split IWSLT'14 (De/Es/Ro-En) and WMT'16 En-De.

The splits follow fairseq's ``examples/translation/prepare-iwslt14.sh`` and the WMT'16 En-De
setup of the Transformer papers, but the text stays detokenized (the BLEU references); subwords
and binarization are then done by :mod:`fairseq_tying.data.prepare`'s command line.
"""

from __future__ import annotations

import argparse
import html
import re
import shutil
import tarfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path

from tqdm import tqdm

from fairseq_tying.common import moses
from fairseq_tying.common.atomic import building_dir, split_lines, write_lines
from fairseq_tying.data import prepare
from fairseq_tying.data.build import SUBWORDS

IWSLT_URLS = {
    "de-en": "http://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz",
    "es-en": "https://wit3.fbk.eu/archive/2014-01/texts/es/en/es-en.tgz",
    "ro-en": "https://wit3.fbk.eu/archive/2014-01/texts/ro/en/ro-en.tgz",
}
# The es-en and ro-en links above answer 404 since about December 2020 (fairseq issues #2984,
# #4361): WIT3 serves the 2014-01 texts as one archive, 2014-01.tgz, from this page.
WIT3_2014_01 = "https://wit3.fbk.eu/2014-01"
WIT3_RELEASE = "2014-01"
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


def download(url: str, dest: Path, timeout: float = 30.0, by_hand: str | None = None) -> Path:
    """Fetch ``url`` to ``dest`` (kept if already there); a clear error when offline or when
    the server has no such file, ending with ``by_hand`` (how to get the file another way)
    or, without it, with where to put a copy fetched elsewhere."""
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
        if isinstance(e, urllib.error.HTTPError):
            why = f"the server answered HTTP {e.code} {e.reason}: the file is not there"
        else:
            why = f"{getattr(e, 'reason', e)}; this machine cannot reach it"
        then = by_hand or (f"Download the file elsewhere and put it at {dest} (or pass it with "
                           "--archive), then rerun.")
        raise DownloadError(f"could not download {url} ({why}). {then}") from e
    tmp.replace(dest)
    return dest


def iwslt_by_hand(pair: str) -> str | None:
    """How to get a pair's IWSLT'14 archive whose link is dead (None for de-en: fairseq's
    copy)."""
    if pair == "de-en":
        return None
    return (f"WIT3 serves the {WIT3_RELEASE} texts as one archive now: download "
            f"{WIT3_RELEASE}.tgz by hand from {WIT3_2014_01} and rerun with --archive "
            f"PATH/{WIT3_RELEASE}.tgz (the {pair} archive inside it, "
            f"{wit3_member(pair)}, is read; that {pair}.tgz alone works too).")


def wit3_member(pair: str) -> str:
    """Where WIT3's release archive holds a pair's archive: ``2014-01/texts/es/en/es-en.tgz``."""
    src, tgt = pair.split("-")
    return f"{WIT3_RELEASE}/texts/{src}/{tgt}/{pair}.tgz"


def extract_tgz(archive: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")


def unpack_iwslt(archive: Path, pair: str, work: Path) -> Path:
    """Extract ``pair``'s IWSLT files from ``archive`` into ``work/extracted/<pair>/``, and
    return ``work/extracted``. ``archive`` is the pair's own archive (``<pair>/...``, as
    fairseq's de-en.tgz) or WIT3's release archive holding it (``2014-01.tgz`` with
    ``2014-01/texts/<src>/<tgt>/<pair>.tgz``, taken out to ``work/<pair>.tgz`` first)."""
    archive, dest = Path(archive), Path(work) / "extracted"
    if not archive.is_file():
        raise FileNotFoundError(f"--archive {archive} does not exist")
    try:
        with tarfile.open(archive) as tar:
            names = tar.getnames()
            if any(n == pair or n.startswith(f"{pair}/") for n in names):
                dest.mkdir(parents=True, exist_ok=True)
                tar.extractall(dest, filter="data")
                return dest
            inner = _copy_member(tar, _inner_archive(tar, names, archive, pair),
                                 Path(work) / f"{pair}.tgz")
        extract_tgz(inner, dest)
    except tarfile.TarError as e:
        why = str(e).splitlines()[0].rstrip(":")
        raise ValueError(f"{archive} is not a readable .tgz ({why}); a download that gave a web "
                         "page instead of the archive is one cause: delete it and fetch the "
                         f"archive by hand from {iwslt_source(pair)}") from e
    return dest


def iwslt_source(pair: str) -> str:
    """Where a person gets ``pair``'s archive: fairseq's link for de-en, WIT3's page else."""
    return IWSLT_URLS[pair] if pair == "de-en" else WIT3_2014_01


def _inner_archive(tar: tarfile.TarFile, names: list[str], archive: Path, pair: str
                   ) -> tarfile.TarInfo:
    """The member of a WIT3 release archive that is ``pair``'s archive; an error naming the
    missing pair, and the pairs it holds, when there is none."""
    want = wit3_member(pair).split("/", 1)[1]  # texts/es/en/es-en.tgz, under any top folder
    found = [n for n in names if n == want or n.endswith(f"/{want}")]
    if found:
        return tar.getmember(found[0])
    held = sorted({m.group(1) for n in names
                   if (m := re.search(r"(?:^|/)texts/[^/]+/[^/]+/([^/]+)\.tgz$", n))})
    holds = (f"the pair archives {', '.join(held)}" if held else
             f"the entries {', '.join(sorted({n.split('/')[0] for n in names})[:10])}")
    raise ValueError(f"--archive {archive} holds no {pair} archive: neither {pair}/ (the pair's "
                     f"own archive) nor {wit3_member(pair)} (WIT3's {WIT3_RELEASE}.tgz); it "
                     f"holds {holds}. Pass the archive of {pair} (from {iwslt_source(pair)}) or "
                     "choose one of those with --pair.")


def _copy_member(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: Path) -> Path:
    """Copy a file member of ``tar`` to ``dest`` (atomically)."""
    source = tar.extractfile(member)
    if source is None:
        raise ValueError(f"{member.name} in the archive is not a file")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.part")
    with source, open(tmp, "wb") as f:
        shutil.copyfileobj(source, f, 1 << 20)
    tmp.replace(dest)
    return dest


# ---- parsing -------------------------------------------------------------------------------

# fairseq's prepare-iwslt14.sh: grep -v these lines, sed the title/description tags away
_DROP_TAG_LINE = ("<url>", "<talkid>", "<keywords>")
_STRIP_TAGS = re.compile(r"</?(?:title|description)>")
_SEG = re.compile(r"<seg id=\"?\d+\"?>\s*(.*?)\s*</seg>")


def iwslt_train_lines(text: str) -> list[str]:
    """Sentences of an IWSLT ``train.tags`` file, as fairseq's recipe takes them.

    Lines containing ``<url>``, ``<talkid>`` or ``<keywords>`` are dropped; the ``<title>`` and
    ``<description>`` tags are removed and their text is kept as a sentence. Every other line is
    kept, as in the recipe: the ``<speaker>``, ``<reviewer ...>`` and ``<translator ...>``
    lines too (one line more or less would move every later line between train and valid).
    """
    lines = []
    for line in split_lines(text):
        if any(tag in line for tag in _DROP_TAG_LINE):
            continue
        lines.append(_STRIP_TAGS.sub("", line).strip())
    return lines


def seg_lines(text: str) -> list[str]:
    """The ``<seg id=N>`` contents of an IWSLT ``.xml`` or WMT ``.sgm`` file, in order.

    As in fairseq's recipes ’ becomes ', and the XML entities are unescaped.
    """
    segs = []
    for line in split_lines(text):
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
    """The file's text as it is (no line breaks translated; ``split_lines`` breaks it)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the extracted archive")
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


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
        s = split_lines(_read(root / f"{corpus}.en"))
        t = split_lines(_read(root / f"{corpus}.de"))
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
