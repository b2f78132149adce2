"""A user's path to "Does it help?" on their own parallel text: prepare -> new-sweep -> local
runs -> answer, through the real commands, and the refusals on the way (each by name)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from fairseq_tying.common import EVAL_JSON, TRAIN_DONE
from fairseq_tying.studies.statistics.verdicts import digits
from fairseq_tying.studies.sweep_summary import answer_command, summarize
from fairseq_tying.studies.views.formatting import p_digits
from fairseq_tying.sweeps.config import load_sweep
from tests.helpers import SIZES, launch, run_module

pytestmark = pytest.mark.slow

SEEDS = ("1", "2", "3")
DOC_B = 15  # the test pairs of the user's second document (test.docs)


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
    n_a = SIZES["test"] - DOC_B
    (folder / "test.docs").write_text("doc-a\n" * n_a + "doc-b\n" * DOC_B)
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
    # each claim's Δ on each of the user's test documents (test.docs)
    by_doc = text[text.index("by test document"):]
    assert f"doc-a ({SIZES['test'] - DOC_B})" in by_doc and f"doc-b ({DOC_B})" in by_doc


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
    assert jobs["summary"] == "launcher"


def test_the_launchers_summary_is_the_answer(answered):
    """After the launch, OUTPUT/results.md is the sweep's answer, made by the answer's own
    engine into OUTPUT/answer: the Δs, p-values and verdicts of `studies answer`, its head
    naming the command that rebuilds it, and no table of its own (no Δ against one baseline,
    no per-run p)."""
    runs = answered["root"] / "runs"
    summary = (runs / "results.md").read_text()
    made = (runs / "answer" / "answer.md").read_text()
    assert summary == made + "\nIts records, `summary.json` and plots: [answer/](answer/).\n"
    assert (f"compared by `python -m fairseq_tying.studies answer {answered['sweep']} --runs "
            f"{runs} --out {runs / 'answer'}`.") in made
    command = (answered["root"] / "answer" / "answer.md").read_text()
    assert made.split("\n\n", 2)[2] == command.split("\n\n", 2)[2]  # the same answer
    tied = json.loads((runs / "answer" / "summary.json").read_text())["transformer_twwt"][
        "three_way/dot"]["vs_untied"]
    claim = next(line for line in summary.splitlines() if line.startswith("- Three-way tying"))
    assert f"{tied['delta_bleu']:+.2f} BLEU" in claim
    floor = 1 / (tied["n_samples"] + 1)  # a p at it reads "≤", with the floor's digits
    at_floor = tied["p"] <= floor * (1 + 1e-9)
    raw = f"p ≤ {digits(floor)}" if at_floor else f"p = {p_digits(tied['p'], floor=floor)}"
    assert f"({raw}, Holm " in claim
    assert summary.count("over untied") == 1  # the answer's row of the claim, no other Δ
    for other in ("Δ BLEU (paired)", "significant runs", "p BLEU", "| Run |"):
        assert other not in summary
    assert not (runs / "results.json").exists() and not (runs / "bleu.png").exists()
    assert {p.stem for p in (runs / "answer" / "records").glob("*.json")} == \
        {p.stem for p in (answered["root"] / "answer" / "records").glob("*.json")}


def _runs_copy(answered, tmp_path: Path) -> Path:
    """A copy of the runs without the launcher's summary and answer."""
    runs, _ = _copy_runs(answered, tmp_path)
    shutil.rmtree(runs / "answer")
    (runs / "results.md").unlink()
    return runs


def test_a_grid_without_the_answers_comparisons_says_so_with_the_scores(answered, tmp_path):
    """A sweep of three-way tying with ``dot`` alone makes none of the answer's comparisons: its
    launch (every run finished, so nothing trains) says so, lists each run's scores, and states
    no Δ."""
    runs = _runs_copy(answered, tmp_path)
    raw = yaml.safe_load(answered["sweep"].read_text())
    raw["grid"] = [{**g, "tying": ["three_way"]} for g in raw["grid"]]
    sweep = tmp_path / "tied.yaml"
    sweep.write_text(yaml.safe_dump(raw, sort_keys=False))  # the flags in the runs' order
    launch(str(sweep), "--local", "--output-dir", str(runs))
    summary = (runs / "results.md").read_text()
    assert "No answer for the runs of" in summary
    assert "its grid makes none of the answer's comparisons" in summary
    rows = {cells[0]: cells[1:] for line in summary.splitlines() if line.startswith("| `")
            for cells in [[c.strip() for c in line.strip("|").split("|")]]}
    for seed in SEEDS:
        name = f"data.transformer_twwt.three_way.dot.s{seed}"
        ev = json.loads((runs / name / EVAL_JSON).read_text())
        assert rows.pop(f"`{name}`") == ["three_way", "`dot`", seed, f"{ev['bleu']:.2f}",
                                         f"{ev['tok_bleu']:.2f}", f"{ev['chrf']:.2f}"]
    assert rows == {}
    assert "none.dot" not in summary and "Δ" not in summary.replace("no Δ or p", "")
    assert not (runs / "answer").exists()


def test_a_sweep_with_no_run_to_compare_names_each_run_and_the_command(answered, tmp_path):
    runs = _runs_copy(answered, tmp_path)
    for run in runs.glob(f"*/{EVAL_JSON}"):
        run.unlink()
    sweep = load_sweep(answered["sweep"], runs, check_data=False)
    path, line = summarize(sweep)
    text = path.read_text()
    assert "none of its 6 runs can be compared yet" in line and \
        "none of its 6 runs can be compared yet" in text
    unfinished = text.count(": unfinished (no eval.json")
    assert text.count("\n- `data.transformer_twwt.") == unfinished == 6
    assert f"`{answer_command(sweep)}` makes it once runs can be compared." in text
    assert "Each evaluated run" not in text  # no run has scores to list


def test_a_study_launch_leaves_the_answer_to_its_records(answered, tmp_path):
    """Runs skipped for their study record are not in these folders: the launcher's summary
    makes no answer of the rest, and says where the answer comes from."""
    runs = _runs_copy(answered, tmp_path)
    launch(str(answered["sweep"]), "--local", "--output-dir", str(runs), "--skip-recorded",
           str(answered["root"] / "answer" / "records"))
    text = (runs / "results.md").read_text()
    assert "launched with --skip-recorded" in text and "(6 of 6 now)" in text
    assert "launch study NAME" in text
    assert not (runs / "answer").exists()
