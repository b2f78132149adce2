"""The numbers in docs/results.md are what the committed study records give."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fairseq_tying.evaluation.cli import main
from fairseq_tying.evaluation.study import BEGIN, END, LAYERS, TYINGS

DOCS = Path(__file__).resolve().parents[1] / "docs"
RECORDS = DOCS / "study" / "records"


def test_the_study_covers_the_grid_with_three_seeds():
    records = [json.loads(p.read_text()) for p in RECORDS.glob("*.json")]
    cells = {(r["tying"], r["output_layer"], r["seed"]) for r in records}
    assert cells == {(t, la, s) for t in TYINGS for la in LAYERS for s in (1, 2, 3)}
    for r in records:
        assert r["train"]["valid"]["num_updates"] == 600 and r["checkpoint"] == "checkpoint_last.pt"
        assert (r["eval"]["beam"], r["eval"]["lenpen"], r["eval"]["n_sentences"]) == (5, 1.0, 1434)


@pytest.mark.slow
def test_rebuilding_from_the_records_reproduces_the_report(tmp_path):
    report = tmp_path / "results.md"
    assert main(["study", "--records", str(RECORDS), "--report", str(report),
                 "--plots", str(tmp_path)]) == 0
    assert (tmp_path / "summary.json").read_text() == (DOCS / "study" / "summary.json").read_text()

    def block(text: str) -> str:
        return text[text.index(BEGIN):text.index(END)]

    assert block(report.read_text()) == block((DOCS / "results.md").read_text())
