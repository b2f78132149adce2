"""docs/embeddings.md's embedding analyses are what ``python -m fairseq_tying.analysis`` wrote:
each block is its folder's analysis.md, and that table is what its analysis.json gives."""

from __future__ import annotations

import json

import pytest

from fairseq_tying import analysis
from fairseq_tying.common.atomic import block_text
from fairseq_tying.studies.record import Record
from tests.helpers import REPO

DOCS = REPO / "docs"
ANALYSES = {"analysis_equal": DOCS / "analysis" / "equal",  # block: the tool's --out folder
            "analysis_equal_e3": DOCS / "analysis" / "equal_e3"}
CELLS = {"analysis_equal": {("three_way", layer)
                            for layer in ("dot", "l2norm", "sqnorm", "distance", "cosine")},
         "analysis_equal_e3": {("none", "dot"), ("decoder", "dot")}}


def _block(name: str) -> str:
    return block_text((DOCS / "embeddings.md").read_text(), name)


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


@pytest.mark.parametrize("block", ANALYSES)
def test_the_equal_models_are_seed_1_at_the_full_budget(block):
    """The trained models analysed are the equal-training study's seed-1 scored checkpoints
    (the average of epochs 36–40, 11,440 updates): E1's five output layers in one table, E3's
    untied and decoder-tied ``dot`` in the other, one model per cell."""
    data = json.loads((ANALYSES[block] / "analysis.json").read_text())
    cells = [(m["tying"], m["output_layer"]) for m in data["models"]]
    assert len(cells) == len(set(cells)) and set(cells) == CELLS[block]
    for m in data["models"]:
        assert m["checkpoint"].endswith(".s1/checkpoints/checkpoint.avg5.pt")
        assert m["num_updates"] == 11440


def test_the_retrained_untied_model_is_its_records_command_on_another_machine():
    """The untied model of the E3 analysis was trained again by its record's command: its
    validation NLL differs from the record's from the first epoch on, and its BLEU by less
    than the cell's seeds differ (docs/embeddings.md)."""
    name = "bible.transformer_twwt.none.dot.s1.json"
    record = Record.load(DOCS / "equal" / "records" / name, hypotheses=False)
    again = Record.load(ANALYSES["analysis_equal_e3"] / "retrained" / name, hypotheses=False)
    assert again.run.train_args == record.run.train_args
    a, b = ([v for _, v in r.train.valid_history] for r in (record, again))
    assert len(a) == len(b) == 40 and a[0] != b[0]
    seeds = [Record.load(p, hypotheses=False).eval.bleu
             for p in (DOCS / "equal" / "records").glob("bible.transformer_twwt.none.dot.s*.json")]
    assert abs(again.eval.bleu - record.eval.bleu) < max(seeds) - min(seeds)


def test_the_language_models_block_is_its_analysis_table():
    assert block_text((DOCS / "language_models.md").read_text(), "analysis") == \
        (DOCS / "lm" / "analysis" / "analysis.md").read_text()
