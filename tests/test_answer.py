"""A user's path to "Does it help?" on their own parallel text: prepare -> new-sweep -> local
runs -> answer, through the real commands, and the refusals on the way (each by name)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from fairseq_tying.common import EVAL_JSON, TRAIN_DONE
from tests.helpers import SIZES, launch, run_module

pytestmark = pytest.mark.slow

SEEDS = ("1", "2", "3")


def write_raw(folder: Path) -> Path:
    """A user's own en->es text: {train,valid,test}.{en,es}, a word-for-word mapping."""
    import random

    rng = random.Random(7)
    src = [f"word{i}" for i in range(24)]
    tgt = [f"pal{i}" for i in range(24)]
    folder.mkdir(parents=True)
    for split, n in SIZES.items():
        ids = [[rng.randrange(24) for _ in range(rng.randint(3, 7))] for _ in range(n)]
        (folder / f"{split}.en").write_text("".join(" ".join(src[i] for i in s) + "\n"
                                                    for s in ids))
        (folder / f"{split}.es").write_text("".join(" ".join(tgt[i] for i in s) + "\n"
                                                    for s in ids))
    return folder


@pytest.fixture(scope="module")
def answered(tmp_path_factory) -> dict:
    """The guide's commands on a fresh folder: prepare, new-sweep, train locally, answer."""
    root = tmp_path_factory.mktemp("user")
    raw = write_raw(root / "text")
    data = root / "data"
    run_module("fairseq_tying.data.prepare", "--corpus", raw, "--src", "en", "--tgt", "es",
               "--subword", "sentencepiece", "--vocab-size", "60", "--out", data)
    sweep = root / "mine.yaml"
    run_module("fairseq_tying.launch", "new-sweep", "--data", data, "--out", sweep,
               "--model", "tiny", "--tying", "none", "three_way", "--output-layers", "dot",
               "--seeds", *SEEDS, "--epochs", "2", "--average-last", "2",
               "--output-dir", root / "runs", "--no-estimate")  # test_new_sweep times one
    launch(str(sweep), "--local", "--workers", "2")
    done = run_module("fairseq_tying.studies", "answer", sweep, "--out", root / "answer")
    return {"root": root, "sweep": sweep, "data": data, "stdout": done.stdout,
            "stderr": done.stderr}


def test_the_sweep_is_the_equal_training_protocol(answered):
    raw = yaml.safe_load(answered["sweep"].read_text())
    assert raw["stopping"] == {"max_epoch": 2, "plateau": False}
    assert raw["fairseq"]["log_format"] == "json"
    assert raw["fairseq"]["keep_last_epochs"] == 2
    assert raw["evaluation"]["args"][:2] == ["--average-last", "2"]
    cells = {(t, la) for g in raw["grid"] for t in g["tying"] for la in g["output_layer"]}
    assert cells == {("none", "dot"), ("three_way", "dot")}


def test_the_answer_has_verdicts_for_the_users_runs(answered):
    out = answered["root"] / "answer"
    text = (out / "answer.md").read_text()
    assert "6 of 6 runs are recorded" in answered["stdout"]
    assert "three-way tying" in text and "verdict" in text.lower()
    # the claim of the README's block: tying keeps BLEU, decided for these runs
    summary = json.loads((out / "summary.json").read_text())
    cell = summary["transformer_twwt"]["three_way/dot"]
    assert cell["seeds"] == [1, 2, 3] and "vs_untied" in cell
    assert len(list((out / "records").glob("*.json"))) == 6
    assert "chrF" in text and "M |" in text  # chrF and the parameter count beside BLEU
    assert "Left out" not in text


def _copy_runs(answered, tmp_path: Path) -> tuple[Path, Path]:
    runs = tmp_path / "runs"
    shutil.copytree(answered["root"] / "runs", runs)
    return runs, tmp_path / "answer"


def test_runs_that_cannot_be_compared_are_named_and_left_out(answered, tmp_path):
    runs, out = _copy_runs(answered, tmp_path)
    name = "data.transformer_twwt.three_way.dot"
    (runs / f"{name}.s3" / EVAL_JSON).unlink()  # unfinished
    done = json.loads((runs / f"{name}.s2" / TRAIN_DONE).read_text())
    done["stop"] = {**done["stop"], "epoch": 1, "reason": "plateau"}
    (runs / f"{name}.s2" / TRAIN_DONE).write_text(json.dumps(done))  # another budget
    ev = json.loads((runs / f"{name}.s1" / EVAL_JSON).read_text())
    ev["references_sha256"] = "0" * 64
    ev["references"] = "/elsewhere/test.es"
    (runs / f"{name}.s1" / EVAL_JSON).write_text(json.dumps(ev))  # other references
    result = run_module("fairseq_tying.studies", "answer", answered["sweep"], "--runs", runs,
                        "--out", out)
    err = result.stderr
    assert f"left out {name}.s3: unfinished" in err
    assert f"left out {name}.s2: trained with another budget: epoch 1 (plateau)" in err
    assert f"left out {name}.s1: scored on other references: /elsewhere/test.es" in err
    text = (out / "answer.md").read_text()
    assert text.count("- `data.transformer_twwt.three_way.dot.s") == 3
    assert "3 of 6 runs are recorded" in text
    assert {p.stem for p in (out / "records").glob("*.json")} == \
        {f"data.transformer_twwt.none.dot.s{s}" for s in SEEDS}


def test_other_references_are_named_with_the_file(answered, tmp_path):
    refs = tmp_path / "other.es"
    refs.write_text("otra cosa\n")
    result = run_module("fairseq_tying.studies", "answer", answered["sweep"], "--references",
                        refs, "--out", tmp_path / "answer", check=False)
    assert result.returncode == 2
    assert "scored on other references" in result.stderr and "raw/test.es" in result.stderr
    assert not (tmp_path / "answer" / "records").exists()  # nothing written


def test_a_sweep_without_json_logs_is_refused_before_training(answered, tmp_path):
    raw = yaml.safe_load(answered["sweep"].read_text())
    raw["fairseq"]["log_format"] = "simple"
    raw["output_dir"] = str(tmp_path / "runs")
    sweep = tmp_path / "simple.yaml"
    sweep.write_text(yaml.safe_dump(raw))
    result = launch(str(sweep), "--local", check=False)
    assert result.returncode == 2
    assert "fairseq.log_format: simple" in result.stderr and "json" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_the_answer_is_rebuilt_from_its_records_alone_into_a_report(answered, tmp_path):
    out = tmp_path / "answer"
    shutil.copytree(answered["root"] / "answer" / "records", out / "records")
    report = tmp_path / "results.md"
    report.write_text("# Results\n\n<!-- mine:begin -->\nold\n<!-- mine:end -->\n\nafter\n")
    refs = answered["data"] / "raw" / "test.es"
    run_module("fairseq_tying.studies", "answer", answered["sweep"], "--records-only",
               "--runs", tmp_path / "no_runs", "--references", refs, "--out", out,
               "--report", report, "--block", "mine")
    original = (answered["root"] / "answer" / "answer.md").read_text()
    assert (out / "answer.md").read_text() == original  # the same answer, byte for byte
    body = report.read_text()
    assert "\nold\n" not in body and body.endswith("<!-- mine:end -->\n\nafter\n")
    assert original.split("\n\n", 2)[2].strip() in body  # the answer without its head


def test_the_launchers_summary_names_what_ran(answered):
    jobs = json.loads((answered["root"] / "runs" / "jobs.json").read_text())
    assert len(jobs["train"]) == 6 and len(jobs["evaluate"]) == 6
    assert jobs["collect"] == "launcher"
