"""Language-modelling sets (``prepare --lm LANG``): one side of the corpus, word level with a
capped vocabulary and <unk>, or subwords; binarized for fairseq's language_modeling task."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from fairseq_tying.data import bible, prepare
from tests.helpers import run_module

LIMIT = 300


def _prepare(out: Path, subword: str, vocab: int, *extra: str) -> int:
    return prepare.main(["--corpus", "bible", "--lm", "en", "--subword", subword, "--vocab-size",
                         str(vocab), "--train-limit", str(LIMIT), "--out", str(out), *extra])


@pytest.fixture(scope="module")
def word_lm(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lm") / "word"
    assert _prepare(out, "word", 500) == 0
    return out


def _binarized_tokens(data: Path, split: str) -> list[list[str]]:
    from fairseq.data import Dictionary, data_utils

    d = Dictionary.load(str(data / "bin" / "dict.txt"))
    ds = data_utils.load_indexed_dataset(str(data / "bin" / split), d)
    return [d.string(ds[i]).split() for i in range(len(ds))]


@pytest.mark.slow
def test_word_level_keeps_the_most_frequent_words_and_unks_the_rest(word_lm):
    """Recomputed here: Moses tokens, lower case, the 500 most frequent training words
    (fairseq's 4 specials count in the 500; it pads the table to a multiple of 8 with unused
    "madeupword" entries) and <unk> for every other word."""
    raw = {s: (word_lm / "raw" / f"{s}.en").read_text().splitlines() for s in ("train", "test")}
    assert raw["train"] == bible.read_split("train", "en")[:LIMIT]
    words = {s: [line.split() for line in
                 (word_lm / "subword" / f"{s}.en").read_text().splitlines()]
             for s in ("train", "test")}
    assert all(w == w.lower() for line in words["train"] for w in line)
    counts = Counter(w for line in words["train"] for w in line)
    dict_words = [line.split()[0] for line in (word_lm / "bin/dict.txt").read_text().splitlines()
                  if not line.startswith("madeupword")]
    assert len(dict_words) == 500 - 4
    by_frequency = sorted(counts, key=lambda w: (-counts[w], w))  # ties: alphabetical
    assert dict_words == by_frequency[:len(dict_words)]
    want = [[w if w in set(dict_words) else "<unk>" for w in line] for line in words["test"]]
    assert _binarized_tokens(word_lm, "test") == want
    prep = json.loads((word_lm / "prep.json").read_text())
    assert prep["task"] == "language_modeling" and prep["sentences"]["train"] == LIMIT


@pytest.mark.slow
def test_sentencepiece_lm_learns_from_one_language(tmp_path):
    out = tmp_path / "spm"
    assert _prepare(out, "sentencepiece", 300) == 0
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    valid = (out / "raw" / "valid.en").read_text().splitlines()
    assert sp.decode((out / "subword/valid.en").read_text().splitlines()[0].split()) == valid[0]
    assert not (out / "raw" / "train.es").exists()
    assert _binarized_tokens(out, "valid")[0] == (out / "subword/valid.en").read_text().split(
        "\n")[0].split()


@pytest.mark.slow
def test_rerun_is_skipped_and_other_settings_need_force(word_lm, capsys):
    assert _prepare(word_lm, "word", 500) == 0
    assert "already prepared, skipped" in capsys.readouterr().out
    assert _prepare(word_lm, "word", 600) == 2
    assert "--force" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["--corpus", "bible", "--lm", "en", "--src", "es", "--vocab-size", "100"], "drop --src"),
    (["--corpus", "bible", "--lm", "de", "--vocab-size", "100"], "not --lm de"),
    (["--corpus", "bible", "--src", "es", "--tgt", "en", "--subword", "word",
      "--vocab-size", "100"], "--subword word is for language models"),
    (["--corpus", "bible", "--vocab-size", "100"], "--src and --tgt are required"),
])
def test_bad_flags_are_named(tmp_path, capsys, args, message):
    assert prepare.main([*args, "--out", str(tmp_path / "x")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_a_corpus_directory_needs_the_language_files(tmp_path, capsys):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "train.en").write_text("a b\n")
    assert prepare.main(["--corpus", str(tmp_path / "c"), "--lm", "en", "--vocab-size", "100",
                         "--out", str(tmp_path / "x")]) == 2
    assert "valid.en is missing" in capsys.readouterr().err


@pytest.mark.slow
def test_the_command_names_a_bad_language_without_a_traceback(tmp_path):
    proc = run_module("fairseq_tying.data.prepare", "--corpus", "bible", "--lm", "de",
                      "--vocab-size", "100", "--out", tmp_path / "x", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr == "error: --corpus bible has languages es and en, not --lm de\n"
