"""The perplexity study's report is what its committed records give: the records of
tests/fixtures/lm_study (a tiny real sweep, tests/slurm/test_lm_study.py) rebuild their report
byte for byte, and docs/language_models.md's block is rebuilt from docs/lm/records once the
study has records."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from fairseq_tying.common.blocks import markers
from fairseq_tying.launch.studies import main as study
from fairseq_tying.launch.sweeps import recorded_stops
from fairseq_tying.studies.commands import main
from fairseq_tying.studies.records import records as study_records
from fairseq_tying.studies.statistics.cells import SeedDifference, Stat
from fairseq_tying.studies.statistics.stats import t_test_p
from fairseq_tying.studies.statistics.verdicts import interval as verdict
from fairseq_tying.sweeps.config import load_sweep
from tests.helpers import REPO

FIXTURE = REPO / "tests" / "fixtures" / "lm_study"
DOCS = REPO / "docs"
BEGIN, END = markers("lm")


def _rebuild(records: Path, report: Path, plots: Path) -> None:
    assert main(["study", "--records", str(records), "--report", str(report), "--plots",
                 str(plots), "--block", "lm"]) == 0


def test_fixture_records_rebuild_their_report_byte_for_byte(tmp_path):
    report = tmp_path / "report.md"
    report.write_text("# LM\n\n<!-- lm:begin -->\nold\n<!-- lm:end -->\n\nWritten by hand.\n")
    _rebuild(FIXTURE / "records", report, tmp_path)
    assert report.read_text() == (FIXTURE / "report.md").read_text()
    assert (tmp_path / "summary.json").read_text() == (FIXTURE / "summary.json").read_text()


def test_docs_block_is_what_the_committed_records_give(tmp_path, monkeypatch):
    text = (DOCS / "language_models.md").read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    records = DOCS / "lm" / "records"
    if not any(records.glob("*.json")):
        pytest.skip("the perplexity study has no committed records yet")
    report = tmp_path / "docs" / "language_models.md"
    report.parent.mkdir()
    report.write_text(text[:text.index(BEGIN)] + f"{BEGIN}\nold\n" + text[text.index(END):])
    monkeypatch.chdir(REPO)  # python -m fairseq_tying.launch study lm --report-only
    assert study(["lm", "--report-only", "--out", str(tmp_path)]) == 0
    assert report.read_text() == text
    assert (tmp_path / "docs" / "lm" / "summary.json").read_text() == \
        (DOCS / "lm" / "summary.json").read_text()


@pytest.mark.parametrize(("diffs", "want"), [
    ([-3.0, -2.5, -2.8], "supported"),
    ([3.0, 2.5, 2.8], "contradicted"),
    ([-3.0, 2.5, -0.1], "unresolved"),
    ([-3.0], "unresolved"),  # one seed: no CI
])
def test_the_verdict_follows_the_ci_of_the_paired_differences(diffs, want):
    """One comparison (no family): the t-test at p < 0.05 is the 95 % CI excluding 0."""
    diff = SeedDifference(stat=Stat.of(diffs), p=t_test_p(diffs),
                          seeds=tuple(range(1, len(diffs) + 1)))
    assert verdict(diff) == want
    if diff.stat.ci95 is not None:
        assert (abs(diff.stat.mean) > diff.stat.ci95) == (want != "unresolved")


def test_decoder_tied_cells_are_compared_with_tied_dot_seed_by_seed(tmp_path):
    _rebuild(FIXTURE / "records", tmp_path / "report.md", tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    ppl = {r.name: r.eval.perplexity for r in study_records.load(FIXTURE / "records")}
    tied_l = summary["decoder × dot + tiedL (D = 8)"]["vs_tied_dot"]
    assert tied_l["seeds"] == [1]
    assert tied_l["mean"] == pytest.approx(ppl["toy.transformer_lm_tied.decoder.dot.tiedL.s1"]
                                           - ppl["toy.transformer_lm_tied.decoder.dot.s1"])
    assert "vs_tied_dot" not in summary["decoder × dot"]
    assert "vs_tied_dot" not in summary["none × dot"]


def test_recorded_runs_tell_the_forecast_their_stop_epochs(tmp_path):
    sweep = load_sweep(REPO / "slurm" / "bible_lm.yaml", check_data=False)
    runs = sweep.runs[:3]
    (record,) = [r for r in study_records.load(FIXTURE / "records") if r.train.stop is not None][:1]
    for name, epoch in ((runs[0].name, 12), (runs[2].name, 15), ("bible_en.other", 30)):
        stop = replace(record.train.stop, epoch=epoch)
        replace(record.renamed(name), train=replace(record.train, stop=stop)).save(
            tmp_path / f"{name}.json")
    assert recorded_stops(tmp_path, runs) == [12, 15]
    seed1 = [r for r in sweep.runs if r.name.endswith((".none.dot.s1", ".decoder.dot.s1"))]
    assert recorded_stops(REPO / "docs" / "lm" / "records", seed1) == [12, 15]  # committed


def test_every_record_replays_the_command_that_built_its_model():
    """Each record's ``train_args`` is its sweep's command for the run, so replaying it builds
    the model that was trained (four early records lacked the pre-norm width flags that the
    preset gave then and the sweep states now)."""
    sweep = load_sweep(REPO / "slurm" / "bible_lm.yaml", check_data=False)
    commands = {r.name: r.identity.train_args for r in sweep.runs}
    recorded = study_records.load(DOCS / "lm" / "records")
    assert len(recorded) == 21
    for r in recorded:
        assert r.run.train_args == commands[r.name], r.name
