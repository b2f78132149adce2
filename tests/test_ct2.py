"""Serving: CTranslate2 export of every output layer against fairseq-generate, the stock export
through CTranslate2's own converter, DynamicConv to fairseq's lightconv, and the translate
command. Real tiny models trained through the CLI; hypotheses compared exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fairseq_tying import translate
from fairseq_tying.export import main as export_main
from fairseq_tying.export.ct2 import Subword, export_ct2
from fairseq_tying.export.stock import ExportError, stock_arch
from tests.helpers import (
    DECODE_BATCH,
    DECODE_MAX_LEN,
    DECODING,
    DECODING_FLAGS,
    arch_name,
    decode,
    export_args,
    run_cli,
    run_module,
)


def _assert_same(ct2: dict[int, str], fairseq: dict[int, str]) -> None:
    """Equal hypotheses for every sentence where neither decoder produced a hypothesis cut by
    the length bound (DECODE_MAX_LEN tokens). Those differ by design: fairseq forces </s> at the
    bound and adds its log-probability, CTranslate2 stops without it, so a cut hypothesis
    competes with a different score."""
    assert ct2.keys() == fairseq.keys()
    ended = [i for i, h in fairseq.items()
             if max(len(h.split()), len(ct2[i].split())) < DECODE_MAX_LEN]
    assert len(ended) >= 0.75 * len(fairseq)
    assert {i: ct2[i] for i in ended} == {i: fairseq[i] for i in ended}


# (--tying, --output-layer, --tied-projection) of the arch whose default is that tying, as in
# tests/test_export.py: the two share the models of the session fixture ``trained``
CT2_CASES = [
    *[
        ("three_way", output_layer, False)
        for output_layer in ("dot", "l2norm", "sqnorm", "distance")
    ],
    ("three_way", "cosine", True),
    ("none", "l2norm", False),
    ("decoder", "l2norm", False),
]


def _ct2_hypotheses(model: Path, sources: dict[int, list[str]], **kw) -> dict[int, str]:
    import ctranslate2

    translator = ctranslate2.Translator(str(model), device="cpu", intra_threads=1, **kw)
    options = translate.ct2_options(**DECODING)
    ids = sorted(sources)
    hyps = translate.translate_tokens(translator, [sources[i] for i in ids], options, DECODE_BATCH)
    return {i: " ".join(h) for i, h in zip(ids, hyps, strict=True)}


@pytest.mark.slow
@pytest.mark.parametrize(("tying", "output_layer", "projection"), CT2_CASES)
def test_ctranslate2_reproduces_fairseq_generate(
    trained, tmp_path, tying, output_layer, projection
):
    run = trained(arch_name("transformer", tying), tying, output_layer, projection)
    out = tmp_path / "ct2"
    meta = export_ct2(run.ckpt, out, subword=Subword("none"))
    assert json.loads((out / "fairseq_tying.json").read_text()) == meta
    assert meta["output_layer"] == output_layer and meta["subword"] == "none"
    assert meta["output_bias"] is (
        output_layer == "distance"
    )  # −½‖w_i‖² is CTranslate2's output bias
    assert len(set(run.hypotheses.values())) > 3  # a model that says something
    _assert_same(_ct2_hypotheses(out, run.sources), run.hypotheses)


@pytest.mark.slow
def test_learned_output_bias_becomes_ctranslate2s_output_bias(trained, tmp_path):
    """``--output-bias`` (a learned b₂, here over l2norm's scores, with the projection L) has no
    stock fairseq equivalent; CTranslate2's output projection carries it."""
    run = trained("transformer_twwt", "three_way", "l2norm", True, ("--output-bias",))
    out = tmp_path / "ct2-bias"
    meta = export_ct2(run.ckpt, out, subword=Subword("none"))
    assert meta["output_bias"] is True
    assert len(set(run.hypotheses.values())) > 3
    _assert_same(_ct2_hypotheses(out, run.sources), run.hypotheses)


@pytest.mark.slow
def test_int8_export_and_translate_command(joined_bin, trained, tmp_path):
    run = trained("transformer_twwt", "three_way", "dot", False)
    out = tmp_path / "ct2-int8"
    run_module(
        "fairseq_tying.export",
        run.ckpt,
        out,
        "--format",
        "ctranslate2",
        "--no-subword",
        "--quantization",
        "int8",
    )
    assert json.loads((out / "fairseq_tying.json").read_text())["quantization"] == "int8"
    sources = run.sources
    src = tmp_path / "src.txt"
    ids = sorted(sources)
    src.write_text("".join(" ".join(sources[i]) + "\n" for i in ids))
    proc = run_module(
        "fairseq_tying.translate",
        "--model",
        out,
        "--input",
        src,
        "--output",
        tmp_path / "hyp.txt",
        *DECODING_FLAGS,
        "--batch-size",
        "3",
        "--threads",
        "1",
    )
    assert "translate: 100%" in proc.stderr  # the progress bar
    lines = (tmp_path / "hyp.txt").read_text().splitlines()
    assert lines == [_ct2_hypotheses(out, sources)[i] for i in ids]


@pytest.mark.slow
def test_stock_export_converts_with_ct2_fairseq_converter(joined_bin, trained, tmp_path):
    run = trained("transformer_twwt", "three_way", "sqnorm", False)
    stock = tmp_path / "stock.pt"
    run_module("fairseq_tying.export", run.ckpt, stock, "--config-format", "namespace")
    out = tmp_path / "converted"
    # CTranslate2's own converter; --user_dir only allowlists argparse.Namespace for torch.load.
    run_cli(
        "ct2-fairseq-converter",
        "--model_path",
        str(stock),
        "--data_dir",
        str(joined_bin),
        "--user_dir",
        "fairseq_tying",
        "--output_dir",
        str(out),
    )
    # the stock export gives the plugin's hypotheses (tests/test_export.py), so must the converted
    _assert_same(_ct2_hypotheses(out, run.sources), run.hypotheses)


@pytest.mark.slow
def test_dynamicconv_exports_to_stock_lightconv(joined_bin, trained, tmp_path):
    # two blocks each: fairseq's lightconv cannot read a one-entry kernel list from a dict config
    run = trained(
        "dynamicconv_twwt",
        "three_way",
        "l2norm",
        True,
        ("--encoder-layers", "2", "--decoder-layers", "2"),
    )
    out = tmp_path / "lightconv.pt"
    proc = run_module("fairseq_tying.export", run.ckpt, out)
    assert "arch lightconv" in proc.stdout
    assert torch.load(out, weights_only=True)["cfg"]["model"]["arch"] == "lightconv"
    stock = decode(joined_bin, out).hypotheses  # stock fairseq, no --user-dir
    assert len(set(stock.values())) > 3 and stock == run.hypotheses
    with pytest.raises(ExportError, match="--arch dynamicconv_twwt"):  # CTranslate2: no lightconv
        export_ct2(run.ckpt, tmp_path / "x", subword=Subword("none"))
    assert not (tmp_path / "x").exists()


def test_dynamicconv_rules_lightconv_cannot_express_are_refused_by_name():
    import fairseq_tying  # noqa: F401  (registers the archs)

    for output_layer in ("dot", "l2norm", "cosine", "sqnorm"):
        arch = export_args(arch="dynamicconv_twwt", output_layer=output_layer)
        assert stock_arch(arch) == "lightconv"
    with pytest.raises(ExportError, match="--output-layer distance.*lightconv"):
        stock_arch(export_args(arch="dynamicconv_dwt", output_layer="distance"))
    with pytest.raises(ExportError, match="--tied-embed-dim 8"):
        stock_arch(export_args(arch="dynamicconv_twwt", tied_embed_dim=8))


def test_export_flags_for_the_other_format_are_refused(tmp_path, capsys):
    ckpt, out = str(tmp_path / "c.pt"), str(tmp_path / "o")
    assert export_main([ckpt, out, "--quantization", "int8"]) == 2
    assert "--quantization applies to --format ctranslate2" in capsys.readouterr().err
    assert export_main([ckpt, out, "--format", "ctranslate2", "--config-format", "namespace"]) == 2
    assert "--config-format applies to --format fairseq" in capsys.readouterr().err
    assert export_main([ckpt, out, "--format", "ctranslate2", "--no-subword"]) == 2
    assert "c.pt does not exist" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_translate_refuses_what_ctranslate2_cannot_do(tmp_path, capsys):
    with pytest.raises(translate.TranslateError, match="--max-len-a 1.2"):
        translate.ct2_options(max_len_a=1.2)
    with pytest.raises(translate.TranslateError, match="--unkpen 2"):
        translate.ct2_options(unkpen=2)
    assert translate.ct2_options(unkpen=float("inf"))["disable_unk"] is True
    assert translate.main(["--model", str(tmp_path / "none")]) == 2
    assert "not a CTranslate2 model directory" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["sentencepiece", "subword_nmt"])
def test_subword_round_trip(tiny_corpus, tmp_path, kind):
    """Raw text → the subword model's tokens → the same text, as translate applies them."""
    lines = (tiny_corpus / "train.src").read_text().splitlines()
    if kind == "sentencepiece":
        import sentencepiece as spm

        spm.SentencePieceTrainer.train(
            input=str(tiny_corpus / "train.src"),
            model_prefix=str(tmp_path / "spm"),
            vocab_size=60,
            hard_vocab_limit=False,
            minloglevel=2,
            num_threads=1,
        )
        name = "spm.model"
    else:
        from subword_nmt.learn_bpe import learn_bpe

        with open(tmp_path / "bpe.codes", "w", encoding="utf-8") as f:
            learn_bpe(lines, f, 30)
        name = "bpe.codes"
    meta = {
        "subword": kind,
        "subword_model": name,
        "source_lang": "en",
        "target_lang": "en",
        "detokenizer": "moses" if kind == "subword_nmt" else None,
    }
    encode, decode = translate.text_processors(tmp_path, meta)
    text = "w1 w22, w3 (w39)."
    tokens = encode(text)
    assert len(tokens) > len(text.split())  # segmented into subwords
    assert decode(tokens) == text


@pytest.mark.slow
def test_serve_bench_compares_fairseq_and_ctranslate2(tiny_corpus, joined_bin, trained, tmp_path):
    from fairseq_tying import bench

    run = trained("transformer_twwt", "three_way", "distance", False)
    out = tmp_path / "serve.json"
    report = bench.main(
        [
            "--mode",
            "serve",
            "--checkpoint",
            str(run.ckpt),
            "--data",
            str(joined_bin),
            *DECODING_FLAGS,
            "--batch-size",
            str(DECODE_BATCH),
            "--clock",
            "cpu",
            "--refs",
            str(tiny_corpus / "test.tgt"),
            "--out",
            str(out),
        ]
    )
    assert json.loads(out.read_text())["results"].keys() == {"fairseq", "ct2_float32", "ct2_int8"}
    rows = report["results"]
    n_test = len((tiny_corpus / "test.src").read_text().splitlines())
    assert rows["fairseq"]["sentences"] == rows["ct2_int8"]["sentences"] == n_test
    assert rows["ct2_float32"]["same_as_fairseq"] >= 0.75  # all but cut-off hypotheses
    assert all(r["tokens_per_s"] > 0 and r["bleu"] is not None for r in rows.values())
    # --summarize tabulates the written report into a file's serving block, decoding nothing
    doc = tmp_path / "serving.md"
    doc.write_text("# S\n\n<!-- serving:begin -->\nold\n<!-- serving:end -->\n")
    table = bench.main(["--mode", "serve", "--summarize", str(out), "--into", str(doc)])["table"]
    row = rows["ct2_float32"]
    assert (f"| three_way, distance | CTranslate2 float32 | {row['sentences_per_s']:.1f} | "
            f"{row['speedup_sentences']:.2f}× | {row['same_count']:,}/{n_test:,} ") in table
    assert table.strip() in doc.read_text() and "old" not in doc.read_text()


def test_serve_summary_refuses_what_it_cannot_tabulate(tmp_path, capsys):
    from fairseq_tying.bench import serve

    with pytest.raises(SystemExit):
        serve.parse_args(["--summarize", str(tmp_path / "none.json")])
    assert "no such report" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        serve.parse_args(["--into", str(tmp_path / "x.md")])
    assert "--into goes with --summarize" in capsys.readouterr().err
