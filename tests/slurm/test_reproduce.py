"""``study NAME --reproduce DIR``: the recorded runs trained again into DIR through the real
CLI and set beside their committed records."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from fairseq_tying.studies.records.record import Record
from tests.helpers import REPO, launch, study_prepare

pytestmark = pytest.mark.slow
S1 = "tiny.transformer_twwt.three_way.dot.s1"
ONLY = "*.three_way.dot.s1"  # the study also has untied runs of seed 1


def cell(records: Path) -> list[Path]:
    """The records of S1's cell (three-way tied dot), every seed."""
    return sorted(records.glob(S1.replace(".s1", ".s*.json")))


def _manifest(tmp: Path, study: Path, tiny_data: Path) -> Path:
    """The named study (the ``named_study`` fixture: untied and three-way tied dot, seeds 1 and
    2) with its records, plots and report copied into TMP, which the reproduction must only
    read; its sweep and prepared data are shared (a reproduction trains into its own DIR)."""
    for folder in ("records", "plots"):
        shutil.copytree(study / folder, tmp / folder)
    shutil.copy2(study / "results.md", tmp / "results.md")
    manifest = tmp / "studies.yaml"
    manifest.write_text(
        "studies:\n  tiny:\n" + study_prepare(tiny_data) +
        f"    sweep: {study / 'tiny.yaml'}\n    records: {tmp / 'records'}\n"
        f"    plots: {tmp / 'plots'}\n    references: {study / 'data' / 'raw' / 'test.en'}\n"
        f"    reports: [{{file: {tmp / 'results.md'}, block: tiny, view: translation}}]\n")
    return manifest


def _study(manifest: Path, *args: str, check: bool = True):
    return launch("study", "tiny", "--manifest", str(manifest), "--bootstrap-samples", "50",
                  *args, check=check, timeout=1800)


def _committed(tmp: Path) -> dict[str, bytes]:
    return {str(p.relative_to(tmp)): p.read_bytes()
            for folder in ("records", "plots") for p in sorted((tmp / folder).iterdir())}


def _row(table: str, metric: str) -> list[str]:
    """The cells of the comparison table's row of S1's ``metric``."""
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()]
    return next(r for r in rows if r[:2] == [S1, metric])


@pytest.mark.xdist_group("named_study")  # beside test_study's, which trains the study
def test_a_run_reproduced_beside_its_record(named_study, tiny_data, tmp_path):
    """The record made by the study command and its reproduction by the same command agree
    to the digit, within the cell's seed range; a doctored record is outside it; the committed
    records and report are only read; a wrong --only or a DIR in docs/ is refused."""
    manifest = _manifest(tmp_path, named_study, tiny_data)
    committed, report = _committed(tmp_path), (tmp_path / "results.md").read_text()
    out = tmp_path / "repro"

    proc = _study(manifest, "--reproduce", str(out), "--only", ONLY)
    comparison = json.loads((out / "comparison.json").read_text())
    (run,) = comparison["runs"]
    assert run["run"] == S1 and comparison["spread"] == "min–max of the cell's committed seeds"
    scores = {s["metric"]: s for s in run["scores"]}
    assert set(scores) == {"BLEU", "chrF", "valid NLL"}
    record = Record.load(tmp_path / "records" / f"{S1}.json", hypotheses=False)
    seeds = [Record.load(p, hypotheses=False).eval.bleu for p in cell(tmp_path / "records")]
    assert scores["BLEU"]["record"] == record.eval.bleu
    assert (scores["BLEU"]["seeds_min"], scores["BLEU"]["seeds_max"]) == (min(seeds),
                                                                          max(seeds))
    for s in scores.values():
        assert s["difference"] == 0 and s["within"] and s["n_seeds"] == 2, s
    assert scores["valid NLL"]["record"] == record.train.valid_nll
    assert Record.load(out / "records" / f"{S1}.json", hypotheses=False).eval == record.eval
    machine = run["machine"]
    assert "kernels" in record.train.cpu and record.train.torch == torch.__version__
    assert machine["record"] == {"cpu": record.train.cpu, "torch": record.train.torch}
    assert "kernels" in machine["reproduction"]["cpu"] and machine["reproduction"]["torch"]
    table = (out / "comparison.md").read_text()
    assert _row(table, "BLEU")[4:] == ["+0.00", f"{min(seeds):.2f}–{max(seeds):.2f} (2 seeds)",
                                       "within"]
    assert _row(table, "valid NLL")[4] == "+0.000" and table in proc.stdout
    assert _committed(tmp_path) == committed  # records and plots untouched
    assert (tmp_path / "results.md").read_text() == report
    assert (out / "runs" / S1 / "eval.json").is_file()
    assert not (out / "runs" / S1.replace(".s1", ".s2")).exists()  # only the runs of --only

    for path in cell(tmp_path / "records"):  # the cell's committed BLEU, doctored
        committed = Record.load(path)
        replace(committed, eval=replace(committed.eval, bleu=committed.eval.bleu + 30)).save(path)
    trained = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("*.pt")}
    _study(manifest, "--reproduce", str(out), "--only", ONLY)
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("*.pt")} == trained
    bleu = next(s for s in json.loads((out / "comparison.json").read_text())["runs"][0]["scores"]
                if s["metric"] == "BLEU")
    assert bleu["difference"] == pytest.approx(-30) and not bleu["within"]
    row = _row((out / "comparison.md").read_text(), "BLEU")
    assert (row[4], row[6]) == ("-30.00", "outside")

    bad = _study(manifest, "--reproduce", str(out), "--only", "nope*", check=False)
    assert bad.returncode == 2 and "--only ['nope*']: no run matches" in bad.stderr
    docs = _study(manifest, "--reproduce", "docs/reproduce", check=False)
    assert docs.returncode == 2 and "--reproduce docs/reproduce: inside docs" in docs.stderr
    assert not (REPO / "docs" / "reproduce").exists()
