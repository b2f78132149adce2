"""The low-resource study (docs/results.md, "Low-resource: a quarter of the Bible"): its
pilot's record set the budget of its sweep, its records are its sweep's runs trained to that
budget, and its answer (docs/quarter/answer.md and the results.md block) is what ``studies
answer --records-only`` writes from the committed records."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fairseq_tying.common.atomic import write_lines
from fairseq_tying.common.blocks import block_text
from fairseq_tying.data.bible import read_split
from fairseq_tying.data.build import sample_indices
from fairseq_tying.studies.commands import main as studies
from fairseq_tying.studies.records import records
from fairseq_tying.sweeps.config import load_sweep
from tests.helpers import REPO

QUARTER = REPO / "docs" / "quarter"
SWEEP = "slurm/bible_quarter.yaml"
PILOT = "slurm/bible_quarter_pilot.yaml"
PAPER_CELLS = (".none.dot.s1", ".three_way.dot.s1", ".three_way.l2norm.s1", ".three_way.fixnorm.s1")
FULL = ("docs/equal/summary.json", "the full corpus")
# the quarter's checks (docs/quarter/NAME): each sweep, its name beside the quarter's answer and
# the studies beside its own (the second draw's beside the full corpus, as the first draw's)
CHECKS = {"lr_half": ("slurm/bible_quarter_lr_half.yaml", "lr × 0.5", ()),
          "lr_double": ("slurm/bible_quarter_lr_double.yaml", "lr × 2", ()),
          "s2": ("slurm/bible_quarter_s2.yaml", "the second draw", (FULL,))}
BESIDE = [FULL, *((f"docs/quarter/{name}/summary.json", label)
                  for name, (_, label, _) in CHECKS.items())]


def _sweep():
    return load_sweep(REPO / SWEEP, check_data=False)


def _pilot():
    return load_sweep(REPO / PILOT, check_data=False)


def _beside(pairs) -> list[str]:
    """``--beside SUMMARY NAME`` for each (summary, name) pair."""
    return [a for pair in pairs for a in ("--beside", *pair)]


def _rebuilt(folder: Path, sweep: str, tmp_path: Path, *flags: str) -> Path:
    """``studies answer SWEEP --records-only`` on a copy of FOLDER's records (run from the
    repository, as the committed answer was): its answer.md is FOLDER's. Returns the copy."""
    out = tmp_path / folder.name
    shutil.copytree(folder / "records", out / "records")
    refs = write_lines(tmp_path / "test.en", read_split("test", "en"))
    assert studies(["answer", sweep, "--records-only", "--out", str(out), "--references",
                    str(refs), *flags]) == 0
    assert (out / "answer.md").read_text() == (folder / "answer.md").read_text()
    return out


def _at_the_budget(folder: Path, sweep: str) -> None:
    """FOLDER's records are SWEEP's runs, every one trained to the quarter's budget."""
    recs = records.load(folder / "records", hypotheses=False)
    assert {r.name for r in recs} == {r.name for r in load_sweep(REPO / sweep,
                                                                 check_data=False).runs}
    (budget,) = {r.stopping["max_epoch"] for r in _sweep().runs}
    assert all(r.train.stop.epoch == budget and r.train.stop.reason == "budget" for r in recs)


def _cells(study: str) -> dict:
    """The Transformer cells of docs/STUDY/summary.json."""
    return json.loads((REPO / "docs" / study / "summary.json").read_text())["transformer_twwt"]


def _reading() -> str:
    """The quarter's "What it says", whitespace collapsed."""
    text = (REPO / "docs" / "results.md").read_text()
    start = text.index("### What it says", text.index("## Low-resource"))
    return " ".join(text[start:text.index("\n## ", start)].split())


def test_the_budget_is_the_latest_plateau_of_the_paper_cells_pilots():
    """The pilot trained seed 1 of every cell to its plateau; the budget is the latest stop of
    the four cells of the papers' claims (the newer heads train at it, and the answer says
    whether they still learn there)."""
    pilots = records.load(QUARTER / "pilot" / "records", hypotheses=False)
    assert {p.name for p in pilots} == {r.name for r in _pilot().runs}
    assert all(p.train.stop.reason == "plateau" for p in pilots)
    paper = [p.train.stop.epoch for p in pilots if p.name.endswith(PAPER_CELLS)]
    (epochs,) = {r.stopping["max_epoch"] for r in _sweep().runs}
    assert len(paper) == len(PAPER_CELLS) and epochs == max(paper)
    assert all(r.stopping["plateau"] is False for r in _sweep().runs)


def test_the_pilots_answer_is_rebuilt_from_its_records(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    _rebuilt(QUARTER / "pilot", PILOT, tmp_path)


@pytest.mark.skipif(not (QUARTER / "answer.md").is_file(), reason="the low-resource study's "
                    "answer is not recorded yet: python -m fairseq_tying.studies answer "
                    f"{SWEEP} --out docs/quarter ...")
def test_the_answer_is_rebuilt_from_the_records(tmp_path, monkeypatch):
    _at_the_budget(QUARTER, SWEEP)
    report = tmp_path / "results.md"
    shutil.copyfile(REPO / "docs" / "results.md", report)
    monkeypatch.chdir(REPO)
    _rebuilt(QUARTER, SWEEP, tmp_path, "--report", str(report), "--block", "quarter",
             *_beside(BESIDE))
    committed = (REPO / "docs" / "results.md").read_text()
    assert block_text(report.read_text(), "quarter") == block_text(committed, "quarter")


@pytest.mark.parametrize("check", CHECKS)
def test_each_checks_answer_is_rebuilt_from_its_records(tmp_path, monkeypatch, check):
    """The learning-rate checks and the second draw: every run of the check's sweep trained to
    the quarter's budget, and its answer is what its records give."""
    sweep, _, beside = CHECKS[check]
    _at_the_budget(QUARTER / check, sweep)
    monkeypatch.chdir(REPO)
    _rebuilt(QUARTER / check, sweep, tmp_path, *_beside(beside))


def test_the_first_budgets_answer_is_rebuilt_from_its_records(tmp_path, monkeypatch):
    """The study's first protocol (12 epochs, the untied pilot's), kept with its sweep file."""
    first = QUARTER / "12_epochs"
    monkeypatch.chdir(REPO)
    _rebuilt(first, str((first / "bible_quarter.yaml").relative_to(REPO)), tmp_path)
    (epochs,) = {r.stopping["max_epoch"] for r in load_sweep(first / "bible_quarter.yaml",
                                                              check_data=False).runs}
    assert epochs == 12


def test_the_guides_tying_deltas_are_the_two_budgets():
    delta = {name: json.loads((QUARTER / name / "summary.json").read_text())["transformer_twwt"]
             ["three_way/dot"]["vs_untied"]["delta_bleu"] for name in ("12_epochs", ".")}
    guide = " ".join((REPO / "docs" / "your_data.md").read_text().split())
    assert (f"tying's Δ was {delta['12_epochs']:+.2f} BLEU at the untied pilot's budget and "
            f"{delta['.']:+.2f} at that of a pilot of every cell").replace("-", "−") in guide


def test_the_guides_cost_row_is_its_record():
    # a run trained from epoch 1 (seed 1 went on from its pilot), two runs on the 2 cores
    (record,) = [r for r in records.load(QUARTER / "records", hypotheses=False)
                 if r.name == "bible_quarter.transformer_twwt.three_way.dot.s3"]
    assert record.train.continued_from is None
    (budget,) = {r.stopping["max_epoch"] for r in _sweep().runs}
    seconds = record.train.train_seconds
    guide = (REPO / "docs" / "your_data.md").read_text()
    assert f"({budget} epochs in {seconds:,} s)" in guide
    assert f"| {round(seconds / budget)} s |" in guide and record.train.torch.startswith("2.13.0")


def test_the_guides_pilot_stops_are_the_pilots():
    stop = {p.name.split(".", 2)[2].rsplit(".", 1)[0]: p.train.stop.epoch
            for p in records.load(QUARTER / "pilot" / "records", hypotheses=False)}
    assert stop["three_way.l2norm"] == stop["three_way.fixnorm"]
    guide = " ".join((REPO / "docs" / "your_data.md").read_text().split())
    assert (f"the untied `dot` flattened after {stop['none.dot']} epochs, three-way `dot` after "
            f"{stop['three_way.dot']}, `l2norm` and `fixnorm` after {stop['three_way.l2norm']})"
            ) in guide


def test_the_reading_quotes_the_answers():
    """The section's reading ("What it says") quotes its Δs from the quarter's, the full
    corpus's and the pilot's summaries."""
    reading = _reading()
    here, full, pilot = _cells("quarter"), _cells("equal"), _cells("quarter/pilot")
    delta = {c: here[f"three_way/{c}"]["vs_dot"]["delta_bleu"]
             for c in ("l2norm", "fixnorm", "softcap", "ngpt", "dot+zloss")}
    tying = here["three_way/dot"]["vs_untied"]["delta_bleu"]
    on_full = full["three_way/dot"]["vs_untied"]["delta_bleu"]
    quoted = [f"tying gains {tying:+.2f}", f"it gains {on_full:+.2f}",
              f"`l2norm` is better than `dot`** ({delta['l2norm']:+.2f}",
              f"(+{full['three_way/l2norm']['vs_dot']['delta_bleu']:.2f}; no change shown)",
              f"`fixnorm`'s {delta['fixnorm']:+.2f}",
              f"{delta['softcap']:+.2f} and {delta['dot+zloss']:+.2f} BLEU",
              f"(`ngpt`) is {-delta['ngpt']:.2f} BLEU behind",
              f"scored {pilot['three_way/ngpt']['bleu']['mean']:.2f} BLEU against three-way "
              f"`dot`'s {pilot['three_way/dot']['bleu']['mean']:.2f}"]
    assert [q for q in quoted if q not in reading] == []


def test_the_reading_quotes_the_checks():
    """"Across learning rates and draws" quotes the checks' Δs, their BLEU at lr × 2 and the
    second draw's tying gain from their summaries; every seed of every check has `l2norm`
    ahead, as it says."""
    reading = _reading()

    def delta(test):
        return f"{test['delta_bleu']:+.2f} ± {test['delta_ci95']:.2f}"

    here, half, double, s2 = (_cells(f"quarter{n}") for n in ("", "/lr_half", "/lr_double", "/s2"))
    gains = {n: c["three_way/l2norm"]["vs_dot"] for n, c in
             (("here", here), ("half", half), ("double", double), ("s2", s2))}
    assert all(d > 0 for g in gains.values() for d in g["per_seed_delta"].values())
    tying = s2["three_way/dot"]["vs_untied"]
    assert all(d > 0 for d in tying["per_seed_delta"].values())
    quoted = [f"{delta(gains['half'])} BLEU at lr × 0.5", f"{delta(gains['here'])} at the primary",
              f"{delta(gains['double'])} at lr × 2", f"{delta(gains['s2'])} on the second draw",
              f"`dot` reads {double['three_way/dot']['bleu']['mean']:.2f} and `l2norm` "
              f"{double['three_way/l2norm']['bleu']['mean']:.2f} BLEU, against "
              f"{here['three_way/dot']['bleu']['mean']:.2f} and "
              f"{here['three_way/l2norm']['bleu']['mean']:.2f}",
              f"it gains {tying['delta_bleu']:+.2f} (better"]
    assert [q for q in quoted if q not in reading] == []
    best_dot = max(c["three_way/dot"]["bleu"]["mean"] for c in (here, half, double))
    assert best_dot < here["three_way/l2norm"]["bleu"]["mean"]


def test_the_second_draw_shares_a_quarter_of_the_first():
    """The protocol's count of the verses both draws hold (``--sample-seed`` 1 and 2)."""
    n = len(read_split("train", "en"))
    first, second = (set(sample_indices(n, 0.25, seed)) for seed in (1, 2))
    text = " ".join((REPO / "docs" / "results.md").read_text().split())
    shared = len(first & second)
    assert f"another {len(second):,} pairs, of which {shared:,} are in the first draw" in text
