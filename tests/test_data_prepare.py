"""Subwords and binarization of the embedded corpus with both subword tools."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fairseq_tying.common import moses
from fairseq_tying.data import bible, build, prepare
from tests.helpers import run_module

LIMIT = 200
CONTRACT = {"corpus", "src", "tgt", "subword", "post_process", "detokenizer", "vocab_size"}


def _args(out: Path, subword: str, vocab: int, **kw) -> list[str]:
    args = [
        "--corpus",
        "bible",
        "--src",
        "es",
        "--tgt",
        "en",
        "--subword",
        subword,
        "--vocab-size",
        str(vocab),
        "--train-limit",
        str(LIMIT),
        "--out",
        str(out),
    ]
    for k, v in kw.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    return args


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("prep")
    out = {"sentencepiece": root / "spm", "subword_nmt": root / "bpe"}
    assert prepare.main(_args(out["sentencepiece"], "sentencepiece", 600)) == 0
    assert prepare.main(_args(out["subword_nmt"], "subword_nmt", 400)) == 0
    return out


def _dataset_sizes(bin_dir: Path, split: str, lang: str) -> int:
    from fairseq.data import data_utils

    ds = data_utils.load_indexed_dataset(str(bin_dir / f"{split}.es-en.{lang}"), None)
    return len(ds)


@pytest.mark.slow
@pytest.mark.parametrize("subword", ["sentencepiece", "subword_nmt"])
def test_data_dir_contract(prepared, subword):
    d = prepared[subword]
    prep = json.loads((d / "prep.json").read_text())
    assert CONTRACT <= prep.keys()
    assert (prep["corpus"], prep["src"], prep["tgt"], prep["subword"]) == (
        "bible",
        "es",
        "en",
        subword,
    )
    assert prep["post_process"] == subword
    assert prep["detokenizer"] == (None if subword == "sentencepiece" else "moses")
    assert prep["pairs"] == {"train": LIMIT, "valid": 808, "test": 1434}
    # raw text is the committed corpus itself (the BLEU references)
    for split in bible.SPLITS:
        for lang in bible.LANGS:
            raw = (d / "raw" / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
            expected = bible.read_split(split, lang)
            assert raw == (expected[:LIMIT] if split == "train" else expected)
    # one joined dictionary, and every line binarized
    dict_es = (d / "bin" / "dict.es.txt").read_text()
    assert dict_es == (d / "bin" / "dict.en.txt").read_text()
    assert len(dict_es.splitlines()) == prep["dict_size"] > 100
    for split, n in prep["pairs"].items():
        assert _dataset_sizes(d / "bin", split, "es") == n
        assert _dataset_sizes(d / "bin", split, "en") == n


@pytest.mark.slow
def test_sentencepiece_round_trip(prepared):
    import sentencepiece as spm

    d = prepared["sentencepiece"]
    sp = spm.SentencePieceProcessor(model_file=str(d / "spm.model"))
    pieces = (d / "subword" / "valid.en").read_text(encoding="utf-8").splitlines()
    raw = (d / "raw" / "valid.en").read_text(encoding="utf-8").splitlines()
    assert [sp.decode(p.split()) for p in pieces] == raw
    # the dictionary is made of the model's pieces
    vocab = {line.split("\t")[0] for line in (d / "spm.vocab").read_text().splitlines()}
    words = [line.split()[0] for line in (d / "bin" / "dict.en.txt").read_text().splitlines()]
    assert {w for w in words if not w.startswith("madeupword")} <= vocab  # fairseq's padding


@pytest.mark.slow
def test_subword_nmt_round_trip(prepared):
    d = prepared["subword_nmt"]
    bpe = (d / "subword" / "test.es").read_text(encoding="utf-8").splitlines()
    raw = (d / "raw" / "test.es").read_text(encoding="utf-8").splitlines()
    assert "@@ " in bpe[0]
    merged = [line.replace("@@ ", "") for line in bpe]
    assert merged == moses.moses_tokenize(raw, "es")
    # detokenizing the merged text gives the references back for nearly every line
    detok = moses.moses_detokenize(merged, "es")
    assert sum(a == b for a, b in zip(detok, raw, strict=True)) >= 0.95 * len(raw)
    merges = (d / "bpe.codes").read_text().splitlines()
    assert len([m for m in merges if not m.startswith("#")]) == 400


@pytest.mark.slow
def test_rerun_is_skipped(prepared, capsys):
    d = prepared["sentencepiece"]
    before = (d / "prep.json").stat().st_mtime_ns
    assert prepare.main(_args(d, "sentencepiece", 600)) == 0
    assert "already prepared, skipped" in capsys.readouterr().out
    assert (d / "prep.json").stat().st_mtime_ns == before


@pytest.mark.slow
def test_other_settings_need_force(prepared, capsys):
    d = prepared["sentencepiece"]
    assert prepare.main(_args(d, "sentencepiece", 700)) == 2
    err = capsys.readouterr().err
    assert f"--out {d} exists" in err and "--force" in err


def test_spm_model_types(tmp_path):
    import sentencepiece as spm

    data = {("train", "es"): ["hola mundo"] * 50, ("train", "en"): ["hello world"] * 50}
    scores = {}
    for kind in ("bpe", "unigram"):
        work = tmp_path / kind
        work.mkdir()
        args = prepare.parser().parse_args(_args(work, "sentencepiece", 30, spm_type=kind))
        out = build.sentencepiece(work, data, ("es", "en"), args)
        sp = spm.SentencePieceProcessor(model_file=str(work / "spm.model"))
        assert sp.decode(out[("train", "en")][0].split()) == "hello world"
        vocab = (work / "spm.vocab").read_text(encoding="utf-8").splitlines()
        scores[kind] = [float(line.split("\t")[1]) for line in vocab]
    # BPE scores pieces by merge rank (whole numbers), unigram by log probability
    assert all(s == int(s) for s in scores["bpe"])
    assert not all(s == int(s) for s in scores["unigram"])


def test_the_same_corpus_gives_the_same_spm_model_bytes_wherever_it_is_built(tmp_path):
    """The trainer spec names the training file and prefix, not the build folder's paths."""
    from sentencepiece import sentencepiece_model_pb2

    data = {("train", "es"): [f"hola mundo {i}" for i in range(60)],
            ("train", "en"): [f"hello world {i}" for i in range(60)]}
    models = []
    for where in ("a", "elsewhere/b"):
        work = tmp_path / where
        work.mkdir(parents=True)
        args = prepare.parser().parse_args(_args(work, "sentencepiece", 40))
        build.sentencepiece(work, data, ("es", "en"), args)
        models.append((work / "spm.model").read_bytes())
    assert models[0] == models[1]
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(models[0])
    assert (list(proto.trainer_spec.input), proto.trainer_spec.model_prefix) == (
        ["spm.train.txt"], "spm")


def test_corpus_dir_errors_name_the_file(tmp_path, capsys):
    corpus = tmp_path / "c"
    corpus.mkdir()
    for split in ("train", "valid", "test"):
        (corpus / f"{split}.de").write_text("a\nb\n")
        (corpus / f"{split}.en").write_text("a\n")
    args = [
        "--corpus",
        str(corpus),
        "--src",
        "de",
        "--tgt",
        "en",
        "--vocab-size",
        "50",
        "--out",
        str(tmp_path / "d"),
    ]
    assert prepare.main(args) == 2
    assert "train.de has 2 lines, train.en 1" in capsys.readouterr().err
    (corpus / "valid.en").unlink()
    assert prepare.main(args) == 2
    assert f"{corpus / 'valid.en'} is missing" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_failed_preparation_leaves_nothing(tmp_path, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("fairseq-preprocess failed")

    monkeypatch.setattr(build, "preprocess", broken)
    with pytest.raises(RuntimeError):
        prepare.main(_args(tmp_path / "d", "sentencepiece", 300))
    assert list(tmp_path.iterdir()) == []  # neither the data dir nor its build dir


@pytest.mark.slow
def test_cli_module(tmp_path):
    proc = run_module("fairseq_tying.data.prepare", "--corpus", "bible", "--src", "es", "--tgt",
                      "de", "--vocab-size", "100", "--out", tmp_path / "d", check=False)
    assert proc.returncode == 2
    assert "--corpus bible has languages es and en" in proc.stderr


def test_a_training_fraction_is_a_seeded_sample_in_corpus_order():
    full = build.read_corpus("bible", ("es", "en"), None)
    cut = build.read_corpus("bible", ("es", "en"), None, 0.25, sample_seed=1)
    n = len(full[("train", "es")])
    assert len(cut[("train", "es")]) == n // 4 == 7159
    keep = build.sample_indices(n, 0.25, 1)
    assert keep == sorted(keep) and len(set(keep)) == len(keep)
    for lang in ("es", "en"):  # the pairs stay pairs, in the corpus's order
        assert cut[("train", lang)] == [full[("train", lang)][i] for i in keep]
        for split in ("valid", "test"):
            assert cut[(split, lang)] == full[(split, lang)]
    # drawn over the whole corpus (the test books are late in it), not from its start
    assert keep[0] < n // 100 and keep[-1] > n - n // 100
    assert build.sample_indices(n, 0.25, 1) == keep != build.sample_indices(n, 0.25, 2)


@pytest.mark.parametrize("flags, message", [
    (["--train-fraction", "0"], "--train-fraction 0.0: a fraction in (0, 1]"),
    (["--train-fraction", "1.5"], "--train-fraction 1.5: a fraction in (0, 1]"),
    (["--train-fraction", "0.5", "--train-limit", "10"], "give one"),
])
def test_a_bad_training_cut_is_refused_by_name(tmp_path, capsys, flags, message):
    args = ["--corpus", "bible", "--src", "es", "--tgt", "en", "--vocab-size", "100",
            "--out", str(tmp_path / "d"), *flags]
    assert prepare.main(args) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_lines_break_at_newline_alone(tmp_path):
    """\\x0b, \\x1c-\\x1e, \\x85 and \\u2028 are inside a line (str.splitlines breaks there);
    \\r\\n ends one, a lone \\r becomes a space."""
    for lang, text in (("es", "uno\x85dos\u2028\r\ntres\x1cx\rcuatro\n"),
                       ("en", "one\r\ntwo\n")):
        for split in ("train", "valid", "test"):
            (tmp_path / f"{split}.{lang}").write_text(text, encoding="utf-8", newline="")
    data = build.read_corpus(str(tmp_path), ("es", "en"), None)
    assert data[("train", "es")] == ["uno\x85dos\u2028", "tres\x1cx cuatro"]
    assert data[("train", "en")] == ["one", "two"]


def _small_corpus(root: Path, n_test: int = 6) -> Path:
    """A de->en corpus folder of numbered sentences, ``n_test`` test pairs."""
    root.mkdir()
    for split, n in (("train", 60), ("valid", 4), ("test", n_test)):
        for lang in ("de", "en"):
            (root / f"{split}.{lang}").write_text(
                "".join(f"{lang} satz {i % 7} wort {i % 5}\n" for i in range(n)))
    return root


def _corpus_args(corpus: Path, out: Path) -> list[str]:
    return ["--corpus", str(corpus), "--src", "de", "--tgt", "en", "--vocab-size", "30",
            "--out", str(out)]


@pytest.mark.slow
def test_the_test_documents_go_beside_the_references(tmp_path, capsys):
    """A corpus's test.docs becomes raw/test.TGT.docs, where the answer reads each test pair's
    document; another test.docs prepares the data dir again (with --force)."""
    corpus = _small_corpus(tmp_path / "c")
    names = ["letters", "letters", "news", "news", "news", "talks"]
    (corpus / "test.docs").write_text("".join(f"{n}\n" for n in names))
    out = tmp_path / "d"
    assert prepare.main(_corpus_args(corpus, out)) == 0
    assert (out / "raw" / "test.en.docs").read_text().splitlines() == names
    (corpus / "test.docs").write_text("".join(f"{n}\n" for n in reversed(names)))
    assert prepare.main(_corpus_args(corpus, out)) == 2
    assert f"--out {out} exists" in capsys.readouterr().err
    assert prepare.main([*_corpus_args(corpus, out), "--force"]) == 0
    assert (out / "raw" / "test.en.docs").read_text().splitlines() == names[::-1]


@pytest.mark.parametrize("lines, message", [
    ("a\nb\n", "has 2 lines for 6 test pairs"),
    ("a\nb\n\nc\nd\ne\n", "line 3 is empty"),
])
def test_bad_test_documents_are_refused_by_name(tmp_path, capsys, lines, message):
    corpus = _small_corpus(tmp_path / "c")
    (corpus / "test.docs").write_text(lines)
    assert prepare.main(_corpus_args(corpus, tmp_path / "d")) == 2
    err = capsys.readouterr().err
    assert str(corpus / "test.docs") in err and message in err
    assert not (tmp_path / "d").exists()
