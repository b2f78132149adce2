"""The study pipeline end to end: a real ``--local`` sweep → records → tables, plots, p-values."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest

from fairseq_tying.common.blocks import block_text, markers
from fairseq_tying.studies.commands import main
from fairseq_tying.studies.records import records
from fairseq_tying.studies.records.record import Record
from fairseq_tying.studies.statistics.significance import seed_paired_bootstrap
from tests.helpers import launch, write_sweep

pytestmark = pytest.mark.slow
BEGIN, END = markers("study")

# the cells the assertions compare, 2 seeds each: three-way tied l2norm against dot (vs_dot), and
# three-way tied dot against untied dot (vs_untied); untied l2norm would only add 2 more runs
BASE = {"dataset": ["tiny"], "arch": ["transformer_twwt"], "seed": [1, 2]}
GRID = [{**BASE, "tying": ["none"], "output_layer": ["dot"]},
        {**BASE, "tying": ["three_way"], "output_layer": ["dot", "l2norm"]}]


@pytest.fixture(scope="module")
def study(tiny_data, tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("study")
    sweep = write_sweep(tmp / "study.yaml", grid=GRID, fairseq={"log_format": "json"})
    runs = tmp / "runs"
    launch(str(sweep), "--local", "--output-dir", str(runs), data=tiny_data, timeout=900)
    report = tmp / "results.md"
    report.write_text(f"# Study\n\nWritten by hand.\n\n{BEGIN}\nold tables\n{END}\n\n"
                      "Conclusions.\n")
    paths = {"runs": runs, "records": tmp / "records", "report": report, "plots": tmp / "plots",
             "refs": tiny_data / "raw" / "test.en"}
    assert _study(paths, "--runs", str(runs)) == 0
    return paths


def _study(p: dict[str, Path], *extra: str) -> int:
    return main(["study", "--records", str(p["records"]), "--report", str(p["report"]),
                 "--plots", str(p["plots"]), "--references", str(p["refs"]),
                 "--bootstrap-samples", "200", *extra])


def _records(p: dict[str, Path]) -> dict[str, Record]:
    return {r.name: r for r in records.load(p["records"])}


def test_records_hold_what_the_runs_produced(study):
    recorded = _records(study)
    assert len(recorded) == 6
    for name, rec in recorded.items():
        run = study["runs"] / name
        assert rec.run.tying in ("none", "three_way") and rec.run.seed in (1, 2)
        hyps = gzip.decompress((study["records"] / f"{name}.hyp.gz").read_bytes()).decode()
        assert hyps == (run / "test.hyp.en").read_text()
        assert rec.hypotheses == hyps.splitlines()
        assert rec.eval.bleu == json.loads((run / "eval.json").read_text())["bleu"]
        assert rec.train.valid["num_updates"] == 12
        assert rec.train.valid_history[-1] == [12, rec.train.valid_nll]
        assert len(rec.output_row_norms) > 0


def test_three_way_tying_saves_exactly_two_embedding_matrices(study):
    recorded = _records(study)
    params = {r.run.tying: r.train.params for r in recorded.values()}
    norms = next(iter(recorded.values())).output_row_norms
    vocab, dim = len(norms) + 4, 16  # the 4 special rows are left out of the norms
    assert params["none"] - params["three_way"] == 2 * vocab * dim
    table = study["report"].read_text()
    assert f"{params['none']:,}" in table and f"{params['three_way']:,}" in table


def test_report_keeps_hand_written_text_and_p_values_are_recomputable(study):
    text = study["report"].read_text()
    assert text.startswith("# Study\n\nWritten by hand.") and text.endswith("Conclusions.\n")
    assert "old tables" not in text and text.count(BEGIN) == 1
    claim = next(line for line in text.splitlines() if "`l2norm` beats `dot` (three-way" in line)
    assert claim.endswith("| unresolved (2 of 3 seeds) |")  # 2 seeds decide no claim
    summary = json.loads((study["plots"] / "summary.json").read_text())
    cell = summary["three_way/l2norm"]
    refs = study["refs"].read_text().splitlines()

    def hyps(layer: str, seed: int) -> list[str]:
        name = f"tiny.transformer_twwt.three_way.{layer}.s{seed}"
        return (study["runs"] / name / "test.hyp.en").read_text().splitlines()

    again = seed_paired_bootstrap([(hyps("l2norm", s), hyps("dot", s)) for s in (1, 2)], refs,
                                  n_samples=200)
    assert cell["vs_dot"]["p"] == again["p"]
    assert cell["vs_dot"]["delta_bleu"] == pytest.approx(again["delta_bleu"])
    deltas = list(cell["vs_dot"]["per_seed_delta"].values())
    assert sum(deltas) / 2 == pytest.approx(again["delta_bleu"])
    assert cell["vs_dot"]["delta_ci95"] == pytest.approx(12.706 * abs(deltas[0] - deltas[1]) / 2,
                                                         rel=1e-3)  # t(0.975, 1) · sd / √2
    assert "vs_dot" not in summary["three_way/dot"] and "vs_untied" not in summary["none/dot"]
    untied = seed_paired_bootstrap([(hyps("dot", s), (study["runs"] / f"tiny.transformer_twwt."
                                                      f"none.dot.s{s}" / "test.hyp.en")
                                     .read_text().splitlines()) for s in (1, 2)], refs, 200)
    assert summary["three_way/dot"]["vs_untied"]["p"] == untied["p"]
    for png in ("bleu.png", "valid_nll.png", "norms_none.png", "norms_three_way.png"):
        assert (study["plots"] / png).read_bytes().startswith(b"\x89PNG")


def test_rebuild_from_committed_records_alone_gives_the_same_numbers(study, tmp_path):
    before = (study["plots"] / "summary.json").read_text()
    copy = {**study, "plots": tmp_path / "plots", "report": tmp_path / "results.md"}
    assert _study(copy) == 0
    assert (copy["plots"] / "summary.json").read_text() == before
    assert BEGIN in copy["report"].read_text()  # a report without markers gets the block


def test_records_scored_on_other_references_are_refused(study, tmp_path, capsys):
    other = tmp_path / "other.en"
    other.write_text("word1 word2\n" * len(study["refs"].read_text().splitlines()))
    bad = {**study, "refs": other, "plots": tmp_path / "p", "report": tmp_path / "r.md"}
    assert _study(bad) == 2
    assert "other references than --references" in capsys.readouterr().err
    assert not (tmp_path / "r.md").exists()


def test_runs_brought_back_without_checkpoints_export_only_when_asked(study, tmp_path, capsys):
    """A run trained elsewhere (a GPU machine) comes back without its checkpoints: the export
    names the flag that accepts it, and with the flag its record is the full record but for
    null row norms, and no norm histogram is drawn from it."""
    import shutil

    name = "tiny.transformer_twwt.none.dot.s1"
    runs = tmp_path / "runs"
    shutil.copytree(study["runs"] / name, runs / name, ignore=shutil.ignore_patterns("*.pt"))
    eval_json = json.loads((runs / name / "eval.json").read_text())
    eval_json["checkpoint"] = str(runs / name / "checkpoints" / Path(eval_json["checkpoint"]).name)
    (runs / name / "eval.json").write_text(json.dumps(eval_json))
    away = {**study, "records": tmp_path / "records", "plots": tmp_path / "plots",
            "report": tmp_path / "r.md"}
    assert _study(away, "--runs", str(runs)) == 2
    assert "--without-row-norms" in capsys.readouterr().err
    assert not list(away["records"].glob("*.json"))
    assert _study(away, "--runs", str(runs), "--without-row-norms") == 0
    record = Record.load(away["records"] / f"{name}.json")
    full = Record.load(study["records"] / f"{name}.json")
    assert record.output_row_norms is None and full.output_row_norms
    assert record.to_dict() == replace(full, output_row_norms=None).to_dict()
    assert (away["plots"] / "bleu.png").is_file()
    assert not (away["plots"] / "norms_none.png").exists()


def _block(path: Path, name: str) -> str:
    return block_text(path.read_text(), name)


@pytest.mark.xdist_group("named_study")  # with test_reproduce, which reuses its records
def test_a_study_by_name_prepares_trains_resumes_and_rebuilds_its_report(named_study):
    """``python -m fairseq_tying.launch study NAME`` (the ``named_study`` fixture's three
    calls): the data prepared by the manifest's arguments, the runs of ``--only`` trained and
    recorded, the block saying how many of the sweep's runs are; the next call trains only the
    others; ``--report-only`` rebuilds the same report from the records alone."""
    first, second = named_study / "first", named_study / "second"
    assert json.loads((first / "prep.json").read_text())["subword"] == "sentencepiece"
    assert sorted(p.stem for p in (first / "records").glob("*.json")) == [
        "tiny.transformer_twwt.none.dot.s1", "tiny.transformer_twwt.three_way.dot.s1"]
    block = _block(first / "results.md", "tiny")
    assert block.startswith("2 of 4 runs are recorded.\n\nScope: `tiny`; ")
    assert "; seed 1; " in block.split("\n\n")[1]  # the scope's seeds
    assert (first / "results.md").read_text().endswith("\n\nWritten by hand.\n")
    answer = _block(first / "README.md", "answer")
    assert answer.startswith("From the `tiny` study's 2 records.\n\nScope: `tiny`; ")
    scope = answer.split(". Δ: ")[0]  # the scope line: data, model, test set, seeds, budget
    sentences = len((named_study / "data" / "raw" / "test.en").read_text().splitlines())
    assert ("; `transformer_twwt`, 1+1 layers, D = 16, 0.01M parameters; "
            f"{sentences:,} test sentences; seed 1") in scope
    # the study's own block opens with the same scope
    assert block.startswith(f"2 of 4 runs are recorded.\n\n{scope.split(chr(10))[-1]}.\n")
    assert "\n| tying |" in answer
    assert "| three_way | `dot` |" in answer and "| unresolved (1 of 3 seeds) |" in answer
    assert "\n- Three-way tying against untied (`dot`): **too few seeds (1 of 3)**, " \
        in answer

    def s1_checkpoints(step: Path) -> dict[str, int]:
        return {k: v for k, v in json.loads((step / "mtimes.json").read_text()).items()
                if k.split("/")[0].endswith(".s1")}

    assert "already prepared" in (second / "output.txt").read_text()
    assert s1_checkpoints(first)
    assert s1_checkpoints(second) == s1_checkpoints(first)  # not trained again
    recorded = {p.name: p.read_bytes() for p in (first / "records").iterdir()}
    assert all((second / "records" / n).read_bytes() == b for n, b in recorded.items())
    assert len(list((second / "records").glob("*.json"))) == 4
    report = (second / "results.md").read_text()
    assert "4 of 4 runs are recorded.\n\nScope: " in report and "; seeds 1, 2; " in report
    summary = (second / "summary.json").read_text()
    assert json.loads(summary)["three_way/dot"]["vs_untied"]["n_seeds"] == 2

    # --report-only
    assert (named_study / "results.md").read_text() == report
    assert (named_study / "plots" / "summary.json").read_text() == summary
