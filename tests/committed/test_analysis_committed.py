"""docs/results.md's embedding analyses are what ``python -m fairseq_tying.analysis`` wrote:
each block is its folder's analysis.md, and that table is what its analysis.json gives."""

from __future__ import annotations

import json

import pytest

from fairseq_tying import analysis
from fairseq_tying.common.atomic import block_text, markers
from tests.helpers import REPO

DOCS = REPO / "docs"
ANALYSES = {"analysis_equal": DOCS / "analysis" / "equal",  # block: the tool's --out folder
            "analysis_equal_e3": DOCS / "analysis" / "equal_e3"}
CELLS = {"analysis_equal": {("three_way", layer)
                            for layer in ("dot", "l2norm", "sqnorm", "distance", "cosine")},
         "analysis_equal_e3": {("none", "dot"), ("decoder", "dot")}}


@pytest.mark.parametrize("block", ANALYSES)
def test_the_block_is_the_analysis_table(block):
    assert block_text((DOCS / "results.md").read_text(), block) == \
        (ANALYSES[block] / "analysis.md").read_text()


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
    prose = " ".join(text[text.index(end):text.index("#### Tying modes")].split())
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


def _roles(block: str, tying: str, layer: str = "dot") -> dict[str, dict]:
    """A model's matrices by the roles they take, e.g. "decoder input = decoder output"."""
    data = json.loads((ANALYSES[block] / "analysis.json").read_text())
    (model,) = [m for m in data["models"] if (m["tying"], m["output_layer"]) == (tying, layer)]
    return {" = ".join(x["roles"]): x for x in model["matrices"]}


def _e3_prose() -> str:
    text = (DOCS / "results.md").read_text()
    _, end = markers("analysis_equal_e3")
    return " ".join(text[text.index(end):text.index("### After one epoch")].split())


def _minus(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}".replace("-", "−")


def test_the_e3_prose_is_what_the_json_gives():
    """Every number of the prose under the E3 table follows from its analysis.json and, for
    three-way tying's matrix, from E1's."""
    none, dec = _roles("analysis_equal_e3", "none"), _roles("analysis_equal_e3", "decoder")
    (three,) = _roles("analysis_equal", "three_way").values()
    inputs = [none["encoder input"], none["decoder input"], dec["encoder input"]]
    outputs = [none["decoder output"], dec["decoder input = decoder output"], three]

    def whole(x: dict, bench: str) -> dict:
        return x["similarity"][f"{bench} whole-word"]

    out = none["decoder output"]
    phrases = [" and ".join(f"{b} ρ = {_minus(whole(out, b)['spearman'])}"
                            for b in ("SimLex-999", "WordSim-353"))]
    for x in (*outputs[1:], dec["encoder input"]):
        phrases.append(" and ".join(_minus(whole(x, b)["spearman"])
                                    for b in ("SimLex-999", "WordSim-353")))
    phrases.append(", and ".join(" and ".join(_minus(whole(x, b)["spearman"]) for x in inputs[:2])
                                 for b in ("SimLex-999", "WordSim-353")))
    p_out = max(whole(x, b)["pvalue"] for x in outputs for b in ("SimLex-999", "WordSim-353"))
    p_in = min(whole(x, b)["pvalue"] for x in inputs for b in ("SimLex-999", "WordSim-353"))
    phrases += [f"(p ≤ {p_out:.3f} for the three", f"(p ≥ {p_in:.2f} for the three"]
    rho_in = [x["norm_frequency_spearman"] for x in inputs]
    assert max(rho_in) < 0
    phrases += [f"from {_minus(min(rho_in))} to {_minus(max(rho_in))})",
                *(f"{x['norm_frequency_spearman']:+.2f}" for x in outputs)]
    unseen = {round(x["mean_norm_unseen"], 2) for x in inputs}
    phrases += [f"mean ‖w‖ {unseen.pop():.2f}", *(f"{x['mean_norm_unseen']:.2f}"
                                                  for x in outputs[:2])]
    assert not unseen  # one value for every input-only matrix
    cos_in = [x["mean_pairwise_cosine"] for x in inputs]
    phrases += [f"mean cosine {min(cos_in):.3f}–{max(cos_in):.3f}",
                *(f"{x['mean_pairwise_cosine']:.3f}" for x in outputs)]
    prose = _e3_prose()
    missing = [p for p in phrases if p not in prose]
    assert not missing, missing


def test_the_retrained_untied_model_is_compared_with_its_record():
    """The E3 prose's comparison of the retrained untied model with its record: the same
    command, validation NLL apart from the first epoch, the largest gap and both BLEUs."""
    name = "bible.transformer_twwt.none.dot.s1.json"
    record = json.loads((DOCS / "equal" / "records" / name).read_text())
    again = json.loads((ANALYSES["analysis_equal_e3"] / "retrained" / name).read_text())
    assert again["train_args"] == record["train_args"]
    a, b = ([v for _, v in r["train"]["valid_history"]] for r in (record, again))
    assert len(a) == len(b) == 40 and a[0] != b[0]
    gap = max(abs(x - y) for x, y in zip(a, b, strict=True))
    phrases = [f"{b[0]:.3f} against the record's {a[0]:.3f} after epoch 1",
               f"{b[-1]:.3f} against {a[-1]:.3f} after epoch 40",
               f"never more than {gap:.3f} apart",
               f"scores {again['eval']['bleu']:.2f} BLEU",
               f"has {record['eval']['bleu']:.2f}"]
    prose = _e3_prose()
    missing = [p for p in phrases if p not in prose]
    assert not missing, missing
