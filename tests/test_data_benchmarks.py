"""Benchmark parsing, cleaning and splitting on small files in the real IWSLT/WMT formats."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from fairseq_tying.data import benchmarks
from tests.helpers import REPO, load_script

FIXTURES = REPO / "tests" / "fixtures" / "data"
IWSLT = FIXTURES / "iwslt14"
WMT = FIXTURES / "wmt16"


def test_train_tags_follow_fairseqs_recipe():
    text = (IWSLT / "de-en" / "train.tags.de-en.en").read_text(encoding="utf-8")
    lines = benchmarks.iwslt_train_lines(text + "<speaker>Al Gore</speaker>\n")
    assert lines[0] == "Al Gore on averting climate crisis"  # <title> text kept, tags gone
    assert lines[1].startswith("TED Talk Subtitles and Transcript: With humor")
    assert lines[2] == "Thank you so much, Chris."
    assert not any("<" in x or "ted.com" in x or x.startswith("talks,") for x in lines)
    assert len(lines) == 2 * (2 + 12)  # two talks: title, description, 12 sentences each


def test_seg_lines_reads_xml_and_sgml():
    xml = (IWSLT / "de-en" / "IWSLT14.TED.dev2010.de-en.en.xml").read_text(encoding="utf-8")
    assert benchmarks.seg_lines(xml) == ["That's Bill's idea.", "Water & air."]
    sgm = (WMT / "test-full" / "newstest2014-deen-src.en.sgm").read_text(encoding="utf-8")
    assert benchmarks.seg_lines(sgm) == [
        "Safety for pedestrians",  # the headline segment inside <hl>
        "They are not even 100 metres apart.",
        "It's the town's decision.",
    ]


def test_clean_pairs_is_clean_corpus_n():
    src = ["a b c", "a b", "", "a", " x  y ", " ".join("w" * 3 for _ in range(176))]
    tgt = ["a b", "a b c d", "a", "b", "x y z", "w"]
    s, t = benchmarks.clean_pairs(src, tgt)
    # 3:2 = ratio 1.5 kept; 2:4 dropped; empty dropped; spaces normalised; 176 tokens dropped
    assert list(zip(s, t, strict=True)) == [("a b c", "a b"), ("a", "b"), ("x y", "x y z")]
    with pytest.raises(ValueError, match="differ in length"):
        benchmarks.clean_pairs(["a"], [])


def test_every_nth_holds_out_like_awk():
    kept, held = benchmarks.every_nth([str(i) for i in range(1, 50)], 23)
    assert held == ["23", "46"]
    assert len(kept) == 47 and "23" not in kept and kept[0] == "1"


def test_iwslt14_de_en_split():
    pairs = benchmarks.build_iwslt14(IWSLT, "de-en")
    train_s, train_t = pairs["train"]
    # 28 sentence lines; the 1:25-token pair and the empty pair fail cleaning; the 23rd of
    # the remaining 26 is held out for validation
    assert (len(train_s), len(pairs["valid"][0]), len(pairs["test"][0])) == (25, 1, 7)
    assert pairs["valid"] == (
        ["wir haben sie mit kameras gefilmt."],
        ["we filmed them with cameras."],
    )
    assert "ja." not in train_s and "" not in train_s
    # test = dev2010 + dev2012 + tst2010 + tst2011 + tst2012, in that order, lower-cased
    assert pairs["test"][1] == [
        "that's bill's idea.",
        "water & air.",
        "hello world.",
        "i have two questions.",
        "why not?",
        "it is raining.",
        "good night.",
    ]
    cased = benchmarks.build_iwslt14(IWSLT, "de-en", lowercase=False)
    assert cased["train"][1][2] == "Thank you so much, Chris."


def test_iwslt14_missing_file_is_named(tmp_path):
    (tmp_path / "es-en").mkdir()
    with pytest.raises(FileNotFoundError, match=r"train\.tags\.es-en\.es is missing"):
        benchmarks.build_iwslt14(tmp_path, "es-en")


def test_wmt16_en_de_split():
    pairs = benchmarks.build_wmt16_en_de(WMT)
    train_s, train_t = pairs["train"]
    # empty pair, 1:11 and 5:3 token pairs are cleaned away; corpora in the recipe's order
    assert train_s == [
        "Resumption of the session",
        "Please rise, then, for this minute's silence.",
        "Gold prices rose again.",
    ]
    assert train_t[2] == "Der Goldpreis stieg erneut."
    assert pairs["valid"][1] == ["Eine Beispielschlagzeile", "Der Rat tagte am Montag & Dienstag."]
    assert len(pairs["test"][0]) == 3 and pairs["test"][1][0] == "Sicherheit für Fußgänger"


def test_download_failure_is_clear(tmp_path):
    dest = tmp_path / "de-en.tgz"
    with pytest.raises(benchmarks.DownloadError) as err:
        benchmarks.download("http://127.0.0.1:9/de-en.tgz", dest, timeout=5)
    msg = str(err.value)
    assert "could not download http://127.0.0.1:9/de-en.tgz" in msg
    assert str(dest) in msg and "--archive" in msg
    assert list(tmp_path.iterdir()) == []  # no partial file left behind


def test_iwslt_script_offline_message(tmp_path, monkeypatch, capsys):
    script = load_script("prepare_iwslt14")
    monkeypatch.setitem(benchmarks.IWSLT_URLS, "es-en", "http://127.0.0.1:9/es-en.tgz")
    assert script.main(["--pair", "es-en", "--out", str(tmp_path / "d")]) == 1
    err = capsys.readouterr().err
    assert "error: could not download http://127.0.0.1:9/es-en.tgz" in err
    assert not (tmp_path / "d").exists()


def test_wmt_script_offline_message(tmp_path, monkeypatch, capsys):
    script = load_script("prepare_wmt16_en_de")
    monkeypatch.setitem(benchmarks.WMT16_URLS, "dev.tgz", "http://127.0.0.1:9/dev.tgz")
    for name in benchmarks.WMT16_URLS:  # the others are "already downloaded"
        if name != "dev.tgz":
            _tgz(tmp_path / "w" / name, WMT, [])
    assert script.main(["--out", str(tmp_path / "d"), "--work", str(tmp_path / "w")]) == 1
    assert "could not download http://127.0.0.1:9/dev.tgz" in capsys.readouterr().err


def _tgz(path: Path, root: Path, members: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for m in members:
            tar.add(root / m, arcname=m)
    return path


@pytest.mark.slow
def test_iwslt_script_end_to_end_from_archive(tmp_path):
    archive = _tgz(tmp_path / "de-en.tgz", IWSLT, ["de-en"])
    out = tmp_path / "iwslt14-de-en"
    script = load_script("prepare_iwslt14")
    args = ["--pair", "de-en", "--archive", str(archive), "--out", str(out), "--vocab-size", "60"]
    assert script.main(args) == 0
    prep = json.loads((out / "prep.json").read_text())
    assert prep["subword"] == "subword_nmt" and prep["detokenizer"] == "moses"
    assert prep["pairs"] == {"train": 25, "valid": 1, "test": 7}
    assert (out / "raw" / "test.en").read_text().splitlines()[0] == "that's bill's idea."
    assert (out / "bin" / "dict.de.txt").read_text() == (out / "bin" / "dict.en.txt").read_text()
    assert (out / "bin" / "test.de-en.de.bin").stat().st_size > 0


@pytest.mark.slow
def test_wmt_script_end_to_end_from_downloaded_archives(tmp_path):
    work = tmp_path / "w"
    layout = {  # each archive with the paths it holds, as on statmt.org
        "training-parallel-europarl-v7.tgz": [
            "training/europarl-v7.de-en.en",
            "training/europarl-v7.de-en.de",
        ],
        "training-parallel-commoncrawl.tgz": ["commoncrawl.de-en.en", "commoncrawl.de-en.de"],
        "training-parallel-nc-v11.tgz": ["training-parallel-nc-v11"],
        "dev.tgz": ["dev"],
        "test-full.tgz": ["test-full"],
    }
    assert set(layout) == set(benchmarks.WMT16_URLS)
    for name, members in layout.items():
        _tgz(work / name, WMT, members)
    out = tmp_path / "wmt16"
    args = [
        "--out",
        str(out),
        "--work",
        str(work),
        "--subword",
        "subword_nmt",
        "--vocab-size",
        "20",
    ]
    assert load_script("prepare_wmt16_en_de").main(args) == 0
    prep = json.loads((out / "prep.json").read_text())
    assert (prep["src"], prep["tgt"], prep["pairs"]) == (
        "en",
        "de",
        {"train": 3, "valid": 2, "test": 3},
    )
    assert (out / "raw" / "valid.de").read_text().splitlines()[
        1
    ] == "Der Rat tagte am Montag & Dienstag."
