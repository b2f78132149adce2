"""The embedded Bible es-en corpus (RV1909 / WEB-derived): regeneration from Debian's SWORD
modules, its held-out-book split, and extraction of the committed copy.

    python -m fairseq_tying.data.bible regenerate --out DIR   # needs the Debian packages
    python -m fairseq_tying.data.bible extract --out DIR      # the committed corpus, plain text
    python -m fairseq_tying.data.bible overlap --out FILE     # held-out verses repeated in train
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from fairseq_tying.common.atomic import building_dir, write_json, write_lines
from fairseq_tying.data import overlap
from fairseq_tying.data.align import Group, align_book, length_stats, length_z
from fairseq_tying.data.osis import clean_osis, parse_imp
from fairseq_tying.data.recase import undo_drop_caps, word_case_counts

NAME = "Bible es-en, RV1909 / WEB-derived"
CORPUS_DIR = Path(__file__).resolve().parent / "corpus" / "bible-es-en"
SPLITS = ("train", "valid", "test")
LANGS = ("es", "en")
MODULES = {"es": "spaRV1909eb", "en": "engWEB2015eb"}
PACKAGES = {"es": ("sword-text-sparv", "2.60-1"), "en": ("sword-text-web", "426.0-1")}
APT_HINT = (
    "install them as root with: apt-get install --no-install-recommends "
    "sword-text-sparv sword-text-web libsword-utils (or scripts/install_system_packages.sh)"
)
# Held-out books (SWORD's English book names): a verse is in one split only; a parallel passage
# in another book can still repeat it (python -m fairseq_tying.data.bible overlap measures it).
HELD_OUT = {
    "test": ("Ruth", "Ecclesiastes", "Jonah", "John", "James", "I John"),
    "valid": ("Esther", "Joel", "Habakkuk", "Philippians", "Hebrews", "I Peter"),
}
# Training-only groups (misaligned verse slots realigned by length) must fit this well.
MAX_GROUP_Z = 2.5
# Fewer confirmed pairs than this between two renumbered places are not trusted.
MIN_TRUSTED_RUN = 12
GZIP_MTIME = 0  # fixed gzip header time: the compressed files are byte-reproducible

Key = tuple[int, int]  # (chapter, verse)


def split_of(book: str) -> str:
    for split, books in HELD_OUT.items():
        if book in books:
            return split
    return "train"


@dataclass
class Corpus:
    """Aligned pairs per split with their verse ids, plus alignment statistics."""

    pairs: dict[str, list[tuple[str, str, str]]] = field(
        default_factory=lambda: {s: [] for s in SPLITS}
    )  # split -> [(id, es, en)]
    stats: Counter = field(default_factory=Counter)


def dump_module(module: str) -> str:
    """The ``mod2imp`` dump of an installed SWORD module."""
    if shutil.which("mod2imp") is None:
        raise RuntimeError(f"mod2imp (Debian package libsword-utils) is not installed; {APT_HINT}")
    proc = subprocess.run(["mod2imp", module], capture_output=True)
    text = proc.stdout.decode("utf-8")
    if proc.returncode != 0 or "$$$" not in text:
        raise RuntimeError(f"mod2imp could not read the SWORD module {module}; {APT_HINT}")
    return text


def package_version(package: str) -> str | None:
    proc = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def clean_module(imp: str, drop_caps: bool = False) -> dict[str, list[tuple[Key, str]]]:
    """Book -> non-empty cleaned verses in order (``drop_caps``: recase chapter openings)."""
    books: dict[str, list[tuple[Key, str]]] = {}
    for v in parse_imp(imp):
        text = clean_osis(v.osis, v.book, v.chapter, v.verse)
        if text:
            books.setdefault(v.book, []).append(((v.chapter, v.verse), text))
    if drop_caps:
        counts = word_case_counts(t for verses in books.values() for _, t in verses)
        for book, verses in books.items():
            psalm = book == "Psalms"
            verses[:] = [(k, undo_drop_caps(t, k[1], psalm, counts)) for k, t in verses]
    return books


def _ref(book: str, src: tuple[Key, ...], tgt: tuple[Key, ...]) -> str:
    """``Book C:V=C:V``: the Spanish and the English verse slots of a line."""
    slots = ["+".join(f"{c}:{v}" for c, v in keys) for keys in (src, tgt)]
    return f"{book} {slots[0]}={slots[1]}"


def build(es_imp: str, en_imp: str) -> Corpus:
    """Clean both dumps, align each book by length and split by held-out books."""
    es, en = clean_module(es_imp, drop_caps=True), clean_module(en_imp)
    books = [b for b in es if b in en]  # the Spanish module's book order (protocanon)
    en_text = {b: dict(en[b]) for b in books}
    same_slot = [(t, en_text[b][k]) for b in books for k, t in es[b] if k in en_text[b]]
    ratio, var = length_stats(same_slot)
    corpus = Corpus()
    for book in books:
        split = split_of(book)
        es_text = dict(es[book])
        groups = align_book(es[book], en[book], ratio, var)
        lone = _lone_shifts(groups, es[book], en[book])
        enclosed = _enclosed_runs(groups)
        for g, alone, inside in zip(groups, lone, enclosed, strict=True):
            if inside:
                kind = "dropped_enclosed"
            else:
                kept = "dropped_lone_shift" if alone else "group"
                kind = _group_kind(g, split, es_text, en_text[book], ratio, var, kept)
            corpus.stats[kind] += 1
            if kind in ("confirmed", "group"):
                src = " ".join(es_text[k] for k in g.src_keys)
                tgt = " ".join(en_text[book][k] for k in g.tgt_keys)
                corpus.pairs[split].append((_ref(book, g.src_keys, g.tgt_keys), src, tgt))
    corpus.stats["ratio_x1000"] = round(ratio * 1000)
    return corpus


def _enclosed_runs(groups: list[Group]) -> list[bool]:
    """Which confirmed pairs sit in a short run between two renumbered places.

    Between two places where the slots disagree (Job 40:3 and 40:14), same-numbered verses of
    poetry can match in length by chance while holding different verses.
    """
    renumbered = [not g.confirmed and g.src_keys != g.tgt_keys for g in groups]
    flags = [False] * len(groups)
    i = 0
    while i < len(groups):
        j = i
        while j < len(groups) and groups[j].confirmed:
            j += 1
        if j > i and 0 < i and j < len(groups) and j - i < MIN_TRUSTED_RUN:
            if renumbered[i - 1] and renumbered[j]:
                flags[i:j] = [True] * (j - i)
        i = max(j, i + 1)
    return flags


def _lone_shifts(
    groups: list[Group], es: list[tuple[Key, str]], en: list[tuple[Key, str]]
) -> list[bool]:
    """Which groups pair one verse with one other-numbered verse on their own.

    A real renumbering shifts a run of verses; a lone shifted pair sits next to a verse that one
    text lacks (Acts 8:37) and is the length alignment's guess.
    """
    es_pos = {k: i for i, (k, _) in enumerate(es)}
    en_pos = {k: i for i, (k, _) in enumerate(en)}

    def offset(g: Group) -> int | None:
        one_one = len(g.src_keys) == len(g.tgt_keys) == 1 and not g.confirmed
        if not one_one or abs(g.z) > MAX_GROUP_Z:
            return None
        return en_pos[g.tgt_keys[0]] - es_pos[g.src_keys[0]]

    offs = [offset(g) for g in groups]
    lone = []
    for i, off in enumerate(offs):
        neighbours = offs[max(i - 1, 0) : i] + offs[i + 1 : i + 2]
        lone.append(off is not None and off not in neighbours)
    return lone


def _group_kind(
    g: Group,
    split: str,
    es: dict[Key, str],
    en: dict[Key, str],
    ratio: float,
    var: float,
    kept: str = "group",
) -> str:
    if g.confirmed:
        return "confirmed"
    if not g.src_keys or not g.tgt_keys:
        return "dropped_unmatched"
    if split != "train":
        return "dropped_heldout"
    if abs(g.z) > MAX_GROUP_Z:
        return "dropped_length"
    if g.src_keys != g.tgt_keys and all(k in en for k in g.src_keys):
        # Lengths must rule out the plain same-slot reading of these Spanish verses, or the
        # shift is a guess (verses of even length, as in poetry, fit either way).
        ls = sum(len(es[k]) for k in g.src_keys)
        lt = sum(len(en[k]) for k in g.src_keys)
        if abs(length_z(ls, lt, ratio, var)) <= MAX_GROUP_Z:
            return "dropped_ambiguous"
    return kept


def _gzip_bytes(lines: list[str]) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=GZIP_MTIME, compresslevel=9) as f:
        f.write("".join(line + "\n" for line in lines).encode("utf-8"))
    return buf.getvalue()


def write_corpus(corpus: Corpus, out: Path, versions: dict[str, str | None]) -> None:
    """Write ``{split}.{es,en,ids}.gz`` and README.md into ``out``, replacing it atomically."""
    with building_dir(out) as tmp:
        sums: dict[str, str] = {}
        for split in SPLITS:
            rows = corpus.pairs[split]
            for suffix, col in (("ids", 0), ("es", 1), ("en", 2)):
                name = f"{split}.{suffix}.gz"
                data = _gzip_bytes([r[col] for r in rows])
                (tmp / name).write_bytes(data)
                sums[name] = hashlib.sha256(data).hexdigest()
        (tmp / "README.md").write_text(provenance(corpus, sums, versions), encoding="utf-8")


def provenance(corpus: Corpus, sums: dict[str, str], versions: dict[str, str | None]) -> str:
    st = corpus.stats
    sizes = " / ".join(f"{len(corpus.pairs[s]):,} {s}" for s in SPLITS)
    lines = [
        f"# {NAME}",
        "",
        "Verse-aligned Spanish-English Bible text, cleaned from the Debian packages "
        f"`{PACKAGES['es'][0]}` {versions.get('es')} (SWORD module {MODULES['es']}: Reina-Valera "
        f"1909) and `{PACKAGES['en'][0]}` {versions.get('en')} (SWORD module {MODULES['en']}: an "
        "English public-domain translation). Both texts are in the public domain; the English "
        "text here is modified (notes, headings and glossary removed), so it is not called by "
        "the English module's trademarked name.",
        "",
        "Cleaning: footnotes, cross references and speaker labels removed, remaining OSIS "
        "tags stripped, the glossary after Revelation 22:21 and the Hebrew-letter headings of "
        "Psalm 119 dropped, psalm superscriptions kept, the Spanish drop capitals that open "
        "chapters recased. Each book is aligned by verse length (Gale & Church); same-slot "
        "1-1 verse pairs are confirmed, realigned slots and merged groups go to training only. "
        "Held-out books: test = "
        + ", ".join(HELD_OUT["test"])
        + "; valid = "
        + ", ".join(HELD_OUT["valid"])
        + ".",
        "",
        "Regenerate with `python -m fairseq_tying.data.bible regenerate --out DIR`; "
        "read with `python -m fairseq_tying.data.bible extract --out DIR`.",
        "",
        f"Pairs: {sizes}. Alignment groups: {st['confirmed']:,} confirmed verse pairs, "
        f"{st['group']:,} realigned groups (training only), dropped: "
        f"{st['dropped_heldout']:,} unconfirmed in held-out books, "
        f"{st['dropped_length']:,} with mismatched lengths, "
        f"{st['dropped_ambiguous']:,} whose same-slot reading fits as well, "
        f"{st['dropped_lone_shift']:,} lone shifted pairs, "
        f"{st['dropped_enclosed']:,} same-slot pairs enclosed by renumbered places, "
        f"{st['dropped_unmatched']:,} verse slots with no counterpart.",
        "",
        "`{split}.ids.gz` names each line's verses: `Book C:V=C:V` "
        "(Spanish slots = English slots).",
        "",
        "| file | sha256 |",
        "|---|---|",
        *(f"| {name} | `{digest}` |" for name, digest in sorted(sums.items())),
        "",
    ]
    return "\n".join(lines)


def regenerate(out: Path) -> Corpus:
    versions = {lang: package_version(pkg) for lang, (pkg, _) in PACKAGES.items()}
    for lang, (pkg, expected) in PACKAGES.items():
        if versions[lang] is None:
            raise RuntimeError(f"Debian package {pkg} is not installed; {APT_HINT}")
        if versions[lang] != expected:
            print(
                f"warning: {pkg} is {versions[lang]}, the committed corpus was built from "
                f"{expected}; the output will differ from it",
                file=sys.stderr,
            )
    corpus = build(dump_module(MODULES["es"]), dump_module(MODULES["en"]))
    write_corpus(corpus, out, versions)
    return corpus


def read_split(split: str, lang: str, corpus_dir: Path = CORPUS_DIR) -> list[str]:
    """Lines of one side of one split of a corpus directory written by ``regenerate``."""
    path = Path(corpus_dir) / f"{split}.{lang}.gz"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the committed Bible corpus is incomplete")
    return gzip.decompress(path.read_bytes()).decode("utf-8").splitlines()


def books(split: str, corpus_dir: Path = CORPUS_DIR) -> list[str]:
    """Each line's book in one split (its verse id ``Book C:V=C:V`` less the verses)."""
    return [line.rsplit(" ", 1)[0] for line in read_split(split, "ids", corpus_dir)]


def extract(out: Path, corpus_dir: Path = CORPUS_DIR) -> dict[str, int]:
    """Write the committed corpus as plain ``out/{split}.{es,en}``; return the split sizes."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sizes = {}
    for split in SPLITS:
        sides = {lang: read_split(split, lang, corpus_dir) for lang in LANGS}
        if len(sides["es"]) != len(sides["en"]):
            raise ValueError(f"{corpus_dir}: {split}.es and {split}.en differ in length")
        sizes[split] = len(sides["es"])
        for lang, lines in sides.items():
            write_lines(out / f"{split}.{lang}", lines)
    return sizes


OVERLAP_COMMAND = "python -m fairseq_tying.data.bible overlap --out docs/data/overlap.json"


def overlap_report(corpus_dir: Path = CORPUS_DIR, top: int = 10) -> dict:
    """Each held-out split's sentences against the training ones, per language: how many share
    at least half (and 80 %) of their word 4-grams with one training sentence, and the ``top``
    closest pairs (:mod:`.overlap`)."""
    train_ids = read_split("train", "ids", corpus_dir)
    report: dict = {"command": OVERLAP_COMMAND, "n": overlap.N, "method": overlap.METHOD,
                    "splits": {split: {} for split in ("test", "valid")}}
    for lang in ("en", "es"):  # the target side first: what the metrics score
        train = read_split("train", lang, corpus_dir)
        postings = overlap.index(train)
        for split, by_lang in report["splits"].items():
            heldout = read_split(split, lang, corpus_dir)
            by_lang[lang] = overlap.summary(overlap.closest(heldout, postings),
                                            read_split(split, "ids", corpus_dir), train_ids,
                                            heldout, train, top)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fairseq_tying.data.bible", description=NAME)
    sub = parser.add_subparsers(dest="command", required=True)
    reg = sub.add_parser("regenerate", help="rebuild the corpus from the Debian SWORD packages")
    reg.add_argument("--out", type=Path, required=True, help="directory to (re)write")
    ext = sub.add_parser("extract", help="write the committed corpus as plain text")
    ext.add_argument("--out", type=Path, required=True, help="directory for {split}.{es,en}")
    ovl = sub.add_parser("overlap", help="the held-out sentences' closest training sentences "
                                         "by shared word 4-grams, as JSON")
    ovl.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    ovl.add_argument("--top", type=int, default=10, help="closest pairs listed per split and "
                                                          "language (default 10)")
    args = parser.parse_args(argv)
    try:
        if args.command == "overlap":
            return _overlap(args.out, args.top)
        if args.command == "regenerate":
            corpus = regenerate(args.out)
            sizes = {s: len(corpus.pairs[s]) for s in SPLITS}
        else:
            sizes = extract(args.out)
    except (RuntimeError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{NAME} -> {args.out}: " + ", ".join(f"{s} {n:,} pairs" for s, n in sizes.items()))
    return 0


def _overlap(out: Path, top: int) -> int:
    report = overlap_report(top=top)
    write_json(out, report)
    for split, langs in report["splits"].items():
        for lang, r in langs.items():
            counts = ", ".join(f">= {t}: {k}" for t, k in r["at_least"].items())
            print(f"{split}.{lang}: {r['sentences']} sentences ({r['short']} of < "
                  f"{overlap.N} words); sharing with one training sentence {counts}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
