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


def _matrix(data: dict, layer: str) -> dict:
    (model,) = [m for m in data["models"] if m["output_layer"] == layer]
    (matrix,) = model["matrices"]  # three-way tying: one matrix in every role
    return matrix


def _span(values: list[float]) -> str:
    return f"{min(values):.2f}–{max(values):.2f}"


def test_the_e1_prose_is_what_the_json_gives():
    """Every number of the prose under the E1 table follows from its analysis.json."""
    data = json.loads((ANALYSES["analysis_equal"] / "analysis.json").read_text())
    text = (DOCS / "results.md").read_text()
    _, end = markers("analysis_equal")
    prose = " ".join(text[text.index(end):text.index("### After one epoch")].split())
    m = {la: _matrix(data, la) for la in ("dot", "l2norm", "sqnorm", "distance", "cosine")}
    rho = {la: x["norm_frequency_spearman"] for la, x in m.items()}
    side = {la: {s: g["mean_norm"] for s, g in x["norm_by_side"].items()} for la, x in m.items()}
    cos = {la: x["mean_pairwise_cosine"] for la, x in m.items()}
    phrases = []
    for bench, pairs in (("SimLex-999", 117), ("WordSim-353", 24)):
        whole = [x["similarity"][f"{bench} whole-word"] for x in m.values()]
        assert {s["pairs_scored"] for s in whole} == {pairs}
        phrases.append(f"{bench} ρ = {_span([s['spearman'] for s in whole])} ({pairs} pairs, "
                       f"p ≤ {max(s['pvalue'] for s in whole):.3f})")
    every = [x["similarity"][b] for x in m.values() for b in ("SimLex-999", "WordSim-353")]
    assert max(s["spearman"] for s in every) < 0.05
    phrases.append(f"(p ≥ {min(s['pvalue'] for s in every):.2f})")
    for la in ("dot", "distance"):
        phrases.append(f"{side[la]['source only']:.2f} against {side[la]['target only']:.2f}")
    assert f"{rho['dot']:.2f}" == f"{rho['distance']:.2f}"
    phrases += [f"ρ(norm, frequency) {rho['dot']:.2f} for both",
                f"mean length ({_span(list(side['l2norm'].values()))})",
                f"(ρ = {rho['l2norm']:.2f} against {rho['dot']:.2f})",
                f"(ρ(norm, frequency) = {rho['sqnorm']:.2f}, the most negative)".replace("-", "−"),
                f"({side['sqnorm']['target only']:.2f} against "
                f"{side['sqnorm']['source only']:.2f})",
                f"(mean cosine {cos['sqnorm']:.3f} against "
                f"{min(v for k, v in cos.items() if k != 'sqnorm'):.3f}–{max(cos.values()):.3f})",
                f"lengths ({_span(list(side['cosine'].values()))})",
                f"(ρ(norm, frequency) = {rho['cosine']:.2f})".replace("-", "−"),
                f"has {rho['l2norm']:+.2f}"]
    assert min(rho, key=rho.get) == "sqnorm" and min(cos, key=cos.get) == "sqnorm"
    missing = [p for p in phrases if p not in prose]
    assert not missing, missing
