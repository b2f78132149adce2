"""``study NAME --reproduce DIR``: the recorded runs trained again into DIR through the real
CLI and set beside their committed records."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from fairseq_tying.studies.record import Record
from tests.helpers import REPO, launch, write_sweep

pytestmark = pytest.mark.slow
S1 = "tiny.transformer_twwt.three_way.dot.s1"


def _manifest(tmp: Path, tiny_data: Path) -> Path:
    """A study of one cell (three-way tied dot) with seeds 1 and 2 on the tiny corpus."""
    sweep = write_sweep(tmp / "tiny.yaml", output_dir=str(tmp / "runs"),
                        datasets={"tiny": str(tmp / "data")}, fairseq={"log_format": "json"},
                        grid={"tying": ["three_way"], "output_layer": ["dot"], "seed": [1, 2]})
    (tmp / "results.md").write_text("# Study\n\n<!-- tiny:begin -->\n<!-- tiny:end -->\n")
    manifest = tmp / "studies.yaml"
    manifest.write_text(
        "studies:\n  tiny:\n"
        f"    prepare: [--corpus, {tiny_data / 'raw'}, --src, es, --tgt, en, --subword, "
        "sentencepiece, --vocab-size, '60']\n"
        f"    sweep: {sweep}\n    records: {tmp / 'records'}\n    plots: {tmp / 'plots'}\n"
        f"    references: {tmp / 'data' / 'raw' / 'test.en'}\n"
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


def test_a_run_reproduced_beside_its_record(tiny_data, tmp_path):
    """The record made by the study command and its reproduction by the same command agree
    to the digit, within the cell's seed range; a doctored record is outside it; the committed
    records and report are only read; a wrong --only or a DIR in docs/ is refused."""
    manifest = _manifest(tmp_path, tiny_data)
    _study(manifest, "--workers", "2")
    committed, report = _committed(tmp_path), (tmp_path / "results.md").read_text()
    out = tmp_path / "repro"

    proc = _study(manifest, "--reproduce", str(out), "--only", "*.s1")
    comparison = json.loads((out / "comparison.json").read_text())
    (run,) = comparison["runs"]
    assert run["run"] == S1 and comparison["spread"] == "min–max of the cell's committed seeds"
    scores = {s["metric"]: s for s in run["scores"]}
    assert set(scores) == {"BLEU", "chrF", "valid NLL"}
    record = Record.load(tmp_path / "records" / f"{S1}.json", hypotheses=False)
    seeds = [Record.load(p, hypotheses=False).eval.bleu
             for p in (tmp_path / "records").glob("*.json")]
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

    for path in (tmp_path / "records").glob("*.json"):  # the cell's committed BLEU, doctored
        committed = Record.load(path)
        replace(committed, eval=replace(committed.eval, bleu=committed.eval.bleu + 30)).save(path)
    trained = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("*.pt")}
    _study(manifest, "--reproduce", str(out), "--only", "*.s1")
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
