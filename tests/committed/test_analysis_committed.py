"""docs/results.md's embedding analyses are what ``python -m fairseq_tying.analysis`` wrote:
each block is its folder's analysis.md, and that table is what its analysis.json gives."""

from __future__ import annotations

import json

import pytest

from fairseq_tying import analysis
from fairseq_tying.common.atomic import markers
from tests.helpers import REPO

DOCS = REPO / "docs"
ANALYSES = {"analysis_equal": DOCS / "analysis" / "equal"}  # block: the tool's --out folder


def _block(name: str) -> str:
    begin, end = markers(name)
    text = (DOCS / "results.md").read_text()
    return text[text.index(begin) + len(begin) + 1:text.index(end)]


@pytest.mark.parametrize("block", ANALYSES)
def test_the_block_is_the_analysis_table(block):
    assert _block(block) == (ANALYSES[block] / "analysis.md").read_text()


@pytest.mark.parametrize("block", ANALYSES)
def test_the_table_is_what_the_json_gives(block):
    data = json.loads((ANALYSES[block] / "analysis.json").read_text())
    reports = [analysis.ModelReport(**{**m, "matrices": [analysis.MatrixReport(**x)
                                                        for x in m["matrices"]]})
               for m in data["models"]]
    assert analysis.markdown(reports, data["word_vector"]) == \
        (ANALYSES[block] / "analysis.md").read_text()


def test_the_equal_models_are_seed_1_at_the_full_budget():
    """The trained models analysed are the equal-training study's seed-1 scored checkpoints
    (the average of epochs 36–40, 11,440 updates), one per cell."""
    data = json.loads((ANALYSES["analysis_equal"] / "analysis.json").read_text())
    cells = [(m["tying"], m["output_layer"]) for m in data["models"]]
    assert len(cells) == len(set(cells)) >= 2
    for m in data["models"]:
        assert m["checkpoint"].endswith(".s1/checkpoints/checkpoint.avg5.pt")
        assert m["num_updates"] == 11440
