"""docs/embeddings.md's and docs/language_models.md's embedding analyses are what ``python -m
fairseq_tying.analysis`` wrote: each block is its folder's analysis.md, that table is what its
analysis.json gives (``--table-from``, byte for byte), and the intervals the prose quotes are
the table's."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from fairseq_tying import analysis
from fairseq_tying.common.blocks import block_text
from fairseq_tying.studies.records.record import Record
from tests.helpers import REPO

DOCS = REPO / "docs"
ANALYSES = {"analysis_equal": DOCS / "analysis" / "equal",  # block: the tool's --out folder
            "analysis_equal_e3": DOCS / "analysis" / "equal_e3",
            "analysis_equal_fixnorm": DOCS / "analysis" / "equal_fixnorm"}
# every analysis table of the docs: (report, block) -> its folder
TABLES = {**{("embeddings.md", block): folder for block, folder in ANALYSES.items()},
          ("embeddings.md", "analysis"): DOCS / "analysis",  # the one-epoch study's
          ("language_models.md", "analysis"): DOCS / "lm" / "analysis"}
CELLS = {"analysis_equal": {("three_way", layer, 1)
                            for layer in ("dot", "l2norm", "sqnorm", "distance", "cosine")},
         "analysis_equal_e3": {("none", "dot", 1), ("decoder", "dot", 1)},
         "analysis_equal_fixnorm": {("three_way", "fixnorm", 1), ("three_way", "dot", 4),
                                    ("three_way", "l2norm", 4)}}


def _analysis(block: str) -> dict:
    return json.loads((ANALYSES[block] / "analysis.json").read_text())


def _block(name: str) -> str:
    return block_text((DOCS / "embeddings.md").read_text(), name)


@pytest.mark.parametrize("report, block", TABLES)
def test_the_block_is_the_analysis_table(report, block):
    assert block_text((DOCS / report).read_text(), block) == \
        (TABLES[report, block] / "analysis.md").read_text()


@pytest.mark.parametrize("report, block", TABLES)
def test_the_table_is_what_the_json_gives(report, block):
    folder = TABLES[report, block]
    data = json.loads((folder / "analysis.json").read_text())
    reports = [analysis.ModelReport(**{**m, "matrices": [analysis.MatrixReport(**x)
                                                        for x in m["matrices"]]})
               for m in data["models"]]
    # no pair's cosine was kept with these: each difference is the bound, and the note says so
    assert not (folder / analysis.PAIR_SCORES).exists()
    table = analysis.markdown(reports, data["word_vector"])
    assert table == (folder / "analysis.md").read_text()
    assert ("no paired test" in table) == any(len(m["matrices"]) > 1 for m in data["models"])


@pytest.mark.parametrize("report, block", TABLES)
def test_table_from_rebuilds_the_table_and_the_block_byte_for_byte(report, block, tmp_path):
    folder = tmp_path / "analysis"
    folder.mkdir()
    shutil.copy(TABLES[report, block] / "analysis.json", folder)
    shutil.copy(DOCS / report, tmp_path / report)
    (tmp_path / report).write_text(  # the block emptied: rebuilt from the JSON alone
        (DOCS / report).read_text().replace(block_text((DOCS / report).read_text(), block), ""))
    assert analysis.main(["--table-from", str(folder), "--report", str(tmp_path / report),
                          "--block", block]) == 0
    assert (folder / "analysis.md").read_text() == (TABLES[report, block] / "analysis.md"
                                                    ).read_text()
    assert (tmp_path / report).read_text() == (DOCS / report).read_text()


def _cells(table: str) -> set[str]:
    """Every ρ with its interval and every difference with its bound in a table, as printed."""
    return set(re.findall(r"-?\d\.\d{3} \[-?\d\.\d\d, -?\d\.\d\d\]", table)) | set(
        re.findall(r"[+-]\d\.\d{3} \[[+-]\d\.\d\d, [+-]\d\.\d\d\]", table))


def _quoted(prose: str) -> set[str]:
    return set(re.findall(r"[+-]?\d\.\d{3} \[[+-]?\d\.\d\d, [+-]?\d\.\d\d\]", prose))


def _rhos(text: str) -> set[str]:
    return {x.lstrip("+-") for x in re.findall(r"[+-]?\d\.\d{3}\b", text)}


@pytest.mark.parametrize("report, section, blocks", [
    ("embeddings.md", "# What the embeddings learned",
     ["analysis_equal", "analysis_equal_e3", "analysis_equal_fixnorm", "analysis"]),
    ("language_models.md", "## What the embeddings learned", ["analysis"])])
def test_every_rho_and_interval_the_prose_quotes_is_in_a_table(report, section, blocks):
    text = (DOCS / report).read_text()
    tables = "".join(block_text(text, b) for b in blocks)
    prose = text.split(section, 1)[1]
    for b in blocks:
        prose = prose.replace(block_text(text, b), "")
    prose = " ".join(prose.split())  # a quote broken across lines
    assert len(_quoted(prose)) >= 2 and _quoted(prose) <= _cells(tables)
    assert len(_rhos(prose)) >= 6 and _rhos(prose) <= _rhos(tables)


@pytest.mark.parametrize("block", ANALYSES)
def test_the_equal_models_are_the_named_seeds_at_the_full_budget(block):
    """The trained models analysed are the equal-training study's scored checkpoints (the
    average of epochs 36–40, 11,440 updates), one per cell: E1's five output layers and E3's
    untied and decoder-tied ``dot`` at seed 1, ``fixnorm`` at seed 1 beside F1's seed-4
    ``dot`` and ``l2norm``."""
    data = _analysis(block)
    cells = [(m["tying"], m["output_layer"], _seed(m["checkpoint"])) for m in data["models"]]
    assert len(cells) == len(set(cells)) and set(cells) == CELLS[block]
    for m in data["models"]:
        assert m["checkpoint"].endswith("/checkpoints/checkpoint.avg5.pt")
        assert m["num_updates"] == 11440


def _seed(checkpoint: str) -> int:
    run = checkpoint.split("/checkpoints/")[0]
    return int(run.rsplit(".s", 1)[1])


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


def test_fixnorm_reports_its_learned_gain_and_only_fixnorm_has_one():
    """g starts at √D (D = 128) and is learned: the committed analysis gives the trained value
    beside the initial one for ``fixnorm`` alone."""
    data = _analysis("analysis_equal_fixnorm")
    learned = {m["output_layer"]: m["parameters"] for m in data["models"]}
    assert learned["dot"] == learned["l2norm"] == {}
    gain, initial = learned["fixnorm"]["gain"]["value"], learned["fixnorm"]["gain"]["initial_value"]
    assert initial == pytest.approx(128 ** 0.5) and gain > 0 and gain != pytest.approx(initial)
    assert f"gain {gain:.2f} (from {initial:.2f})" in _block("analysis_equal_fixnorm")


def test_fixnorm_rows_have_one_length_across_sides_as_l2norm_and_unlike_dot():
    """docs/embeddings.md: under ``fixnorm`` and ``l2norm`` a row's length enters no score, and
    source-only, target-only and shared pieces end with rows of one length; under ``dot`` the
    source-only rows (never a softmax answer) are shorter, and length follows frequency more."""
    data = _analysis("analysis_equal_fixnorm")
    matrix = {m["output_layer"]: m["matrices"][0] for m in data["models"]}
    for layer in ("fixnorm", "l2norm"):
        norms = [g["mean_norm"] for g in matrix[layer]["norm_by_side"].values()]
        assert max(norms) / min(norms) < 1.05
        assert matrix[layer]["norm_frequency_spearman"] < matrix["dot"]["norm_frequency_spearman"]
    dot = matrix["dot"]["norm_by_side"]
    assert dot["source only"]["mean_norm"] < 0.8 * dot["target only"]["mean_norm"]
