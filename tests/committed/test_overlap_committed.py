"""docs/data.md's held-out–training overlap is docs/data/overlap.json, and that file is what
``python -m fairseq_tying.data.bible overlap`` writes from the embedded corpus."""

from __future__ import annotations

import json

import pytest

from tests.helpers import REPO, run_module

DOCS = REPO / "docs"
COMMITTED = DOCS / "data" / "overlap.json"
SIDES = {"en": "English (target)", "es": "Spanish (source)"}


def _committed() -> dict:
    return json.loads(COMMITTED.read_text())


def _verse(verse_id: str) -> str:
    return verse_id.split("=")[0]  # "Titus 3:15=3:14+3:15": the Spanish slots' name


@pytest.mark.slow
def test_the_committed_overlap_is_what_the_command_writes(tmp_path):
    data = _committed()
    command = data["command"].split()
    assert command[:4] == ["python", "-m", "fairseq_tying.data.bible", "overlap"]
    run_module("fairseq_tying.data.bible", "overlap", "--out", tmp_path / "overlap.json")
    assert (tmp_path / "overlap.json").read_text() == COMMITTED.read_text()


def test_the_counts_table_is_the_committed_one():
    data = _committed()
    rows = [f"| {split}, {SIDES[lang]} | {r['sentences']:,} | {r['at_least']['0.5']} | "
            f"{r['at_least']['0.8']} |"
            for split, langs in data["splits"].items() for lang, r in langs.items()]
    assert len(rows) == 4
    text = (DOCS / "data.md").read_text()
    assert "\n".join(rows) in text
    assert data["command"] in text


def test_the_closest_test_pairs_are_every_one_of_at_least_half():
    test_en = _committed()["splits"]["test"]["en"]
    half = [c for c in test_en["closest"] if c["fraction"] >= 0.5]
    assert len(half) == test_en["at_least"]["0.5"] < len(test_en["closest"])  # all listed
    rows = [f"| {_verse(c['heldout_id'])} | {_verse(c['train_id'])} | {c['shared']}/"
            f"{c['total']} |" for c in half]
    assert "\n".join(rows) in (DOCS / "data.md").read_text()
    # the one repeated whole, and its Spanish side, as the prose says
    assert (half[0]["heldout_id"], half[0]["train_id"], half[0]["fraction"]) == \
        ("John 12:8=12:8", "Matthew 26:11=26:11", 1.0)
    es = {c["heldout_id"]: c for c in _committed()["splits"]["test"]["es"]["closest"]}
    assert (es["John 12:8=12:8"]["shared"], es["John 12:8=12:8"]["total"]) == (5, 13)
