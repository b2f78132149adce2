"""The low-resource study (docs/results.md, "Low-resource: a quarter of the Bible"): its
pilot's record set the budget of its sweep, its records are its sweep's runs trained to that
budget, and its answer (docs/quarter/answer.md and the results.md block) is what ``studies
answer --records-only`` writes from the committed records."""

from __future__ import annotations

import shutil

import pytest

from fairseq_tying.common.atomic import write_lines
from fairseq_tying.common.blocks import block_text
from fairseq_tying.data.bible import read_split
from fairseq_tying.studies.commands import main as studies
from fairseq_tying.studies.records import records
from fairseq_tying.sweeps.config import load_sweep
from tests.helpers import REPO

QUARTER = REPO / "docs" / "quarter"
SWEEP = "slurm/bible_quarter.yaml"
BESIDE = ["docs/equal/summary.json", "the full corpus"]


def _sweep():
    return load_sweep(REPO / SWEEP, check_data=False)


def test_the_budget_is_the_pilots_stop_epoch():
    (pilot,) = records.load(QUARTER / "pilot" / "records", hypotheses=False)
    assert pilot.train.stop.reason == "plateau"
    (epochs,) = {r.stopping["max_epoch"] for r in _sweep().runs}
    assert epochs == pilot.train.stop.epoch
    assert all(r.stopping["plateau"] is False for r in _sweep().runs)


@pytest.mark.skipif(not (QUARTER / "answer.md").is_file(), reason="the low-resource study's "
                    "answer is not recorded yet: python -m fairseq_tying.studies answer "
                    f"{SWEEP} --out docs/quarter ...")
def test_the_answer_is_rebuilt_from_the_records(tmp_path, monkeypatch):
    recs = records.load(QUARTER / "records", hypotheses=False)
    assert {r.name for r in recs} == {r.name for r in _sweep().runs}
    (budget,) = {r.stopping["max_epoch"] for r in _sweep().runs}
    assert all(r.train.stop.epoch == budget and r.train.stop.reason == "budget" for r in recs)
    refs = write_lines(tmp_path / "test.en", read_split("test", "en"))
    out = tmp_path / "quarter"
    shutil.copytree(QUARTER / "records", out / "records")
    report = tmp_path / "results.md"
    shutil.copyfile(REPO / "docs" / "results.md", report)
    monkeypatch.chdir(REPO)
    assert studies(["answer", SWEEP, "--records-only", "--out", str(out), "--references",
                    str(refs), "--report", str(report), "--block", "quarter",
                    "--beside", *BESIDE]) == 0
    assert (out / "answer.md").read_text() == (QUARTER / "answer.md").read_text()
    committed = (REPO / "docs" / "results.md").read_text()
    assert block_text(report.read_text(), "quarter") == block_text(committed, "quarter")


def test_the_guides_cost_row_is_its_record():
    (record,) = [r for r in records.load(QUARTER / "records", hypotheses=False)
                 if r.name == "bible_quarter.transformer_twwt.three_way.dot.s1"]
    (budget,) = {r.stopping["max_epoch"] for r in _sweep().runs}
    seconds = record.train.train_seconds
    guide = (REPO / "docs" / "your_data.md").read_text()
    assert f"({budget} epochs in {seconds:,} s)" in guide
    assert f"| {round(seconds / budget)} s |" in guide and record.train.torch.startswith("2.13.0")
