"""The study manifest (slurm/studies.yaml), the one study command over it, and the views the
engine renders from committed records: the equal-training block and README's short answer."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from sacrebleu.metrics import BLEU
from scipy import stats
from statsmodels.stats.multitest import multipletests

from fairseq_tying.common.blocks import block_text, markers, replace_block
from fairseq_tying.data import bible
from fairseq_tying.launch.__main__ import main as launch
from fairseq_tying.launch.studies import ManifestError, expected_runs, load_manifest
from fairseq_tying.studies.engine import specs
from fairseq_tying.studies.engine.engine import Section
from fairseq_tying.studies.records import records
from fairseq_tying.studies.records.record import Record
from fairseq_tying.studies.statistics import verdicts
from fairseq_tying.studies.statistics.cells import Bootstrap, plain, summary_of
from fairseq_tying.studies.statistics.stats import seeds_for_equivalence
from fairseq_tying.studies.views import view_answer, view_equal
from fairseq_tying.studies.views.formatting import scope
from fairseq_tying.studies.views.report import (
    Renderer,
    recorded,
    references,
    summary_lead,
    summary_source,
)
from fairseq_tying.sweeps.config import load_sweep
from tests.helpers import REPO

DOCS = REPO / "docs"
MANIFEST = REPO / "slurm" / "studies.yaml"
FORBIDDEN = ("running", "in progress", "not yet")
DOCUMENTS = "**Δ BLEU by test document**"  # a block states records, not plans


@pytest.fixture()
def manifest(monkeypatch):
    monkeypatch.chdir(REPO)  # the manifest's paths are relative to the repository's root
    return load_manifest(MANIFEST)


def test_every_study_has_its_records_sweep_and_marked_blocks(manifest):
    assert set(manifest.studies) == {"converged", "equal", "equal_primary", "one_epoch",
                                     "converged_gpu", "converged_gpu_patience3", "lm"}
    targets = [t for s in manifest.studies.values() for t in s.reports]
    targets += [s.target for s in manifest.summaries]
    for t in targets:
        text = t.file.read_text()
        begin, end = markers(t.block)
        assert text.count(begin) == text.count(end) == 1, t
    for study in manifest.studies.values():
        if study.sweep is None:  # frozen: a report of the records there are
            assert expected_runs(study) and not study.prepare
            continue
        assert "${" not in study.sweep.read_text()  # no environment variables to set
        sweep = load_sweep(study.sweep, check_data=False)
        assert len({r.data_dir for r in sweep.runs}) == 1 and study.prepare
        recorded_names = {p.stem for p in study.records.glob("*.json")}
        assert recorded_names <= {r.name for r in sweep.runs}  # each record is a run of it
    assert expected_runs(manifest.study("equal")) == 50  # E1-E3 (27) and F1-F5 (23)
    assert expected_runs(manifest.study("equal_primary")) == 27  # E1-E3 alone
    assert expected_runs(manifest.study("converged_gpu_patience3")) == 7


def test_the_makefile_study_targets_are_one_line_each_over_the_study_command():
    text = (REPO / "Makefile").read_text()
    for target, name in {"study": "converged", "study-equal": "equal",
                         "study-one-epoch": "one_epoch", "lm-study": "lm"}.items():
        recipe = text.split(f"\n{target}: setup\n")[1].split("\n\n")[0].splitlines()
        assert recipe == [f"\t$(RUN_STUDY) {name} $(STUDY_FLAGS)"]
    recipe = text.split("\nreproduce: setup\n")[1].split("\n\n")[0].splitlines()
    assert recipe == ["\t$(RUN_STUDY) $(STUDY) --reproduce $(REPRO) --workers $(WORKERS) "
                      "$(if $(ONLY),--only '$(ONLY)')"]
    assert "FAIRSEQ_TYING_" not in text


def test_a_block_reads_back_as_it_was_written(tmp_path):
    """``block_text`` gives back what ``replace_block`` wrote (trailing blanks dropped, one
    newline), whatever is written by hand around the block; no block is a clear error."""
    report = tmp_path / "r.md"
    report.write_text("# R\n\nby hand <!-- b:end -->\n")
    replace_block(report, "b", "| a |\n| 1 |  \n\n")
    replace_block(report, "other", "x")
    text = report.read_text()
    assert block_text(text, "b") == "| a |\n| 1 |\n" and block_text(text, "other") == "x\n"
    assert text.startswith("# R\n\nby hand <!-- b:end -->\n")
    with pytest.raises(ValueError, match="no marked block 'c'"):
        block_text(text, "c")
    assert markers("b") == ("<!-- b:begin -->", "<!-- b:end -->")


def test_a_study_without_records_says_how_many_runs_it_has(manifest):
    text, summary = Renderer([], None, expected=27).block("equal")
    assert text == "0 of 27 runs are recorded." and summary is None
    assert not any(word in text.lower() for word in FORBIDDEN)
    block = block_text((DOCS / "results.md").read_text(), "equal")
    n = len(list((DOCS / "equal" / "records").glob("*.json")))
    expected = expected_runs(manifest.study("equal"))
    assert block.startswith(f"{recorded(n, expected)}\n")  # the block leads with its count
    assert recorded(1, 27) == "1 of 27 runs is recorded."
    assert recorded(3, None) == ""  # no sweep to count: no line


def test_the_short_answer_is_the_study_with_records(manifest):
    """README's "Does it help?" table: the primary verdicts (the equal-training study's
    pre-registered family, the block docs/results.md leads with) through the ``does_it_help``
    view once its records answer it, after a line that names the study."""
    (summary,) = manifest.summaries
    where = summary.target.file
    assert where == Path("README.md")
    assert summary.sources == tuple(manifest.study(n)
                                    for n in ("equal_primary", "equal", "converged"))
    source = summary_source(summary)
    primary = manifest.study("equal_primary")
    assert source == ("equal_primary" if view_answer.answers(
        records.load(primary.records, hypotheses=False, select=primary.select)) else "equal")
    folder = manifest.study(source).plots
    cells = json.loads((folder / "summary.json").read_text())
    sections = [Section(arch, {}, summary_of(s)) for arch, s in cells.items()] \
        if source != "converged" else [Section("transformer_twwt", {}, summary_of(cells))]
    text, _ = view_answer.render(sections)
    assert block_text((REPO / "docs" / "results.md").read_text(), "answer") == \
        f"{recorded(27, 27)}\n\n{text}"
    n = expected_runs(manifest.study(source))
    assert block_text((REPO / where).read_text(), summary.target.block) == \
        f"{summary_lead(source, n)}\n\n{text}"
    assert summary_lead("converged", 21) == "From the `converged` study's 21 records."


@pytest.mark.parametrize("name", ["converged", "equal", "one_epoch", "converged_gpu", "lm"])
def test_every_study_with_a_sweep_dry_runs_its_data_and_unrecorded_runs(manifest, name, capsys,
                                                                        monkeypatch):
    """``study NAME --dry-run``: the data preparation into the sweep's dataset folder, and a
    job for each run of the sweep without a record, nothing trained or written."""
    monkeypatch.setattr("os.environ", dict(os.environ))  # the launcher pins the CPU kernels
    study = manifest.study(name)
    assert launch(["study", name, "--dry-run"]) == 0
    out = capsys.readouterr().out
    (data,) = {r.data_dir for r in load_sweep(study.sweep, check_data=False).runs}
    command = f"python -m fairseq_tying.data.prepare {' '.join(study.prepare.argv())}"
    assert f"# {command} --out {data}" in out
    todo = expected_runs(study) - len(list(study.records.glob("*.json")))
    assert f": {todo} training job(s)" in out


def test_study_command_errors_name_the_fix(manifest, capsys):
    assert launch(["study", "nope", "--report-only"]) == 2
    err = capsys.readouterr().err
    assert "study 'nope' is not in slurm/studies.yaml" in err and "converged, equal" in err
    assert launch(["study", "converged", "--report-only", "--only", "*.s1"]) == 2
    assert "--report-only exports and trains nothing" in capsys.readouterr().err
    assert launch(["study", "converged_gpu_patience3", "--workers", "1"]) == 2
    assert "rebuild its report with --report-only" in capsys.readouterr().err


@pytest.mark.parametrize(("entry", "message"), [
    ("{records: r, plots: p, reports: [{file: f.md, block: b, view: nope}]}",
     "studies.s.reports[0].view: 'nope' is not a view"),
    ("{records: r, plots: p, reports: [{file: f.md, block: b, view: lm}], runs_dir: x}",
     "studies.s.runs_dir: unknown key"),
    ("{records: r, plots: p, sweep: s.yaml, prepare: [--out, d], "
     "reports: [{file: f.md, block: b, view: lm}]}", "without --out"),
    ("{plots: p, reports: [{file: f.md, block: b, view: lm}]}", "studies.s.records: expected"),
    ("{records: r, plots: p, select: '*.s1', reports: [{file: f.md, block: b, view: lm}]}",
     "studies.s.select: expected a list of run-name globs"),
    ("{records: r, plots: p, sweep: s.yaml, select: ['*.s1'], "
     "reports: [{file: f.md, block: b, view: lm}]}", "studies.s.select: a study that reads some"),
])
def test_a_wrong_manifest_is_refused_by_key(tmp_path, entry, message):
    path = tmp_path / "studies.yaml"
    path.write_text(f"studies:\n  s: {entry}\n")
    with pytest.raises(ManifestError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_manifest(path)


def test_a_selection_reads_the_records_its_globs_match():
    """``select``: the records whose run name matches a glob, in name order; none matching is
    an error that names the globs."""
    folder = DOCS / "equal" / "records"
    names = [r.name for r in records.load(folder, hypotheses=False,
                                          select=["*.decoder.dot.s[12]", "*.none.dot.s3"])]
    assert names == [f"bible.transformer_twwt.{cell}" for cell in
                     ("decoder.dot.s1", "decoder.dot.s2", "none.dot.s3")]
    with pytest.raises(FileNotFoundError, match=r"matching \*\.s9"):
        records.load(folder, hypotheses=False, select=["*.s9"])


def test_a_summary_names_studies_of_the_manifest(tmp_path):
    path = tmp_path / "studies.yaml"
    path.write_text("studies:\n  s: {records: r, plots: p, reports: [{file: f.md, block: b, "
                    "view: lm}]}\nsummaries:\n  - {file: R.md, block: h, view: does_it_help, "
                    "from: [s, other]}\n")
    with pytest.raises(ManifestError, match=r"summaries\[0\].from: expected a list of the "
                       "manifest's studies \\(s\\)"):
        load_manifest(path)


def _dynamicconv(record: Record) -> Record:
    """A three-way tied converged record relabelled as a DynamicConv run (same hypotheses):
    a second architecture for the view, from real scores."""
    run = replace(record.run, arch="dynamicconv_twwt",
                  name=record.name.replace("transformer_twwt", "dynamicconv_twwt"))
    return replace(record, run=run, stats_cache={})


@pytest.mark.slow
def test_the_equal_view_of_real_records(tmp_path):
    """The equal-training tables from the converged study's P1 records (E1 and E3's cells) and
    their three-way cells relabelled as DynamicConv (every layer of Liu et al.'s Tables 2 and
    4): each seed's BLEU, each Δ the mean of the records' per-seed BLEU differences, each
    verdict the rules', Holm over the ten claims and the tying claims' two equivalence
    tests, the verdicts that 200 resamples cannot decide, each row's paper figures, and the
    plot."""
    recs = records.load(DOCS / "converged" / "records")
    e2 = [_dynamicconv(r) for r in recs if r.run.tying == "three_way"]
    renderer = Renderer(recs + e2, references(None), n_samples=200, expected=36)
    text, summary = renderer.block("equal")
    assert text.startswith("36 of 36 runs are recorded.\n\n")
    assert not any(word in text.lower() for word in FORBIDDEN)
    for r in recs:
        assert f"{r.eval.bleu:.2f}" in text
    bleu = {(r.run.tying, r.run.output_layer, r.run.seed): r.eval.bleu for r in recs}
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
             if line.startswith("|") and " vs " in line]
    rows = {(c[0], c[1]): c for c in cells if len(c) == 6}  # the Δ table's
    by_document = {(c[0], c[1]): c for c in cells if len(c) != 6}
    # each claim's Δ on one book alone: the mean over seeds of sacrebleu's BLEU on its verses
    books, refs = bible.books("test"), references(None)
    header = next(line for line in text.splitlines() if line.startswith("| comparison ")
                  and "John (879)" in line)
    names = [c.strip() for c in header.strip("|").split("|")][3:]
    row = by_document[("`l2norm` vs `dot`", "`transformer_twwt`")]
    runs = {(r.run.output_layer, r.run.seed): r for r in recs if r.run.tying == "three_way"}
    for name, value in zip(names, row[3:], strict=True):
        book = name.rsplit(" (", 1)[0]
        rows_in = [i for i, b in enumerate(books) if b == book]
        assert name == f"{book} ({len(rows_in)})"

        def bleu_on(run, rows_in=rows_in):
            return BLEU().corpus_score([run.hypotheses[i] for i in rows_in],
                                       [[refs[i] for i in rows_in]]).score
        want = np.mean([bleu_on(runs[("l2norm", s)]) - bleu_on(runs[("dot", s)])
                        for s in (1, 2, 3)])
        assert value == f"{want:+.2f}"
    expect = [("decoder tying vs untied (`dot`)", ("decoder", "dot"), ("none", "dot")),
              ("three-way tying vs untied (`dot`)", ("three_way", "dot"), ("none", "dot"))]
    expect += [(f"`{la}` vs `dot` (three-way tying)", ("three_way", la), ("three_way", "dot"))
               for la in ("l2norm", "sqnorm", "distance", "cosine")]
    for label, cell, base in expect:
        delta = np.mean([bleu[(*cell, s)] - bleu[(*base, s)] for s in (1, 2, 3)])
        row = rows[(label, "`transformer_twwt`")]
        test = summary["transformer_twwt"][f"{cell[0]}/{cell[1]}"].test(
            "vs_untied" if "untied" in label else "vs_dot")
        rule = verdicts.UNCHANGED if "untied" in label else verdicts.GAIN
        assert row[4].startswith(f"{delta:+.2f} ± ") and row[5] == verdicts.bootstrap(test, rule)
    # Liu et al.'s DynamicConv Tables 4 (IWSLT'14 De→En) and 2 (WMT'16 En→De), per layer
    for layer, paper in (("l2norm", "+0.34 (IWSLT'14 De→En), +0.50 (WMT'16 En→De)"),
                         ("sqnorm", "+0.22 (IWSLT'14 De→En), +0.30 (WMT'16 En→De)"),
                         ("distance", "+0.36 (IWSLT'14 De→En), +0.10 (WMT'16 En→De)"),
                         ("cosine", "+0.41 (IWSLT'14 De→En), +0.20 (WMT'16 En→De)")):
        assert rows[(f"`{layer}` vs `dot` (three-way tying)", "`dynamicconv_twwt`")][3] == paper
    assert len(rows) == 10
    tests = [test for cells in summary.values() for cell in cells.values()
             for name, test in cell.tests.items() if name in ("vs_dot", "vs_untied")]
    # the family: the ten bootstraps and the two tying claims' equivalence tests
    family = tests + [t.equivalence for t in tests if t.equivalence is not None]
    assert len(family) == 12 and {t.family for t in family} == {12}
    assert [t.p_holm for t in family] == pytest.approx(
        multipletests([t.p for t in family], method="holm")[1])
    # 200 resamples: a p at the floor 1/201 cannot pass Holm over 12 tests, and says so
    floor = [label for (label, arch), row in rows.items()
             if "too few resamples: Holm ≥ 12/201" in row[5]]
    assert floor and "m = 12 tests falls below m/(B + 1) = 0.0597" in text
    pngs = renderer.plots("equal", tmp_path, summary)[1:]
    assert [p.name for p in pngs] == ["valid_nll_epochs.png", "valid_nll_delta_epochs.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in pngs)
    assert json.loads((tmp_path / "summary.json").read_text()) == \
        json.loads(json.dumps(plain(summary)))


def _nll(record: Record, epoch: int) -> float | None:
    return next((v for e, _, v in record.train.valid_epochs if e == epoch), None)


def test_the_equal_views_differences_are_paired_by_seed():
    """The Δ plot's lines, from P1's records: at each epoch, the mean over the seeds that
    reached it in both cells of (cell's NLL − its baseline's NLL, same seed), with the 95 %
    t-interval; a panel per comparison, and none for a cell without its baseline."""
    recs = records.load(DOCS / "converged" / "records")
    cells: dict = {}
    for r in recs:
        cells.setdefault((r.run.tying, r.run.output_layer), {})[r.run.seed] = r
    panels = view_equal._delta_panels("T", cells)
    assert list(panels) == ["T: layer − dot (three-way)", "T: tying − untied (dot)"]
    assert list(panels["T: layer − dot (three-way)"]) == [
        "l2norm − dot", "sqnorm − dot", "distance − dot", "cosine − dot"]
    assert list(panels["T: tying − untied (dot)"]) == ["decoder − none", "three_way − none"]
    for label, cell, base in (("l2norm − dot", ("three_way", "l2norm"), ("three_way", "dot")),
                              ("decoder − none", ("decoder", "dot"), ("none", "dot"))):
        panel = next(p for p in panels.values() if label in p)
        xs, mean, lo, hi = panel[label]
        for i, epoch in enumerate(xs):
            diffs = [a - b for s in (1, 2, 3)
                     if (a := _nll(cells[cell][s], epoch)) is not None
                     and (b := _nll(cells[base][s], epoch)) is not None]
            assert mean[i] == pytest.approx(np.mean(diffs))
            if len(diffs) > 1:
                half = stats.t.ppf(0.975, len(diffs) - 1) * np.std(diffs, ddof=1) / np.sqrt(
                    len(diffs))
                assert (lo[i], hi[i]) == pytest.approx((mean[i] - half, mean[i] + half))
            else:
                assert lo[i] == hi[i] == mean[i]
        assert xs[-1] == max(min(len(cells[c][s].train.valid_epochs) for c in (cell, base))
                             for s in (1, 2, 3))
    without_untied = {k: v for k, v in cells.items() if k[0] != "none"}
    assert list(view_equal._delta_panels("T", without_untied)) == ["T: layer − dot (three-way)"]


def test_only_a_study_with_every_cell_and_seed_answers():
    """The short answer comes from a study whose records hold every tying mode with dot and
    every layer under three-way tying, all seeds, for one architecture: the converged study's
    do; without one seed of one cell, with one seed of every cell, without the baseline, or
    spread over two architectures they do not."""
    recs = records.load(DOCS / "converged" / "records", hypotheses=False)
    assert len(recs) == 21 and view_answer.answers(recs)
    assert not view_answer.answers([r for r in recs if r.name != recs[0].name])
    assert not view_answer.answers([r for r in recs if r.run.tying != "none"])
    other = [replace(r, run=replace(r.run, arch="dynamicconv_twwt"))
             if r.run.output_layer == "cosine" else r for r in recs]
    assert not view_answer.answers(other) and not view_answer.answers([])
    assert not view_answer.answers([r for r in recs if r.run.seed == 1])  # whole, but 1 of 3 seeds


def test_the_short_answer_of_an_architecture_without_untied_runs_starts_at_three_way_dot():
    """DynamicConv in the equal-training study has three-way tied cells only: its ``dot`` row
    is the baseline of its ``l2norm`` row, not a tying claim without an untied run."""
    cells = summary_of(json.loads((DOCS / "converged" / "summary.json").read_text()))
    full = view_answer.rows(cells)
    assert [r[:2] for r in full if r[-1] == "baseline"] == [["none", "`dot`"]]
    three_way = {k: v for k, v in cells.items() if k.startswith("three_way/")}
    rows = view_answer.rows(three_way)
    assert rows[0][:2] == ["three_way", "`dot`"]
    assert rows[0][-3:] == ["baseline", "–", "baseline"]
    assert rows[1:] == [r for r in full if r[0] == "three_way" and r[1] != "`dot`"]


def _test(deltas: list[float], p: float) -> Bootstrap:
    """A pooled paired bootstrap's result (``significance.compare``) with these seeds."""
    return Bootstrap(n_seeds=len(deltas), p=p, delta=sum(deltas) / len(deltas),
                     per_seed_delta={str(i + 1): d for i, d in enumerate(deltas)})


def test_the_rule_in_words_is_better_worse_no_difference_or_not_decided():
    """Whatever a paper expected, the words say what the rules found: a counted gain is
    "better" and a counted loss "worse", where ``bootstrap`` says supported / contradicted for
    a claim of a gain and contradicted for a claim that BLEU is unchanged."""
    gain, loss = _test([0.2, 0.5, 0.7], 0.003), _test([-0.1, -0.3, -0.4], 0.04)
    assert verdicts.in_words(gain) == "better" and verdicts.in_words(loss) == "worse"
    assert verdicts.bootstrap(loss, verdicts.GAIN) == "contradicted"
    # BLEU rose beyond the margin (90 % interval +0.04 to +0.89): not unchanged
    assert verdicts.bootstrap(gain, verdicts.UNCHANGED) == "contradicted (better)"
    for unsettled in (_test([0.2, 0.5, 0.7], 0.05), _test([-0.3, 2.2, 1.0], 0.001)):
        assert verdicts.in_words(unsettled) == "no difference shown"
    assert verdicts.in_words(_test([0.9], 0.001)) == "too few seeds (1 of 3)"


def test_robustness_needs_the_seeds_a_finding_needs():
    """One seed finds nothing on BLEU, chrF or the best checkpoint: "holds on chrF" would be
    vacuous, so a claim with too few seeds says nothing of robustness (the pilot's claims)."""
    gain, none = _test([0.2, 0.5, 0.7], 0.003), _test([0.2, 0.5, 0.7], 0.3)
    assert verdicts.robustness(gain, {"chrF": none}) == "not on chrF (no difference shown there)"
    assert verdicts.robustness(gain, {"chrF": gain}) == "holds on chrF"
    assert verdicts.robustness(_test([0.9], 0.001), {"chrF": _test([0.9], 0.3)}) == ""


def _also(cell, name: str) -> str:
    """What a claim's bullet adds: the finding on chrF and the best checkpoint, and what its
    seeds can show (sd of the per-seed Δs; the t-test's detectable Δ by statsmodels)."""
    from statsmodels.stats.power import TTestPower

    test = cell.test(name)
    finding = verdicts.finding(test)
    others = {"chrF": cell.test(name + "_chrf"), "the best checkpoint": cell.test(name + "_best")}
    words = {"better": "better", "worse": "worse", "none": "no difference shown"}
    differ = [f"not on {k} ({words[verdicts.finding(t)]} there)" for k, t in others.items()
              if verdicts.finding(t) != finding]
    robust = "holds on BLEU only" if len(differ) == 2 else "; ".join(differ) or \
        "holds on chrF and the best checkpoint"
    deltas = list(test.per_seed_delta.values())
    sd = float(np.std(deltas, ddof=1))
    effect = TTestPower().solve_power(nobs=len(deltas), alpha=0.05, power=0.8)
    need = seeds_for_equivalence(sd, 0.5)
    books = ", ".join(f"{d.split(' (')[0]} {v:+.2f}" for d, v in test.per_document.items())
    return (f"{robust}; {len(deltas)} seeds (sd {sd:.2f}) detect |Δ| ≥ {effect * sd:.2f} with "
            f"80 % power, equivalence within ±0.5 needs {need} seeds; Δ by document: {books}")


def test_the_short_answer_says_each_verdict_in_words():
    """Under the table, one sentence a claim: the converged study's tying modes are better
    (with the parameters they save, from the cells' counts) and each normalized layer shows no
    difference, with the seeds that disagree; DynamicConv's section, without an untied run,
    has its layer's sentence only."""
    cells = summary_of(json.loads((DOCS / "converged" / "summary.json").read_text()))
    words = view_answer.in_words(cells)
    saved = (cells["none/dot"].params[0] - cells["three_way/dot"].params[0]) / 1e6
    tied = cells["three_way/dot"].test("vs_untied")
    eq = tied.equivalence  # its 90 % interval, recomputed from the seeds' differences
    deltas = list(tied.per_seed_delta.values())
    low, high = stats.t.interval(0.90, len(deltas) - 1, loc=np.mean(deltas),
                                 scale=stats.sem(deltas))
    assert high > 0.5  # the interval leaves the margin: the counted gain says "better"
    assert tied.p == 1 / (tied.n_samples + 1) and tied.p_holm == tied.family * tied.p  # floors
    assert words[1] == ("three-way tying against untied (`dot`): **better**, "
                        f"{tied.delta:+.2f} BLEU (p ≤ {1 / (tied.n_samples + 1):.3g}, Holm ≤ "
                        f"{tied.p_holm:.3g} (floor); equivalence p = {eq.p:.3f}, Holm "
                        f"{eq.p_holm:.3f}: 90 % interval {low:+.2f} to {high:+.2f} against "
                        f"±0.5), with {saved:.2f}M fewer parameters; "
                        f"{_also(cells['three_way/dot'], 'vs_untied')}.")
    l2 = cells["three_way/l2norm"].test("vs_dot")
    seeds = ", ".join(f"{d:+.2f}" for d in l2.per_seed_delta.values())
    # seed 1's Δ (−0.30) has the other sign but is not significant on its own
    assert list(l2.per_seed_p.values())[0] > 0.05 and l2.p == 1 / (l2.n_samples + 1)
    assert words[2] == (f"`l2norm` against `dot` (three-way tying): **no difference shown**, "
                        f"{l2.delta:+.2f} BLEU (p ≤ {l2.p:.3g}, Holm ≤ {l2.p_holm:.3g} (floor): "
                        f"seeds differ in sign ({seeds})); "
                        f"{_also(cells['three_way/l2norm'], 'vs_dot')}.")
    assert len(words) == 6 and all("fewer parameters" not in w for w in words[2:])
    three_way = {k: v for k, v in cells.items() if k.startswith("three_way/")}
    assert view_answer.in_words(three_way) == words[2:]
    text, _ = view_answer.render([Section("T", {}, cells), Section("D", {}, three_way)])
    assert text.endswith(f"- `D`, {words[-1]}\n") and f"- `T`, {words[0]}\n" in text
    text, _ = view_answer.render([Section("T", {}, cells)])
    assert "\n- Decoder tying against untied (`dot`): **better**" in text


def test_the_short_answer_gives_each_claims_delta_on_each_test_book():
    """Each claim's sentence ends with its Δ on each book of the Bible's test set: the same
    records and seeds as its verdict, so the equal view's table of the same runs shows the
    same numbers."""
    renderer = Renderer(records.load(DOCS / "quarter" / "records"), references(None),
                        n_samples=200)
    short, _ = renderer.block("does_it_help")
    table, _ = renderer.block("equal")
    books = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[4:-1]]
             for line in table.split(DOCUMENTS)[1].splitlines() if line.startswith("| ")}
    claims = [line for line in short.splitlines() if line.startswith("- ")]
    rows = ("three-way tying vs untied", "`l2norm` vs `dot`", "`fixnorm` vs `dot`",
            "`softcap` vs `dot`", "`ngpt` vs `dot`", "`dot+zloss` vs `dot`")
    assert len(claims) == len(rows)
    for line, row in zip(claims, rows, strict=True):
        found = line.split("; Δ by document: ")[1].rstrip(".").split(", ")
        assert [f.split(" ")[0] for f in found] == ["Ruth", "Ecclesiastes", "Jonah", "John",
                                                    "James", "I"]
        assert [f.rsplit(" ", 1)[1] for f in found] == books[row]


def test_a_papers_figures_are_its_deltas_named_with_what_they_measure():
    """Beside our Δs, each layer's paper gives its Δ over ``dot`` for the model's family, each
    with the test set it was measured on, and the legend says what the paper measured and that
    it is a direction, not a BLEU to reproduce: no column of a paper's BLEU. FixNorm's +1.1 is
    named as Nguyen & Salazar's PreNorm + ScaleNorm + FixNorm, not as this ``fixnorm``."""
    from fairseq_tying.core import output_layers
    from fairseq_tying.studies.views.formatting import paper_figures, papers_legend
    from fairseq_tying.studies.views.view_grid import tables

    summary = summary_of(json.loads((DOCS / "converged" / "summary.json").read_text()))
    text = tables(summary, "transformer_twwt")
    head, table = text.split("**Our Δ beside the paper's Δ**")[1].split("\n\n")[:2]
    assert "paper BLEU" not in text and "a direction to set beside ours" in head
    assert output_layers.LIU_FIGURES in head and "docs/results.md, References" in head
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    assert cells[0][:2] == ["dot", "baseline"]
    for row in cells[1:]:
        (figure,) = output_layers.get(row[0]).paper_deltas["transformer"]
        assert row[1] == str(figure) and row[1].endswith(" (IWSLT'14 Es→En)")
    assert [str(f) for f in paper_figures("l2norm", "dynamicconv_twwt")] == \
        ["+0.34 (IWSLT'14 De→En)", "+0.50 (WMT'16 En→De)"]
    (fixnorm,) = paper_figures("fixnorm", "transformer_twwt")
    assert paper_figures("fixnorm", "dynamicconv_twwt") == (fixnorm,)
    assert str(fixnorm) == "+1.1 (PreNorm + ScaleNorm + FixNorm, mean of 5 low-resource pairs)"
    legend = papers_legend(["fixnorm", "l2norm", "cosine"])
    assert legend.count("Liu et al. (2020):") == 1 and "Nguyen & Salazar (2019): +1.1 is " \
        "PreNorm + ScaleNorm + FixNorm together" in legend and "post-norm model" in legend
    assert papers_legend(["softcap"]) == ""


def test_a_partial_grid_tables_only_what_its_runs_compare():
    """Rows are the output layers with runs; the Δ against dot needs another layer, the Δ of
    tying an untied column and another, the paper's table three-way runs (the committed GPU
    studies: two baselines; seven three-way runs)."""
    from fairseq_tying.studies.views.view_grid import tables

    gpu = REPO / "docs" / "converged_gpu"
    baselines = tables(summary_of(json.loads((gpu / "summary.json").read_text())))
    assert "| dot " in baselines and "| l2norm " not in baselines
    assert "Δ BLEU of tying against the untied model" in baselines
    assert "Δ BLEU against `dot`" not in baselines and "beside the paper" not in baselines
    three_way = tables(summary_of(json.loads((gpu / "patience3" / "summary.json").read_text())))
    assert "Δ BLEU against `dot`" in three_way and "beside the paper" in three_way
    assert "Δ BLEU of tying against the untied model" not in three_way
    assert all(f"| {layer} " in three_way for layer in ("l2norm", "sqnorm", "distance", "cosine"))


def _tagged(record: Record, tag: str) -> Record:
    """A three-way record relabelled as the three-way ``dot`` run of a tagged block (a sweep's
    hand-added block, e.g. with the z-loss), its scores and hypotheses its own."""
    layer = record.run.output_layer
    run = replace(record.run, output_layer="dot", tag=tag,
                  name=record.name.replace(f".{layer}.", f".dot.{tag}."))
    return replace(record, run=run, stats_cache={})


def test_a_tagged_block_is_a_cell_of_its_own_against_dot(tmp_path):
    """The quarter's fixnorm records relabelled as three-way dot with a tag: they make a cell
    "dot+zloss" beside dot, never mixed into it; its claim against dot is fixnorm's comparison
    (same Δ and p), a claim of no paper, and the table and the Δ table show it last."""
    recs = [r for r in records.load(DOCS / "quarter" / "records") if r.run.tag is None]
    fixnorm = [r for r in recs if r.run.output_layer == "fixnorm"]
    rest = [r for r in recs if r.run.output_layer != "fixnorm"]
    plain_text, plain_summary = Renderer(recs, references(None), n_samples=200).block("equal")
    for r in fixnorm:  # through their files, as an answer reads them
        _tagged(r, "zloss").save(tmp_path / f"{_tagged(r, 'zloss').name}.json")
    zloss = records.load(tmp_path)
    text, summary = Renderer(rest + zloss, references(None), n_samples=200).block("equal")
    cells, before = summary["transformer_twwt"], plain_summary["transformer_twwt"]
    assert "three_way/dot+zloss" in cells and "three_way/fixnorm" not in cells
    assert cells["three_way/dot"].stat("bleu").values == before["three_way/dot"].stat("bleu").values
    assert cells["three_way/dot+zloss"].stat("bleu").values == \
        before["three_way/fixnorm"].stat("bleu").values
    tagged, untagged = (cells["three_way/dot+zloss"].test("vs_dot"),
                        before["three_way/fixnorm"].test("vs_dot"))
    assert tagged.delta == pytest.approx(untagged.delta)
    claims = {c.cell: c for c in specs.study_claims(cells)}
    assert claims["three_way/dot+zloss"].source == "" and \
        claims["three_way/dot+zloss"].expects == verdicts.GAIN
    row = [line for line in text.splitlines()
           if line.startswith("| `dot+zloss` vs `dot` (three-way tying)")]
    assert len(row) == 1 and [c.strip() for c in row[0].split("|")][3:5] == ["–", "–"]
    # its Δ on each test book, as fixnorm's row of the untagged block
    books = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[3:-1]]
             for text_ in (text, plain_text) for line in text_.split(DOCUMENTS)[1].splitlines()
             if line.startswith("| `")}
    assert books["`dot+zloss` vs `dot`"] == books["`fixnorm` vs `dot`"]
    assert len(books["`dot+zloss` vs `dot`"]) == 7  # all, then the six books
    short, _ = Renderer(rest + zloss, references(None), n_samples=200).block("does_it_help")
    table = [line for line in short.splitlines() if line.startswith("| three_way |")]
    assert table[-1].startswith("| three_way | `dot+zloss` |")


VERDICT_BLOCKS = [(REPO / "README.md", "does_it_help"), (DOCS / "results.md", "answer"),
                  (DOCS / "results.md", "equal"), (DOCS / "results.md", "quarter"),
                  (DOCS / "results_converged.md", "converged"),
                  (DOCS / "results_one_epoch.md", "study"),
                  (DOCS / "results_gpu.md", "converged_gpu"),
                  (DOCS / "results_gpu.md", "converged_gpu_patience3"),
                  (DOCS / "language_models.md", "lm")]
BOOKS = "(Ruth 85, Ecclesiastes 222, Jonah 37, John 879, James 108, I John 103)"


@pytest.mark.parametrize("page, block", VERDICT_BLOCKS)
def test_every_verdict_block_states_its_scope_and_its_claims_by_document(page, block):
    """Each committed block with verdicts says once what they are about (the data, the models,
    the test set with its size and books, the seeds, the budget), and each claim's Δ on each
    book of the Bible's test set; the perplexity study's records keep no per-sentence scores,
    and its block says so instead."""
    text = block_text(page.read_text(), block)
    (scope,) = [line for line in text.splitlines() if line.startswith("Scope: ")]
    if block == "lm":
        assert "; 40,952 test tokens; seeds 1, 2, 3; " in scope
        assert "\nΔ by test document: none, since the records keep each run's test perplexity" \
            in text
        return
    assert f"; 1,434 test sentences {BOOKS}; seed" in scope
    claims = [line for line in text.splitlines() if line.startswith("- ")]
    assert all("; Δ by document: Ruth " in line for line in claims)
    assert claims or DOCUMENTS in text


def test_the_scope_states_the_test_sets_size_without_its_documents():
    """Without documents (a user's test set with no ``.docs`` file) the scope still gives the
    number of test sentences; runs stopped by the plateau rule give the span of their epochs
    and why each stopped."""
    cells = summary_of(json.loads((DOCS / "converged" / "summary.json").read_text()))
    found = scope([Section("transformer_twwt", {}, cells)])
    assert found.startswith("Scope: `bible`; `transformer_twwt`, 2+2 layers, D = 128, ")
    assert found.endswith(f"; 1,434 test sentences {BOOKS}; seeds 1, 2, 3; 18–40 epochs "
                          "(stops: 1 cap, 20 plateau), scored as the average of the last 5 "
                          "epoch checkpoints. ")
    bare = {label: replace(c, tests={n: replace(t, per_document={})
                                     for n, t in c.tests.items() if isinstance(t, Bootstrap)})
            for label, c in cells.items()}
    assert "; 1,434 test sentences; seeds 1, 2, 3; " in scope([Section("t", {}, bare)])
