"""The embedded Bible corpus: OSIS cleaning, alignment, the split, and byte-identical
regeneration from the real Debian SWORD packages."""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from fairseq_tying.data import bible
from fairseq_tying.data.align import align_book, align_lengths
from fairseq_tying.data.osis import clean_osis, parse_imp
from fairseq_tying.data.recase import undo_drop_caps, word_case_counts
from tests.helpers import run_module

COMMITTED = bible.CORPUS_DIR
W = '<w lemma="strong:H{}">{}</w>'.format


# ---- OSIS cleaning on real snippets of the modules -----------------------------------------


def test_footnote_between_words_leaves_a_space():
    osis = (
        '<w lemma="strong:H3068">Yahweh</w><note placement="foot"><reference type="annotateRef">'
        "2:4 </reference>“Yahweh” is God’s proper Name, sometimes rendered “LORD” (all caps) in "
        'other translations.</note><w lemma="strong:H0430">God</w> <w lemma="strong:H6213">made'
        "</w>"
    )
    assert clean_osis(osis, "Genesis", 2, 4) == "Yahweh God made"


def test_note_before_punctuation_leaves_no_space():
    osis = (
        'spirit<note placement="foot"><reference type="annotateRef">3:17 </reference>Gr. '
        '<rdg type="alternate">demon. </rdg></note>; because it belonged to Tobias'
    )
    assert clean_osis(osis) == "spirit; because it belonged to Tobias"


def test_cross_reference_removed():
    osis = (
        'man <w lemma="strong:H3808">is</w> evaluated,<note type="crossReference"><reference '
        'subType="x-origin" type="annotateRef">12:4 </reference><reference>Exodus 30:12'
        '</reference></note> <w lemma="strong:H2076">and</w> <w lemma="strong:H5750">all</w>'
    )
    assert clean_osis(osis, "II Kings", 12, 4) == "man is evaluated, and all"


def test_speaker_label_removed():
    osis = (
        '<div type="x-milestone" subType="x-preverse" sID="pv8242"/><speaker>Beloved</speaker> '
        '<lg sID="gen15617"/> <l level="1" sID="gen15618"/><div type="x-milestone" '
        'subType="x-preverse" eID="pv8242"/>Let <w lemma="strong:H3588">him</w> kiss '
        '<w lemma="strong:H3588">me</w>'
    )
    assert clean_osis(osis, "Song of Solomon", 1, 2) == "Let him kiss me"


def test_psalm_superscription_kept_and_psalm_119_letters_dropped():
    title = '<title canonical="true" type="psalm">{}</title> <lg sID="g"/> <l level="1" sID="h"/>'
    sup = title.format("A Psalm by David, when he fled from Absalom his son.") + "Yahweh, how"
    assert clean_osis(sup, "Psalms", 3, 1) == (
        "A Psalm by David, when he fled from Absalom his son. Yahweh, how"
    )
    beth_en = title.format("BETH") + W("4100", "How") + " " + W("4100", "can")
    assert clean_osis(beth_en, "Psalms", 119, 9) == "How can"
    beth_es = "BETH ¿" + W("4100", "Con qué") + " " + W("2135", "limpiará")
    assert clean_osis(beth_es, "Psalms", 119, 9) == "¿Con qué limpiará"
    aleph_es = "ALEPH. " + W("0835", "BIENAVENTURADOS") + " " + W("8549", "los perfectos")
    assert clean_osis(aleph_es, "Psalms", 119, 1) == "BIENAVENTURADOS los perfectos"
    # only the headings of the acrostic: a capital word elsewhere stays
    assert clean_osis("HE. " + W("3384", "Enséñame"), "Psalms", 119, 34) == "HE. Enséñame"


def test_glossary_after_revelation_cut():
    osis = (
        '<w lemma="strong:G3956">the</w> saints. Amen.  <chapter eID="Rev.22"/><div '
        'eID="gen35836" type="x-p"/> <div sID="gen35837" type="glossary"/> <title level="1" '
        'type="main">World English Bible Glossary</title> <list> <item subType="x-introduction" '
        'type="x-indent-1"><seg type="keyword">Abaddon</seg> Abaddon is Hebrew for destruction.'
        "</item>"
    )
    assert clean_osis(osis, "Revelation of John", 22, 21) == "the saints. Amen."


def test_red_letters_and_added_words_keep_word_boundaries():
    osis = (
        '<w lemma="strong:G1343">righteousness</w>.”</q><w lemma="strong:G5119">Then</w> '
        '<w lemma="strong:G0846">he</w>'
    )
    assert clean_osis(osis) == "righteousness.” Then he"
    added = (
        '<w lemma="strong:H8033">hay allí</w><transChange type="added">también</transChange>'
        '<w lemma="strong:H0916">bdelio</w>'
    )
    assert clean_osis(added) == "hay allí también bdelio"
    enclitic = (
        '<w lemma="strong:G3992">envía</w><transChange type="added">lo</transChange>'
        '<w lemma="strong:G2033">á las siete</w>'
    )
    assert clean_osis(enclitic) == "envíalo á las siete"


def test_parse_imp_skips_headings_and_introductions():
    imp = (
        "$$$[ Module Heading ]\n\n$$$Genesis 0:0\n<title>Génesis</title>\n"
        '$$$Genesis 1:0\n<chapter n="1"/>\n$$$Genesis 1:1\nEN el principio\n'
        "$$$II Kings 12:4\nline one\nline two\n"
    )
    verses = list(parse_imp(imp))
    assert [(v.book, v.chapter, v.verse) for v in verses] == [
        ("Genesis", 1, 1),
        ("II Kings", 12, 4),
    ]
    assert clean_osis(verses[1].osis) == "line one line two"


def test_drop_caps_recased():
    counts = word_case_counts(["Hiram rey", "Hiram", "aconteció", "los hijos", "ti"])
    assert undo_drop_caps("Y ACONTECIÓ en los días", 1, False, counts) == "Y aconteció en los días"
    assert undo_drop_caps("E HIRAM rey de Tiro", 1, False, counts) == "E Hiram rey de Tiro"
    psalm = "Salmo de David. A TI, oh Jehová, levantaré mi alma."
    assert (
        undo_drop_caps(psalm, 1, True, counts)
        == "Salmo de David. A ti, oh Jehová, levantaré mi alma."
    )
    # inscriptions outside chapter openings stay as written
    assert undo_drop_caps("TEKEL: Pesado has sido", 27, False, counts) == "TEKEL: Pesado has sido"


# ---- alignment -----------------------------------------------------------------------------


def test_alignment_finds_a_shifted_chapter():
    en_len = [120, 40, 200, 80, 150, 60, 180, 90]
    en = [((1, v), "x" * n) for v, n in enumerate(en_len, 1)]
    # the Spanish slot 2 holds English verses 2-3, so its slots 3.. hold English verses 4..
    es = [((1, 1), "x" * 122), ((1, 2), "x" * 245)] + [
        ((1, v - 1), "x" * (n + 3)) for v, n in enumerate(en_len[3:], 4)
    ]
    groups = align_book(es, en, ratio=1.0, var=3.0)
    confirmed = [g.src_keys[0][1] for g in groups if g.confirmed]
    assert confirmed == [1]  # only the first slot pair is the same verse
    pairs = {(g.src_keys, g.tgt_keys) for g in groups if not g.confirmed}
    assert (((1, 2),), ((1, 2), (1, 3))) in pairs  # merged: es slot 2 = en verses 2-3
    assert (((1, 3),), ((1, 4),)) in pairs  # then shifted by one
    assert align_lengths([10, 10], [10, 10], 1.0, 3.0) == [(1, 1), (1, 1)]


# ---- the committed corpus ------------------------------------------------------------------


def _lines(split: str, kind: str, root: Path = COMMITTED) -> list[str]:
    return gzip.decompress((root / f"{split}.{kind}.gz").read_bytes()).decode().splitlines()


def test_committed_split_sizes_and_books():
    sizes = {s: len(_lines(s, "es")) for s in bible.SPLITS}
    assert sizes == {"train": 28637, "valid": 808, "test": 1434}
    for split in bible.SPLITS:
        ids = _lines(split, "ids")
        assert len(ids) == len(_lines(split, "en")) == sizes[split]
        books = {i.rsplit(" ", 1)[0] for i in ids}
        held = set(bible.HELD_OUT.get(split, ()))
        if split == "train":
            assert not books & {b for bs in bible.HELD_OUT.values() for b in bs}
            assert len(books) == 66 - 12
        else:
            assert books == held
            # held-out books hold confirmed single verses only
            assert all(
                "+" not in i and i.split(" ")[-1].split("=")[0] == i.split("=")[1] for i in ids
            )
    # the valid books align completely; Jonah 1:17-2:10 (Hebrew numbering) is dropped from test
    test_ids = set(_lines("test", "ids"))
    assert "Jonah 1:16=1:16" in test_ids and "Jonah 3:1=3:1" in test_ids
    assert not any(i.startswith("Jonah 2:") or i == "Jonah 1:17=1:17" for i in test_ids)


def test_committed_text_is_clean():
    for split in bible.SPLITS:
        for lang in bible.LANGS:
            lines = _lines(split, lang)
            assert all(line and line == " ".join(line.split()) for line in lines)
            assert not any(c in line for line in lines for c in "<>\x00\t")
    en = "\n".join(_lines("train", "en"))
    assert "Glossary" not in en and "Abaddon is Hebrew" not in en
    es = _lines("train", "es")
    assert not any(line.startswith(("ALEPH", "BETH ")) for line in es)
    assert es[0] == "En el principio crió Dios los cielos y la tierra."


def test_realigned_groups_train_only():
    ids = _lines("train", "ids")
    # Numbers 13 in the Spanish module starts with the English 12:16
    assert "Numbers 13:1=12:16" in ids and "Numbers 13:2=13:1" in ids
    groups = [i for i in ids if i.split(" ")[-1].split("=")[0] != i.split("=")[1]]
    assert 60 < len(groups) < 150  # of ~200 misaligned slots, those lengths can vouch for
    kinds = Counter(i.split(" ")[-1].count("+") for i in groups)
    assert kinds[0] > 40 and kinds[1] > 10  # shifted 1-1 and merged 1-2/2-1 groups
    # Acts 8:37 (missing in the English text) would pair with 8:38 on its own: dropped
    assert not any(i.startswith("Acts 8:3") and "=8:38" in i for i in ids)
    # Job 40:4-13: same slots, different verses (the Spanish 40:4 is the English 40:9)
    assert not any(i.startswith(f"Job 40:{v}=") for v in range(4, 14) for i in ids)


def test_committed_checksums_match_readme():
    readme = (COMMITTED / "README.md").read_text()
    assert bible.NAME in readme
    assert "World English Bible" not in readme.replace("World English Bible Glossary", "")
    for path in sorted(COMMITTED.glob("*.gz")):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert f"| {path.name} | `{digest}` |" in readme


@pytest.mark.slow  # runs the tool
def test_extract_cli(tmp_path):
    proc = run_module("fairseq_tying.data.bible", "extract", "--out", tmp_path)
    assert "train 28,637 pairs, valid 808 pairs, test 1,434 pairs" in proc.stdout
    for split in bible.SPLITS:
        for lang in bible.LANGS:
            text = (tmp_path / f"{split}.{lang}").read_text(encoding="utf-8")
            assert text.splitlines() == _lines(split, lang)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"{s}.{lang}" for s in bible.SPLITS for lang in bible.LANGS
    )


def test_regenerate_without_packages_says_what_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bible, "package_version", lambda package: None)
    assert bible.main(["regenerate", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "sword-text-sparv is not installed" in err and "apt-get install" in err
    assert not (tmp_path / "out").exists()


# ---- regeneration from the Debian packages -------------------------------------------------


def _ensure_packages() -> None:
    if shutil.which("mod2imp") and all(
        bible.package_version(p) for p, _ in bible.PACKAGES.values()
    ):
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("the SWORD packages are not installed and installing them needs root and apt")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    pkgs = ["sword-text-sparv", "sword-text-web", "sword-text-kjv", "libsword-utils"]
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *pkgs], check=True, env=env
    )


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> tuple[Path, bible.Corpus]:
    _ensure_packages()
    for pkg, version in bible.PACKAGES.values():
        if bible.package_version(pkg) != version:
            pytest.skip(
                f"{pkg} {bible.package_version(pkg)} is installed, the corpus needs {version}"
            )
    out = tmp_path_factory.mktemp("regen") / "bible-es-en"
    return out, bible.regenerate(out)


@pytest.mark.slow
def test_regeneration_is_byte_identical(regenerated):
    out, _ = regenerated
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(p.name for p in COMMITTED.iterdir())
    for name in names:
        assert (out / name).read_bytes() == (COMMITTED / name).read_bytes(), name


@pytest.mark.slow
def test_regeneration_alignment_statistics(regenerated):
    _, corpus = regenerated
    st = corpus.stats
    assert 30700 < st["confirmed"] < 31000  # ~30.9k confirmed es-en verse pairs
    assert st["dropped_enclosed"] == 10 and st["dropped_lone_shift"] == 3
    assert st["dropped_heldout"] == 11  # Jonah 1:17-2:10
    words = sum(len(es.split()) for rows in corpus.pairs.values() for _, es, _ in rows)
    assert 650_000 < words < 800_000
