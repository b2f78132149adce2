"""``python -m fairseq_tying.analysis`` on real checkpoints of a corpus made of SimLex-999 words,
its numbers checked against a direct computation."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from fairseq_tying.analysis import learned_summary
from fairseq_tying.analysis.measures import learned_parameters
from tests.helpers import binarize, build_model, run_cli, run_module, train_args


def _simlex() -> tuple[list[tuple[str, str, float]], str]:
    from gensim.test.utils import datapath

    path = datapath("simlex999.txt")
    rows = [line.split("\t") for line in Path(path).read_text().splitlines()
            if not line.startswith("#")]
    return [(a, b, float(s)) for a, b, s in rows], path


@pytest.fixture(scope="module")
def simlex_run(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    """A sentencepiece-encoded toy corpus over SimLex words and two models trained on it: three-way
    tied ``fixnorm`` and untied ``dot``."""
    import sentencepiece as spm

    root = tmp_path_factory.mktemp("simlex")
    words = sorted({w for a, b, _ in _simlex()[0][:60] for w in (a, b)})
    rng = random.Random(0)
    raw = {}
    for split, n in (("train", 300), ("valid", 20), ("test", 20)):
        sents = [[rng.choice(words) for _ in range(rng.randint(3, 8))] for _ in range(n)]
        # a word of each side's own, so that the tied matrix has rows of one side only
        raw[split] = {"src": [" ".join([*s, "zqzq"]) for s in sents],
                      "tgt": [" ".join(["xjxj", *reversed(s)]) for s in sents]}
    (root / "all.txt").write_text("\n".join(raw["train"]["src"] + raw["train"]["tgt"]) + "\n")
    spm.SentencePieceTrainer.train(input=str(root / "all.txt"), model_prefix=str(root / "spm"),
                                   vocab_size=100, model_type="unigram", minloglevel=2,
                                   hard_vocab_limit=False)
    sp = spm.SentencePieceProcessor(model_file=str(root / "spm.model"))
    enc = root / "enc"
    enc.mkdir()
    for split, sides in raw.items():
        for side, lines in sides.items():
            pieces = [" ".join(sp.encode(line, out_type=str)) for line in lines]
            (enc / f"{split}.{side}").write_text("\n".join(pieces) + "\n")
    data = binarize(enc, root / "bin", joined=True)
    ckpts = {}
    for tying, arch, layer in (("three_way", "transformer_twwt", "fixnorm"),
                               ("none", "transformer_dwt", "dot")):
        run_cli("fairseq-train", *train_args(data, root / tying, arch, "--tying", tying,
                                             "--output-layer", layer, updates=2))
        ckpts[tying] = root / tying / "checkpoint_last.pt"
    return root, ckpts


def _direct_simlex_rho(ckpt: Path, root: Path, key: str) -> tuple[float, int]:
    """SimLex ρ over the pairs whose pieces are all dictionary entries, without gensim."""
    import sentencepiece as spm
    from fairseq.data import Dictionary

    sp = spm.SentencePieceProcessor(model_file=str(root / "spm.model"))
    d = Dictionary.load(str(root / "bin" / "dict.src.txt"))
    matrix = torch.load(ckpt, weights_only=True)["model"][key].double().numpy()

    def vector(word: str) -> np.ndarray | None:
        ids = [d.index(p) for p in sp.encode(word, out_type=str)]
        return None if d.unk() in ids else matrix[ids].mean(axis=0)

    gold, model = [], []
    for a, b, score in _simlex()[0]:
        va, vb = vector(a), vector(b)
        if va is not None and vb is not None:
            gold.append(score)
            model.append(va @ vb / np.linalg.norm(va) / np.linalg.norm(vb))
    return float(spearmanr(gold, model)[0]), len(gold)


@pytest.mark.slow
def test_analysis_reports_every_role_with_gensims_numbers(simlex_run, tmp_path):
    root, ckpts = simlex_run
    out = tmp_path / "analysis"
    report_md = tmp_path / "results.md"
    report_md.write_text("# R\n\nwritten by hand\n<!-- analysis:begin -->\nold\n"
                         "<!-- analysis:end -->\nafter\n")
    run_module("fairseq_tying.analysis", ckpts["three_way"], ckpts["none"], "--out", out,
               "--report", report_md)
    report = json.loads((out / "analysis.json").read_text())
    assert report["subword_model"] == str(root / "spm.model")  # found beside the data folder
    tied, untied = report["models"]
    assert [m["roles"] for m in tied["matrices"]] == [
        ["encoder input", "decoder input", "decoder output"]]
    assert [m["roles"] for m in untied["matrices"]] == [
        ["encoder input"], ["decoder input"], ["decoder output"]]

    for model, key in ((tied, "encoder.embed_tokens.weight"), (untied, "decoder.scorer.weight")):
        matrix = next(m for m in model["matrices"] if m["key"] == key)
        rho, scored = _direct_simlex_rho(Path(model["checkpoint"]), root, key)
        sim = matrix["similarity"]["SimLex-999"]
        assert sim["pairs_total"] == 999 and sim["pairs_scored"] == scored > 50
        assert sim["spearman"] == pytest.approx(rho, abs=1e-3)
        whole = matrix["similarity"]["SimLex-999 whole-word"]
        assert whole["pairs_scored"] <= scored

    # a three-way tied matrix's norms by the side its pieces occur on, by brute force
    from fairseq.data import Dictionary

    d = Dictionary.load(str(root / "bin" / "dict.src.txt"))
    seen = {}
    for side in ("src", "tgt"):
        counts = np.zeros(len(d))
        for line in (root / "enc" / f"train.{side}").read_text().splitlines():
            for piece in line.split():
                counts[d.index(piece)] += 1
        seen[side] = (counts > 0) & (np.arange(len(d)) >= d.nspecial)
    tied_rows = torch.load(ckpts["three_way"], weights_only=True)["model"][
        "encoder.embed_tokens.weight"].double().numpy()
    by_side = tied["matrices"][0]["norm_by_side"]
    for name, mask in (("source only", seen["src"] & ~seen["tgt"]),
                       ("target only", seen["tgt"] & ~seen["src"]),
                       ("both", seen["src"] & seen["tgt"])):
        assert by_side[name]["rows"] == mask.sum() > 0
        assert by_side[name]["mean_norm"] == pytest.approx(
            np.linalg.norm(tied_rows[mask], axis=1).mean(), abs=1e-9)
    assert all(m["norm_by_side"] is None for m in untied["matrices"])

    # geometry, by brute force on the untied output matrix
    state = torch.load(ckpts["none"], weights_only=True)["model"]

    d = Dictionary.load(str(root / "bin" / "dict.tgt.txt"))
    counts = np.zeros(len(d))  # target-side occurrences, from the encoded text
    for line in (root / "enc" / "train.tgt").read_text().splitlines():
        for piece in line.split():
            counts[d.index(piece)] += 1
    keep = (np.arange(len(d)) >= d.nspecial) & (counts > 0)
    rows = state["decoder.scorer.weight"].double().numpy()[keep]
    units = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    cos = units @ units.T
    n = len(rows)
    out_matrix = untied["matrices"][2]
    assert out_matrix["mean_pairwise_cosine"] == pytest.approx(
        (cos.sum() - np.trace(cos)) / (n * (n - 1)), abs=1e-9)
    assert out_matrix["norm_frequency_spearman"] == pytest.approx(
        spearmanr(np.linalg.norm(rows, axis=1), counts[keep])[0], abs=1e-9)

    # fixnorm's learned g by name, beside its initial √D (D = 16); the other layers have none
    gain = torch.load(ckpts["three_way"], weights_only=True)["model"]["decoder.scorer.gain"]
    assert tied["parameters"] == {"gain": {"value": pytest.approx(float(gain)),
                                           "initial_value": 4.0}}
    assert float(gain) != 4.0 and untied["parameters"] == {}

    table = (out / "analysis.md").read_text()
    assert "| three_way·fixnorm | encoder input = decoder input = decoder output |" in table
    assert ("The output layer's learned parameters, trained (from their initial value): "
            f"three_way·fixnorm gain {float(gain):.2f} (from 4.00).") in table
    assert (f"three_way·fixnorm: source only {by_side['source only']['mean_norm']:.2f} "
            f"({by_side['source only']['rows']}), target only") in table
    assert report_md.read_text() == ("# R\n\nwritten by hand\n<!-- analysis:begin -->\n"
                                     f"{table}<!-- analysis:end -->\nafter\n")
    for png in ("norms_vs_frequency.png", "similarity.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    _check_pair_scores(out, untied, table)

    # a second analysis goes to its own block and leaves the first alone
    before = report_md.read_text()
    report_md.write_text(before + "<!-- trained:begin -->\n<!-- trained:end -->\n")
    run_module("fairseq_tying.analysis", ckpts["none"], "--out", tmp_path / "trained",
               "--labels", "untied", "--report", report_md, "--block", "trained")
    second = (tmp_path / "trained" / "analysis.md").read_text()
    assert "| untied | decoder output |" in second
    assert report_md.read_text() == (before + f"<!-- trained:begin -->\n{second}"
                                     "<!-- trained:end -->\n")


def _check_pair_scores(out: Path, untied: dict, table: str) -> None:
    """pair_scores.json holds each pair's cosine, whose ρ with the ratings is gensim's; the
    untied model's matrices are compared by the paired bootstrap on them, and --table-from
    gives the same table from the files alone."""
    from fairseq_tying.analysis.intervals import paired_bootstrap

    scores = json.loads((out / "pair_scores.json").read_text())
    ratings = np.array(scores["ratings"]["SimLex-999"])
    assert list(ratings) == [s for *_, s in _simlex()[0]]
    cosines = scores["cosines"][1]  # the untied model's three matrices
    assert len(cosines) == 3
    for matrix, by_name in zip(untied["matrices"], cosines, strict=True):
        assert "cosines" not in matrix["similarity"]["SimLex-999"]  # kept out of analysis.json
        c = by_name["SimLex-999"]
        scored = [k for k, v in enumerate(c) if v is not None]
        assert len(scored) == matrix["similarity"]["SimLex-999"]["pairs_scored"]
        assert spearmanr(ratings[scored], np.take(c, scored))[0] == pytest.approx(
            matrix["similarity"]["SimLex-999"]["spearman"], abs=1e-12)
    enc, out_c = (np.array(cosines[i]["SimLex-999"], dtype=float) for i in (0, 2))
    both = ~np.isnan(enc) & ~np.isnan(out_c)
    d = paired_bootstrap(ratings[both], out_c[both], enc[both])
    assert (f"| none·dot | decoder output − encoder input | {d.estimate:+.3f} [{d.low:+.2f}, "
            f"{d.high:+.2f}], p ") in table
    assert "paired bootstrap" in table and "no paired test" not in table
    (out / "analysis.md").unlink()
    run_module("fairseq_tying.analysis", "--table-from", out)
    assert (out / "analysis.md").read_text() == table


@pytest.mark.slow
def test_analysis_names_a_missing_subword_model(simlex_run, tmp_path, capsys):
    from fairseq_tying import analysis

    _root, ckpts = simlex_run
    with pytest.raises(SystemExit) as error:
        analysis.main([str(ckpts["none"]), "--out", str(tmp_path),
                       "--spm", str(tmp_path / "nope.model")])
    assert "--spm" in str(error.value) and "nope.model" in str(error.value)
    assert not (tmp_path / "analysis.json").exists()
    with pytest.raises(SystemExit):  # argparse's error names --block and what to use
        analysis.main([str(ckpts["none"]), "--out", str(tmp_path), "--block", "a block"])
    assert "--block 'a block'" in capsys.readouterr().err
    assert not (tmp_path / "analysis.json").exists()


@pytest.fixture(scope="module")
def simlex_lms(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    """A word-level LM set over SimLex words (prep.json says so, as data.prepare writes it) and
    an untied and a decoder-tied language model trained on it."""
    from tests.helpers import LM_TRAIN, binarize_lm

    root = tmp_path_factory.mktemp("simlex-lm")
    words = sorted({w for a, b, _ in _simlex()[0][:60] for w in (a, b)})
    rng = random.Random(1)
    (root / "text").mkdir()
    for split, n in (("train", 200), ("valid", 20), ("test", 20)):
        lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 8))) for _ in range(n)]
        (root / "text" / f"{split}.en").write_text("\n".join(lines) + "\n")
    (root / "prep.json").write_text(json.dumps({"task": "language_modeling", "subword": "word"}))
    data = binarize_lm(root / "text", "en", root / "bin")
    ckpts = {}
    for tying in ("none", "decoder"):
        run_cli("fairseq-train", str(data), "--arch", "transformer_lm_tied", "--tying", tying,
                "--save-dir", str(root / tying), *LM_TRAIN)
        ckpts[tying] = root / tying / "checkpoint_last.pt"
    return root, ckpts


def _direct_word_rho(ckpt: Path, root: Path, key: str) -> tuple[float, int]:
    """SimLex ρ with each word's own row, over the pairs of dictionary words, without gensim."""
    from fairseq.data import Dictionary

    d = Dictionary.load(str(root / "bin" / "dict.txt"))
    matrix = torch.load(ckpt, weights_only=True)["model"][key].double().numpy()
    gold, model = [], []
    for a, b, score in _simlex()[0]:
        if d.unk() not in (d.index(a), d.index(b)):
            va, vb = matrix[d.index(a)], matrix[d.index(b)]
            gold.append(score)
            model.append(va @ vb / np.linalg.norm(va) / np.linalg.norm(vb))
    return float(spearmanr(gold, model)[0]), len(gold)


@pytest.mark.slow
def test_analysis_of_word_level_language_models(simlex_lms, tmp_path):
    """An LM's input and output roles (one matrix when tied), each word its own row, token
    counts from the LM's training text."""
    from fairseq_tying import analysis

    root, ckpts = simlex_lms
    reports = analysis.run([str(ckpts["none"]), str(ckpts["decoder"])], tmp_path)
    untied, tied = reports
    assert [m.roles for m in untied.matrices] == [["decoder input"], ["decoder output"]]
    assert [m.roles for m in tied.matrices] == [["decoder input", "decoder output"]]
    for report in reports:
        for m in report.matrices:
            assert list(m.similarity) == ["SimLex-999", "WordSim-353"]  # no whole-word copy
            rho, scored = _direct_word_rho(Path(report.checkpoint), root, m.key)
            assert m.similarity["SimLex-999"]["pairs_scored"] == scored > 50
            assert m.similarity["SimLex-999"]["spearman"] == pytest.approx(rho, abs=1e-3)
    train_words = {w for line in (root / "text" / "train.en").read_text().splitlines()
                   for w in line.split()}
    assert untied.matrices[1].rows_seen == len(train_words)
    saved = json.loads((tmp_path / "analysis.json").read_text())
    assert saved["subword_model"] is None and "own row" in saved["word_vector"]
    assert "the lower-cased word's own row" in (tmp_path / "analysis.md").read_text()


def test_tied_roles_are_one_matrix_in_an_averaged_checkpoint():
    """Averaging checkpoints writes each key on its own: equal copies are still one matrix."""
    from fairseq_tying.analysis import matrices

    w = torch.randn(6, 4)
    shared = {"decoder.embed_tokens.weight": w, "decoder.scorer.weight": w}
    copied = {"decoder.embed_tokens.weight": w, "decoder.scorer.weight": w.clone()}
    untied = {"decoder.embed_tokens.weight": w, "decoder.scorer.weight": w + 1e-6}
    both = [("decoder.embed_tokens.weight", ["decoder input", "decoder output"])]
    assert matrices(shared) == matrices(copied) == both
    assert [roles for _, roles in matrices(untied)] == [["decoder input"], ["decoder output"]]


def test_a_learned_vector_is_reported_by_name(joined_bin):
    """ngpt's sz (V values, stored at 1/√D = 0.25 for D = 16): its mean and range, trained and
    initial, by its name in the report and its table."""
    model, _ = build_model(joined_bin, "transformer_twwt", "--output-layer", "ngpt")
    state = model.state_dict()
    vocab = state["decoder.scorer.sz"].shape[0]
    state["decoder.scorer.sz"] = torch.linspace(0.1, 0.5, vocab)
    found = learned_parameters(state, "ngpt")
    assert found == {"sz": {"mean": pytest.approx(0.3), "min": pytest.approx(0.1),
                            "max": pytest.approx(0.5), "initial_mean": 0.25,
                            "initial_min": 0.25, "initial_max": 0.25}}
    assert learned_summary("sz", found["sz"]) == "sz mean 0.3, 0.1 to 0.5 (from 0.25)"


def test_table_from_takes_a_folder_with_an_analysis_and_nothing_else(tmp_path, capsys):
    from fairseq_tying import analysis

    for argv, message in ((["--table-from", str(tmp_path)], "no analysis.json there"),
                          (["--table-from", str(tmp_path), "ckpt.pt"], "give no checkpoints"),
                          ([], "give the checkpoints and --out")):
        with pytest.raises(SystemExit):
            analysis.main(argv)
        assert message in capsys.readouterr().err
    assert not (tmp_path / "analysis.md").exists()
