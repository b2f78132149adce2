"""The perplexity study's machinery through the real local launcher: slurm/bible_lm.yaml shrunk
to a toy language-modelling set and a tiny model, trained to the plateau rule or its cap,
scored with the real fairseq-eval-lm, exported to records and turned into the report block."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from fairseq_tying.common import PLUGIN_DIR
from fairseq_tying.common.run_spec import read_run_json
from fairseq_tying.evaluation.perplexity import parse_eval_lm
from fairseq_tying.studies.commands import main
from fairseq_tying.studies.records.record import Record
from fairseq_tying.studies.records.records import read_stop
from fairseq_tying.studies.statistics.cells import SeedDifference
from fairseq_tying.studies.statistics.verdicts import lower
from tests.helpers import REPO, first_stop, launch, run_cli, run_folders

STOP = {"patience": 1, "min_gain": 0.02, "min_epoch": 1, "max_epoch": 3}
TINY = {"decoder_layers": 1, "decoder_embed_dim": 16, "decoder_ffn_embed_dim": 32,
        "decoder_input_dim": 16, "decoder_output_dim": 16,
        "decoder_attention_heads": 2, "tokens_per_sample": 16, "warmup_updates": 10,
        "lr": 0.01, "keep_last_epochs": 2, "log_interval": 5}
REPORT = "# LM\n\n<!-- lm:begin -->\nold\n<!-- lm:end -->\n\nWritten by hand.\n"


def tiny_lm_sweep(path: Path, data: Path, out: Path) -> Path:
    """slurm/bible_lm.yaml with the toy data, a tiny model and a 3-epoch cap."""
    sweep = yaml.safe_load((REPO / "slurm" / "bible_lm.yaml").read_text())
    sweep["datasets"] = {"toy": str(data)}
    sweep["output_dir"] = str(out)
    sweep["grid"] = [
        {"dataset": ["toy"], "arch": ["transformer_lm_tied"], "tying": ["none", "decoder"],
         "output_layer": ["dot"], "seed": [1, 2]},
        {"dataset": ["toy"], "arch": ["transformer_lm_tied"], "tying": ["decoder"],
         "output_layer": ["dot"], "seed": [1], "tag": "tiedL",
         "flags": {"tied_embed_dim": 8, "tied_projection": True}}]
    sweep["stopping"] = STOP
    sweep["fairseq"].update(TINY)
    sweep["batch"]["max_tokens"] = 512
    sweep["evaluation"]["args"] = ["--average-last", "2"]
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def lm_runs(tiny_lm_data, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("lmstudy")
    sweep = tiny_lm_sweep(tmp / "lm.yaml", tiny_lm_data, tmp / "runs")
    launch(str(sweep), "--local", "--workers", "2")
    return tmp / "runs"


@pytest.mark.slow
def test_runs_stop_by_the_rule_and_are_scored_twice(lm_runs):
    names = [r.name for r in run_folders(lm_runs)]
    assert names == ["toy.transformer_lm_tied.decoder.dot.s1", "toy.transformer_lm_tied.decoder."
                     "dot.s2", "toy.transformer_lm_tied.decoder.dot.tiedL.s1",
                     "toy.transformer_lm_tied.none.dot.s1", "toy.transformer_lm_tied.none.dot.s2"]
    for run in run_folders(lm_runs):
        history = json.loads((run / "valid_history.json").read_text())
        assert history["metric"] == "loss"
        values = [h["value"] for h in history["epochs"]]
        epoch, reason = first_stop(values, STOP["patience"], STOP["min_gain"], STOP["max_epoch"])
        assert (read_stop(run).epoch, read_stop(run).reason) == (epoch, reason)
        main_eval = json.loads((run / "eval.json").read_text())
        best = json.loads((run / "eval.best.json").read_text())
        assert main_eval["averaged"] == [f"checkpoint{e}.pt" for e in (epoch - 1, epoch)]
        assert Path(best["checkpoint"]).name == "checkpoint_best.pt" and best["tag"] == "best"
        for ev in (main_eval, best):
            assert ev["task"] == "language_modeling" and ev["tokens_per_sample"] == 16
            assert ev["n_tokens"] > 0 and ev["perplexity"] == pytest.approx(2 ** ev["loss"],
                                                                            rel=2e-3)
            assert ev["perplexity"] < 24  # better than a uniform guess over the 24 words


@pytest.mark.slow
def test_eval_json_is_what_fairseq_eval_lm_reports(lm_runs, tiny_lm_data):
    run = run_folders(lm_runs)[0]
    ev = json.loads((run / "eval.json").read_text())
    proc = run_cli("fairseq-eval-lm", str(tiny_lm_data / "bin"), "--path", ev["checkpoint"],
                   "--user-dir", PLUGIN_DIR, "--gen-subset", "test", "--cpu",
                   "--tokens-per-sample", "16", "--max-tokens", "512")
    line = next(x for x in (proc.stdout + proc.stderr).splitlines() if "Loss (base 2)" in x)
    assert ev["loss"] == float(line.split("Loss (base 2): ")[1].split(",")[0])
    assert ev["perplexity"] == float(line.split("Perplexity: ")[1])


@pytest.mark.slow
def test_block_flags_reach_fairseq_train(lm_runs):
    """tied+L: the tied matrix has the block's D = 8 columns under the hidden size H = 16."""
    for run in run_folders(lm_runs):
        state = torch.load(run / "checkpoints" / "checkpoint_best.pt", map_location="cpu",
                           weights_only=True)
        dim = state["model"]["decoder.embed_tokens.weight"].shape[1]
        tied_l = ".tiedL." in run.name
        assert dim == (8 if tied_l else 16)
        assert ("decoder.scorer.projection.weight" in state["model"]) == tied_l
        assert read_run_json(run).identity.tag == ("tiedL" if tied_l else None)


@pytest.mark.slow
def test_records_and_report(lm_runs, tmp_path):
    records, report, plots = tmp_path / "records", tmp_path / "lm.md", tmp_path / "plots"
    report.write_text(REPORT)
    args = ["study", "--records", str(records), "--report", str(report), "--plots", str(plots),
            "--block", "lm"]
    assert main([*args, "--runs", str(lm_runs)]) == 0
    assert sorted(p.name for p in records.iterdir()) == sorted(
        f"{r.name}.json" for r in run_folders(lm_runs))  # no hypotheses beside LM records
    for run in run_folders(lm_runs):
        rec = Record.load(records / f"{run.name}.json")
        assert rec.eval.perplexity == json.loads((run / "eval.json").read_text())["perplexity"]
        assert rec.eval_best.checkpoint == "checkpoint_best.pt"
        assert rec.train.stop == read_stop(run)
    text = report.read_text()
    assert "none × dot" in text and "decoder × dot + tiedL (D = 8)" in text
    assert "Press & Wolf" in text and text.endswith("Written by hand.\n")
    summary = json.loads((plots / "summary.json").read_text())
    tied = summary["decoder × dot"]
    assert tied["vs_untied_dot"]["verdict"] == \
        lower(SeedDifference.from_dict(tied["vs_untied_dot"]))
    tied_l = summary["decoder × dot + tiedL (D = 8)"]
    ppl = {r.name: json.loads((r / "eval.json").read_text())["perplexity"]
           for r in run_folders(lm_runs)}
    assert tied_l["vs_tied_dot"]["mean"] == pytest.approx(
        ppl["toy.transformer_lm_tied.decoder.dot.tiedL.s1"]
        - ppl["toy.transformer_lm_tied.decoder.dot.s1"])
    assert "vs_tied_dot" not in tied and "vs_tied_dot" not in summary["none × dot"]
    assert (plots / "valid_ppl_epochs.png").stat().st_size > 10_000
    assert (plots / "test_ppl.png").stat().st_size > 10_000
    first = text
    assert main(args) == 0  # from the records alone: the same report
    assert report.read_text() == first


def test_parse_eval_lm_refuses_zero_tokens():
    out = ("| fairseq_cli.eval_lm | Evaluated 0 tokens in 0.0s (0.00 tokens/s)\n"
           "| fairseq_cli.eval_lm | Loss (base 2): 0.0000, Perplexity: 1.00\n")
    with pytest.raises(RuntimeError, match="myrun: fairseq-eval-lm evaluated 0 tokens"):
        parse_eval_lm(out, "myrun")
    with pytest.raises(RuntimeError, match="myrun: fairseq-eval-lm printed no"):
        parse_eval_lm("Traceback ...", "myrun")
    ok = parse_eval_lm(out.replace("Evaluated 0", "Evaluated 1,234").replace(
        "0.0000, Perplexity: 1.00", "3.5000, Perplexity: 11.31"), "myrun")
    assert ok == {"loss": 3.5, "perplexity": 11.31, "n_tokens": 1234}
