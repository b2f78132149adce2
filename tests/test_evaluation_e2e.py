"""End to end: tiny data dir -> fairseq-train (plugin) -> ``evaluate`` / ``collect`` / ``norms``.

Everything runs through the real CLIs (fairseq-preprocess, fairseq-train, fairseq-generate,
``python -m fairseq_tying.evaluation``, ``python -m fairseq_tying.studies``) on a generated toy
corpus; about a minute on one core.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib import image as mpimg

import fairseq_tying
from fairseq_tying.common.eval_options import evaluate_options
from fairseq_tying.evaluation.average import average_checkpoints
from fairseq_tying.launch import job
from tests.helpers import (
    SPM_SIZES,
    build_tiny_spm_data,
    fairseq_train,
    run_cli,
    run_module,
    tiny_transformer,
)

pytestmark = pytest.mark.slow

PLUGIN = os.path.dirname(fairseq_tying.__file__)
N_TEST = SPM_SIZES["test"]


def _train(data: Path, save_dir: Path, output_layer: str, seed: int, epochs: int) -> None:
    fairseq_train(data / "bin", save_dir, "transformer_twwt", *tiny_transformer(32),
                  "--output-layer", output_layer, "--optimizer", "adam", "--lr", "0.01",
                  "--criterion", "label_smoothed_cross_entropy", "--max-tokens", "4000",
                  "--max-epoch", str(epochs), "--seed", str(seed))


def _evaluate(*args) -> subprocess.CompletedProcess:
    return run_module("fairseq_tying.evaluation", *args, check=False)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("eval_e2e")
    data = build_tiny_spm_data(root / "data")
    run_a = root / "runs" / "dot-s1"  # checkpoints directly in the run dir
    _train(data, run_a, "dot", seed=1, epochs=6)
    run_b = root / "runs" / "l2norm-s1"  # the launcher's layout: checkpoints/ and run.json
    _train(data, run_b / "checkpoints", "l2norm", seed=1, epochs=3)
    (run_b / "run.json").write_text(json.dumps({
        "name": "toy-l2norm-seed1", "data_dir": str(data), "arch": "transformer_twwt",
        "tying": "three_way", "output_layer": "l2norm", "seed": 1}))
    return {"root": root, "data": data, "a": run_a, "b": run_b}


@pytest.fixture(scope="module")
def eval_a(world) -> dict:
    proc = _evaluate("evaluate", world["a"], "--data", world["data"], "--average-last", "2",
                     "--cpu", "--batch-size", "8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"^BLEU\s+\d+\.\d\d\s+nrefs:1\|", proc.stdout, re.M), proc.stdout
    return json.loads((world["a"] / "eval.json").read_text())


@pytest.fixture(scope="module")
def eval_b(world) -> dict:
    proc = _evaluate(world["b"], "--cpu")  # shorthand; --data comes from run.json
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((world["b"] / "eval.json").read_text())


def _sacrebleu_cli(ref: Path, hyp: Path) -> dict[str, dict]:
    out = run_cli("sacrebleu", ref, "-i", hyp, "-m", "bleu", "chrf", "-w", "6").stdout
    return {m["name"]: m for m in json.loads(out)}


def test_evaluate_average_of_last_checkpoints(world, eval_a):
    run = world["a"]
    assert eval_a["averaged"] == ["checkpoint5.pt", "checkpoint6.pt"]
    assert eval_a["checkpoint"] == str(run / "checkpoint.avg2.pt")
    assert (eval_a["preset"], eval_a["beam"], eval_a["lenpen"]) == ("transformer_iwslt", 5, 1.0)
    cmd = eval_a["generate_command"]
    assert cmd[cmd.index("--user-dir") + 1] == PLUGIN
    assert cmd[cmd.index("--post-process") + 1] == "sentencepiece"
    assert eval_a["run"] == {"name": "dot-s1", "method": "transformer_twwt:three_way:dot",
                             "arch": "transformer_twwt", "tying": "three_way",
                             "output_layer": "dot", "seed": 1}
    hyps = (run / "test.hyp.en").read_text().splitlines()
    assert len(hyps) == N_TEST == eval_a["n_sentences"]
    # In corpus order: the D- lines of fairseq-generate's output sorted by sentence id.
    gen = (run / "generate-test.txt").read_text()
    d_lines = dict(re.findall(r"^D-(\d+)\t[^\t]*\t(.*)$", gen, re.M))
    assert hyps == [d_lines[str(i)] for i in range(N_TEST)]
    assert not any("\u2581" in h for h in hyps)  # sentencepiece pieces were joined
    assert sum(h.strip() != "" for h in hyps) > N_TEST // 2
    cli = _sacrebleu_cli(world["data"] / "raw/test.en", run / "test.hyp.en")
    assert eval_a["bleu"] == pytest.approx(cli["BLEU"]["score"], abs=1e-4)
    assert eval_a["chrf"] == pytest.approx(cli["chrF2"]["score"], abs=1e-4)
    assert eval_a["bleu_signature"] == cli["BLEU"]["signature"]
    assert eval_a["chrf"] > 5  # a trained model, not noise


def test_average_of_two_real_checkpoints_is_their_mean(world, tmp_path):
    run = world["a"]
    out = average_checkpoints([run / "checkpoint2.pt", run / "checkpoint1.pt"], tmp_path / "a.pt")
    load = dict(map_location="cpu", weights_only=True)
    a = torch.load(run / "checkpoint1.pt", **load)["model"]
    b_state = torch.load(run / "checkpoint2.pt", **load)
    b = b_state["model"]
    avg = torch.load(out, **load)
    # the newest input's training state, whatever the order given (as fairseq's script keeps)
    assert avg["optimizer_history"] == b_state["optimizer_history"]
    assert avg["optimizer_history"][-1]["num_updates"] > 0 and avg["last_optimizer_state"] is None
    assert avg["model"].keys() == a.keys()
    changed = 0
    for key, value in avg["model"].items():
        assert value.dtype == a[key].dtype
        torch.testing.assert_close(value, (a[key] + b[key]) / 2)
        changed += not torch.equal(a[key], b[key])
    assert changed > 5  # the two checkpoints really differ
    assert avg["cfg"]["model"].arch == "transformer_twwt"
    assert not list(tmp_path.glob(".*tmp"))  # nothing half-written left behind


def test_evaluate_launcher_layout_and_shorthand(world, eval_b):
    assert eval_b["checkpoint"] == str(world["b"] / "checkpoints" / "checkpoint_best.pt")
    assert eval_b["data"] == str(world["data"])
    assert eval_b["run"]["name"] == "toy-l2norm-seed1"
    assert eval_b["run"]["method"] == "transformer_twwt:three_way:l2norm"
    assert eval_b["n_sentences"] == N_TEST


def test_collect_and_norms_on_real_runs(world, eval_a, eval_b):
    out = world["root"] / "report"
    proc = run_module("fairseq_tying.studies", "collect", world["root"] / "runs", "--out", out,
                      check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (out / "results.md").read_text()
    assert "| transformer_twwt:three_way:dot " in md and "toy-l2norm-seed1" in md
    assert md.strip() in proc.stdout
    group = json.loads((out / "results.json").read_text())["groups"][0]
    [b_run] = [r for r in group["runs"] if r["name"] == "toy-l2norm-seed1"]
    assert b_run["bleu"] == eval_b["bleu"] and b_run["chrf"] == eval_b["chrf"]

    png = world["root"] / "norms.png"
    proc = _evaluate("norms", world["a"] / "checkpoint_last.pt",
                     world["b"] / "checkpoints" / "checkpoint_best.pt", "--out", png,
                     "--labels", "dot", "l2norm")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| dot")
            or line.startswith("| l2norm")]
    assert len(rows) == 2 and all("decoder.scorer.weight" in r for r in rows)
    n_rows = len((world["data"] / "bin/dict.en.txt").read_text().splitlines())
    assert all(f"| {n_rows} " in r for r in rows)  # dictionary entries, specials left out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = mpimg.imread(png)[..., :3]
    assert img.shape[0] > 200 and (np.abs(img - 1).sum(-1) > 0.3).mean() > 0.02


def test_bad_inputs_give_clear_errors(world, tmp_path):
    proc = _evaluate("evaluate", world["a"], "--data", tmp_path, "--cpu")
    assert proc.returncode == 2 and "--data" in proc.stderr and "prep.json" in proc.stderr
    proc = _evaluate("evaluate", world["a"], "--data", world["data"], "--average-last", "99")
    assert proc.returncode == 2 and "--average-last 99" in proc.stderr
    assert not (world["a"] / "eval-test.json").exists()


def test_launcher_evaluates_in_process_with_the_sweep_flags(world, eval_b):
    """The evaluation job calls ``evaluate_run`` with the options of the sweep's
    ``evaluation.args``."""
    run = world["b"]
    out = job.evaluate(run, evaluate_options(["--checkpoint", "checkpoint_last.pt",
                                              "--batch-size", "8"]), cpu=True, tag="last")
    assert out == run / "eval.last.json"
    result = json.loads(out.read_text())
    assert result["checkpoint"] == str(run / "checkpoints" / "checkpoint_last.pt")
    assert result["tag"] == "last" and (run / result["hypotheses"]).is_file()
    with pytest.raises(ValueError, match="--subset valid would write eval-valid.json, not "
                       "the eval.json"):
        job.evaluate(run, evaluate_options(["--subset", "valid"]), cpu=True)
