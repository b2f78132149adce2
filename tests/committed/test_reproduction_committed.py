"""The committed reproduction of a recorded run (docs/reproduction/equal, written by
``python -m fairseq_tying.launch study equal --reproduce DIR --only NAME``): its table is what
its comparison.json gives, and its "record" column is the committed record's."""

from __future__ import annotations

import json

from fairseq_tying.studies.records import reproduction
from fairseq_tying.studies.records.record import Record
from tests.helpers import REPO

FOLDER = REPO / "docs" / "reproduction" / "equal"
RECORDS = REPO / "docs" / "equal" / "records"


def _comparison() -> dict:
    return json.loads((FOLDER / "comparison.json").read_text())


def test_the_table_is_what_its_json_gives():
    assert reproduction.markdown(_comparison()) == (FOLDER / "comparison.md").read_text()


def test_the_record_column_is_the_committed_record():
    runs = _comparison()["runs"]
    assert runs
    for run in runs:
        facts = reproduction.facts(Record.load(RECORDS / f"{run['run']}.json"))
        assert {s["metric"]: s["record"] for s in run["scores"]} == facts.scores
        for s in run["scores"]:
            assert s["difference"] == s["reproduction"] - s["record"]
            assert s["within"] is (s["seeds_min"] - 1e-9 <= s["reproduction"]
                                   <= s["seeds_max"] + 1e-9)
        assert run["machine"]["record"]["cpu"] == (facts.cpu or reproduction.NOT_RECORDED)
