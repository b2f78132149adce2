"""The perplexity study's report is what its committed records give: the records of
tests/fixtures/lm_study (a tiny real sweep, tests/slurm/test_lm_study.py) rebuild their report
byte for byte, and docs/language_models.md's block is rebuilt from docs/lm/records once the
study has records."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from fairseq_tying.common.blocks import block_text, markers
from fairseq_tying.launch.studies import main as study
from fairseq_tying.launch.sweeps import recorded_stops
from fairseq_tying.studies.commands import main
from fairseq_tying.studies.engine import engine
from fairseq_tying.studies.engine.specs import LM
from fairseq_tying.studies.records import records as study_records
from fairseq_tying.studies.statistics import verdicts
from fairseq_tying.studies.statistics.cells import SeedDifference, Stat
from fairseq_tying.studies.statistics.stats import t_test_p
from fairseq_tying.studies.statistics.verdicts import lower
from fairseq_tying.studies.views import view_lm
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


def _diff(values: list[float], p: float | None = None) -> SeedDifference:
    """A per-seed difference of test perplexity over seeds 1..n, its p the t-test's."""
    return SeedDifference(stat=Stat.of(values), p=t_test_p(values) if p is None else p,
                          seeds=tuple(range(1, len(values) + 1)))


def test_a_clean_all_negative_difference_is_supported_after_holm():
    """Three comparisons, three seeds each (df = 2, where the two-sided p of the t-test is
    1 − |t|/√(t² + 2)): (−4, −5, −6) has t = −5√3, p = 1 − 5√3/√77 = 0.0131, Holm 3p = 0.039:
    supported; (−2, −3, −4) has t = −3√3, p = 1 − 3√3/√29 = 0.0351, Holm 2p = 0.070: decided
    on its raw p, not after Holm; (+0.5, −0.5, +0.2) is within the seeds' spread."""
    family = verdicts.adjust([_diff([-4.0, -5.0, -6.0]), _diff([-2.0, -3.0, -4.0]),
                              _diff([0.5, -0.5, 0.2])])
    p1, p2 = 1 - 5 * math.sqrt(3) / math.sqrt(77), 1 - 3 * math.sqrt(3) / math.sqrt(29)
    assert [d.p for d in family[:2]] == pytest.approx([p1, p2])
    assert [d.p_holm for d in family[:2]] == pytest.approx([3 * p1, 2 * p2])
    assert [lower(d) for d in family] == [
        "supported", "unresolved (not significant after Holm)",
        "unresolved (within the seeds' spread)"]
    assert lower(verdicts.without_holm(family[1])) == "supported"
    assert lower(replace(family[0], stat=Stat.of([4.0, 5.0, 6.0]))) == "contradicted"
    assert lower(_diff([-4.0, -5.0])) == "unresolved (2 of 3 seeds)"


def test_seeds_of_mixed_sign_give_unresolved():
    """Five seeds, four at −1 and one at +0.2: mean −0.76, sd √0.288, t = −3.17, and with
    df = 4 the two-sided p = 1 − (3/2)|x|(1 − x²/3), x = t/√(t² + 4): 0.034. The t-test alone
    would decide the claim; a seed of the other sign leaves it unresolved. With three seeds a
    seed of the other sign (or at 0) keeps |t| at most 2 (two equal seeds and a 0), below the
    4.30 that p < 0.05 needs, so there the t-test fails first."""
    five = _diff([-1.0, -1.0, -1.0, -1.0, 0.2])
    t = -0.76 / (math.sqrt(0.288) / math.sqrt(5))
    x = t / math.sqrt(t * t + 4)
    assert five.p == pytest.approx(1 - 1.5 * abs(x) * (1 - x * x / 3)) and five.p < 0.05
    assert lower(five) == "unresolved (seeds differ in sign)"
    assert lower(_diff([-1.0, -1.2, 0.1])) == "unresolved (within the seeds' spread)"


def test_a_cell_still_learning_makes_its_claim_unresolved():
    """The committed records, with the untied runs' last validation made 1 % lower than their
    best before the last 3 epochs: the untied cell still learns at its budget (gain 1 % ≥
    0.5 %), so the one supported comparison, decoder × distance against it, is unresolved."""
    recs = study_records.load(DOCS / "lm" / "records")
    summary = engine.sections(LM, recs)[0].summary
    assert summary["decoder × distance"].test("vs_untied_dot").verdict == "supported"

    def learning(r):
        if r.run.tying != "none":
            return r
        *head, (epoch, update, _) = r.train.valid_epochs
        best = min(v for _, _, v in head[:-2])
        return replace(r, train=replace(r.train, valid_epochs=[*head,
                                                               [epoch, update, 0.99 * best]]))

    summary = engine.sections(LM, [learning(r) for r in recs])[0].summary
    assert summary["none × dot"].learning.gains == pytest.approx((0.01, 0.01, 0.01))
    assert summary["decoder × distance"].test("vs_untied_dot").verdict == \
        "unresolved (still learning at the budget: none × dot)"
    assert summary["decoder × distance"].test("vs_tied_dot").verdict == \
        "unresolved (not significant after Holm)"  # undecided already: its own reason


def test_press_and_wolf_is_not_contradicted_by_another_setting():
    """The side-by-side table's word follows the verdict; a difference against their finding in
    our setting (a Transformer on the Bible, not LSTMs on the Penn Treebank) reads "not
    replicated here", never "contradicted"; a comparison that decides nothing is unresolved,
    not "not replicated here" (which is for a counted difference, ``verdicts.PAPER_RULE``)."""
    words = {verdict: view_lm._in_words(replace(_diff([-4.0, -5.0, -6.0]), verdict=verdict))
             for verdict in ("supported", "contradicted",
                             "unresolved (not significant after Holm)")}
    assert words == {"supported": "yes (supported)",
                     "contradicted": "not replicated here (tying raised it)",
                     "unresolved (not significant after Holm)":
                         "unresolved (not significant after Holm)"}


def _holm(ps: list[float]) -> list[float]:
    """Holm's adjusted p-values, written out again: the j-th smallest times (m − j + 1), never
    below the one before it."""
    out, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(sorted(range(len(ps)), key=ps.__getitem__)):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        out[i] = running
    return out


def test_the_docs_verdicts_are_the_rule_recomputed_from_the_records():
    """Every verdict of docs/language_models.md's block, by hand from the records: each cell's
    seeds' test perplexity minus its baseline's, scipy's t-test, Holm over the study's 11
    comparisons, one sign in every seed, and each cell's mean gain over its last 3 epochs (the
    plateau rule's, below 0.5 % in every cell: the rule stopped every run). Only decoder ×
    distance against untied dot is decided."""
    from scipy import stats

    summary = json.loads((DOCS / "lm" / "summary.json").read_text())
    recs = study_records.load(DOCS / "lm" / "records")
    label = {(c["tying"], c["output_layer"], c["tag"]): name for name, c in summary.items()}
    ppl: dict[str, dict[int, float]] = {}
    gains: dict[str, list[float]] = {}
    for r in recs:
        name = label[(r.run.tying, r.run.output_layer, r.run.tag)]
        ppl.setdefault(name, {})[r.run.seed] = r.eval.perplexity
        values = [v for _, _, v in r.train.valid_epochs]
        before = min(values[:-3])
        gains.setdefault(name, []).append((before - min(values[-3:])) / before)
    assert all(0 < sum(g) / 3 < 0.005 for g in gains.values())
    assert [round(100 * g, 2) for g in gains["none × dot"]] == [0.34, 0.42, 0.23]
    pairs = [(name, "vs_untied_dot", "none × dot") for name in summary if name != "none × dot"]
    pairs += [(name, "vs_tied_dot", "decoder × dot") for name in summary
              if name.startswith("decoder") and name != "decoder × dot"]
    diffs = [[ppl[a][s] - ppl[b][s] for s in (1, 2, 3)] for a, _, b in pairs]
    ps = [float(stats.ttest_1samp(d, 0).pvalue) for d in diffs]
    decided = {}
    for (name, test, _), d, p, adjusted in zip(pairs, diffs, ps, _holm(ps), strict=True):
        got = summary[name][test]
        assert got["p"] == pytest.approx(p) and got["p_holm"] == pytest.approx(adjusted)
        counts = adjusted < 0.05 and (all(v < 0 for v in d) or all(v > 0 for v in d))
        if counts:
            decided[(name, test)] = "supported" if sum(d) < 0 else "contradicted"
            assert got["verdict"] == decided[(name, test)]
        else:
            assert got["verdict"].startswith("unresolved (")
    assert len(pairs) == 11
    assert decided == {("decoder × distance", "vs_untied_dot"): "supported"}
    block = block_text((DOCS / "language_models.md").read_text(), "lm")
    for (name, test, _), d in zip(pairs, diffs, strict=True):
        against = "untied dot" if test == "vs_untied_dot" else "tied dot"
        row = next(line for line in block.splitlines()
                   if line.startswith(f"| {name} vs {against} "))
        assert summary[name][test]["verdict"] in row
        assert f"{len(d)} seeds (sd {stats.tstd(d):.2f}) detect \\|Δ\\| ≥" in row
    # the untied cell's row of the convergence check: seed 1's validation loss fell from
    # 6.147 bits (epoch 9) to 6.126 (epoch 12): 0.34 % of the loss, 1 − 2^−0.021 = 1.45 % of
    # the perplexity
    (row,) = [line for line in block.splitlines() if line.startswith("| none × dot ") and
              "2,532 / 2,532 / 2,743" in line]
    assert "+0.33 % (+0.34, +0.42, +0.23)" in row and "+1.40 % (+1.45, +1.79, +0.97)" in row
    assert "No cell still learns at its budget" in block
    # Press & Wolf's finding side by side: undecided here, so unresolved, not "not replicated"
    assert block.rstrip().endswith("| unresolved (not significant after Holm) |")
    assert "not replicated here" not in block


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
