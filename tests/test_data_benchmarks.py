"""Benchmark parsing, cleaning and splitting on small files in the real IWSLT/WMT formats."""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fairseq_tying.common.atomic import split_lines
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
    assert not any("ted.com" in x or x.startswith("talks,") for x in lines)
    # two talks: title, description, 12 sentences each; the recipe keeps the <speaker> line
    assert len(lines) == 2 * (2 + 12) + 1 and lines[-1] == "<speaker>Al Gore</speaker>"


def test_split_lines_break_at_newline_only():
    text = "a\x85b\nc\u2028d\r\ne\x1cf\x0bg\rh\n\nlast"
    assert split_lines(text) == ["a\x85b", "c\u2028d", "e\x1cf\x0bg\rh", "", "last"]
    assert split_lines("x\n") == ["x"] and split_lines("") == []
    assert len(text.splitlines()) == 10  # what str.splitlines would have made of it


# ---- a synthetic IWSLT'14 archive with the metadata lines fairseq's recipe keeps ----------

TALKS, SENTENCES = 2, 20
RECIPE = ("grep -v '<url>' | grep -v '<talkid>' | grep -v '<keywords>' | "
          "sed -e 's/<title>//g' | sed -e 's/<\\/title>//g' | "
          "sed -e 's/<description>//g' | sed -e 's/<\\/description>//g'")


def _train_tags(lang: str) -> str:
    """Two talks in the 2014-01 train.tags layout, <speaker>, <reviewer> and <translator> lines
    included; sentence i of talk k says "k.i" on both sides, one en line holds \\x85 and one
    \\u2028, one de line a lone \\r, and the de file ends its lines with \\r\\n."""
    word = {"en": ("Talk", "sentence", "is here"), "de": ("Vortrag", "Satz", "ist hier")}[lang]
    lines = []
    for k in range(1, TALKS + 1):
        lines += [f"<url>http://www.ted.com/talks/talk{k}.html</url>",
                  "<keywords>talks, science</keywords>",
                  f"<speaker>Speaker {k}</speaker>",
                  f"<talkid>{k}</talkid>",
                  f"<title>{word[0]} {k}: a title</title>",
                  f"<description>TED Talk Subtitles and Transcript: {word[0]} {k}.</description>",
                  f'<reviewer href="http://www.ted.com/profiles/{k}">Reviewer {k}</reviewer>',
                  f'<translator href="http://ted.com/profiles/{k}0">Translator {k}</translator>']
        lines += [f"{word[0]} {k} {word[1]} {k}.{i} {word[2]}." for i in range(1, SENTENCES + 1)]
    if lang == "en":
        lines[10] = lines[10].replace(" is ", " \x85 is ")
        lines[40] = lines[40].replace(" is ", " \u2028 is ")
        return "".join(line + "\n" for line in lines)
    lines[20] = lines[20].replace(" ist ", " \r ist ")
    return "".join(line + "\r\n" for line in lines)


def _iwslt_dir(root: Path, pair: str = "de-en") -> Path:
    """``root/<pair>/``: the synthetic train.tags and the fixture's dev and test sets."""
    d = root / pair
    d.mkdir(parents=True)
    for f in (IWSLT / "de-en").glob("IWSLT14.*.xml"):
        shutil.copy(f, d / f.name.replace("de-en.de", f"{pair}.{pair[:2]}")
                    .replace("de-en", pair))
    for lang, side in zip(pair.split("-"), ("de", "en"), strict=True):
        with open(d / f"train.tags.{pair}.{lang}", "w", encoding="utf-8", newline="") as f:
            f.write(_train_tags(side))
    return d


def _recipe_split(path: Path) -> tuple[list[str], list[str]]:
    """(train, valid) of fairseq's shell pipeline on ``path`` (no tokenizer: every synthetic
    pair passes the recipe's cleaning), whitespace runs made one space as Moses makes them."""
    def run(keep: str) -> list[str]:
        cmd = f"cat '{path}' | {RECIPE} | awk '{{if (NR%23 {keep} 0) print $0; }}'"
        out = subprocess.run(["bash", "-c", cmd], capture_output=True, check=True).stdout
        return [" ".join(x.split()) for x in split_lines(out.decode())]

    return run("!="), run("==")


@pytest.mark.skipif(not all(map(shutil.which, ("bash", "grep", "sed", "awk"))),
                    reason="needs the shell tools of fairseq's recipe")
def test_iwslt14_split_is_fairseqs_recipe_line_for_line(tmp_path):
    """The recipe keeps the <speaker>/<reviewer>/<translator> lines: the 23rd and 46th of the
    50 lines it keeps are valid. Dropping them (3 a talk) would leave 44 lines and one valid
    line, and a break at \\x85, \\u2028 or the lone \\r would pair k.i with k.(i+1)."""
    d = _iwslt_dir(tmp_path)
    pairs = benchmarks.build_iwslt14(tmp_path, "de-en", lowercase=False)
    (tr_de, tr_en), (va_de, va_en) = pairs["train"], pairs["valid"]
    assert (len(tr_en), len(va_en)) == (48, 2)
    assert (tr_en, va_en) == _recipe_split(d / "train.tags.de-en.en")
    assert (tr_de, va_de) == _recipe_split(d / "train.tags.de-en.de")
    # per talk 5 metadata lines kept (speaker, title, description, reviewer, translator), then
    # 20 sentences: line 23 is talk 1's 18th sentence, line 46 talk 2's 16th
    assert va_en == ["Talk 1 sentence 1.18 is here.", "Talk 2 sentence 2.16 is here."]
    assert tr_en[0] == "<speaker>Speaker 1</speaker>" and tr_de[0] == tr_en[0]
    assert tr_en[3].startswith("<reviewer href=") and tr_en[4].startswith("<translator href=")
    for de, en in zip(tr_de + va_de, tr_en + va_en, strict=True):
        assert de.split()[1:4:2] == en.split()[1:4:2], (de, en)  # talk k, sentence k.i
    assert len(pairs["test"][0]) == 7


# ---- archives: the pair's own, WIT3's 2014-01.tgz holding it -----------------------------


def _tar_dir(path: Path, root: Path, member: str) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        tar.add(root / member, arcname=member)
    return path


def _wit3_release(tmp_path: Path, pairs: tuple[str, ...]) -> Path:
    """A small 2014-01.tgz: ``2014-01/texts/<src>/<tgt>/<pair>.tgz`` per pair."""
    release = tmp_path / "release"
    for pair in pairs:
        inner = release / benchmarks.wit3_member(pair)
        inner.parent.mkdir(parents=True)
        _tar_dir(inner, _iwslt_dir(tmp_path / "pairs", pair).parent, pair)
    return _tar_dir(tmp_path / "2014-01.tgz", release, "2014-01")


def test_unpack_reads_the_pair_archive_inside_wit3s_release(tmp_path):
    outer = _wit3_release(tmp_path, ("es-en", "ro-en"))
    work = tmp_path / "work"
    extracted = benchmarks.unpack_iwslt(outer, "es-en", work)
    assert sorted(p.name for p in extracted.iterdir()) == ["es-en"]
    assert (work / "es-en.tgz").is_file()  # the inner archive, taken out once
    pairs = benchmarks.build_iwslt14(extracted, "es-en")
    # no hold-out from train; valid = dev2010 (2 segments), test = tst2010-2012 (2 + 1 + 1)
    assert [len(pairs[k][0]) for k in ("train", "valid", "test")] == [50, 2, 4]
    assert pairs["train"][0][0] == "<speaker>speaker 1</speaker>"
    # the same pair from its own archive, the other layout
    own = benchmarks.unpack_iwslt(work / "es-en.tgz", "es-en", tmp_path / "work2")
    assert benchmarks.build_iwslt14(own, "es-en") == pairs


def test_unpack_names_the_missing_pair(tmp_path):
    outer = _wit3_release(tmp_path, ("es-en",))
    with pytest.raises(ValueError) as err:
        benchmarks.unpack_iwslt(outer, "ro-en", tmp_path / "work")
    msg = str(err.value)
    assert f"--archive {outer} holds no ro-en archive" in msg
    assert "2014-01/texts/ro/en/ro-en.tgz" in msg and "the pair archives es-en" in msg
    assert not (tmp_path / "work" / "extracted").exists()
    page = tmp_path / "2014-01.html"
    page.write_text("<html>a download page</html>")
    with pytest.raises(ValueError, match=r"not a readable \.tgz .*https://wit3\.fbk\.eu/2014-01"):
        benchmarks.unpack_iwslt(page, "es-en", tmp_path / "work")
    with pytest.raises(FileNotFoundError, match="--archive .*missing.tgz does not exist"):
        benchmarks.unpack_iwslt(tmp_path / "missing.tgz", "es-en", tmp_path / "work")


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


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base class's name)
        pass


@pytest.fixture
def local_server(tmp_path) -> Iterator[tuple[str, Path]]:
    """An HTTP server on 127.0.0.1 serving a folder: (its base URL, the folder)."""
    root = tmp_path / "served"
    root.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_download_fetches_and_keeps(tmp_path, local_server):
    base, root = local_server
    (root / "de-en.tgz").write_bytes(b"archive bytes")
    dest = benchmarks.download(f"{base}/de-en.tgz", tmp_path / "w" / "de-en.tgz", timeout=5)
    assert dest.read_bytes() == b"archive bytes"
    (root / "de-en.tgz").unlink()  # a second call keeps the file it has
    again = benchmarks.download(f"{base}/de-en.tgz", dest, timeout=5)
    assert again.read_bytes() == b"archive bytes"


def test_dead_wit3_link_says_where_to_download_by_hand(tmp_path, monkeypatch, capsys,
                                                        local_server):
    base, _ = local_server
    url = f"{base}/archive/2014-01/texts/ro/en/ro-en.tgz"  # answers 404, as WIT3's does
    monkeypatch.setitem(benchmarks.IWSLT_URLS, "ro-en", url)
    script = load_script("prepare_iwslt14")
    assert script.main(["--pair", "ro-en", "--out", str(tmp_path / "d")]) == 1
    err = capsys.readouterr().err
    assert f"error: could not download {url} (the server answered HTTP 404" in err
    assert "https://wit3.fbk.eu/2014-01" in err and "--archive PATH/2014-01.tgz" in err
    assert "2014-01/texts/ro/en/ro-en.tgz" in err
    assert not (tmp_path / "d").exists() and not (tmp_path / "d.orig" / "ro-en.tgz").exists()


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
def test_iwslt_script_end_to_end_from_wit3s_release(tmp_path):
    outer = _wit3_release(tmp_path, ("es-en", "ro-en"))
    out = tmp_path / "iwslt14-ro-en"
    args = ["--pair", "ro-en", "--archive", str(outer), "--out", str(out), "--vocab-size", "60"]
    assert load_script("prepare_iwslt14").main(args) == 0
    prep = json.loads((out / "prep.json").read_text())
    assert (prep["src"], prep["tgt"]) == ("ro", "en")
    assert prep["pairs"] == {"train": 50, "valid": 2, "test": 4}


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
