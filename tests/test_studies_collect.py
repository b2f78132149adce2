"""``collect``: the scores of several runs and seeds (Markdown, results.json, the BLEU plot),
with no comparison; the training facts a record reads from a run's logs."""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image as mpimg

from fairseq_tying.evaluation import metrics
from fairseq_tying.evaluation.cli import main as evaluation
from fairseq_tying.launch.job import machines, rank_facts
from fairseq_tying.studies.collect import collect
from fairseq_tying.studies.commands import main
from fairseq_tying.studies.engine import engine, specs
from fairseq_tying.studies.records.record import Training
from fairseq_tying.studies.records.records import load_evaluated, train_facts, training_summary
from fairseq_tying.studies.statistics.stats import mean_ci
from fairseq_tying.studies.views.formatting import format_ci
from tests.helpers import REPO

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _make_runs(root: Path) -> dict[str, list[float]]:
    """Two methods x three seeds of real hypothesis files, scored like ``evaluate`` does."""
    rng = random.Random(1)
    words = "the a cat dog house big small red runs eats water bread and not very".split()
    refs = [" ".join(rng.choice(words) for _ in range(rng.randint(6, 14))) + "."
            for _ in range(120)]
    ref_path = root / "data" / "test.en"
    ref_path.parent.mkdir(parents=True)
    ref_path.write_text("\n".join(refs) + "\n")
    sha = hashlib.sha256(ref_path.read_bytes()).hexdigest()
    bleus: dict[str, list[float]] = {}
    for method, out_layer, noise in (("dot", "dot", 0.35), ("l2norm", "l2norm", 0.1)):
        for seed in (1, 2, 3):
            hyps = [" ".join(w if rng.random() > noise else rng.choice(words)
                             for w in r.split()) for r in refs]
            run = root / "runs" / f"{method}-s{seed}"
            run.mkdir(parents=True)
            (run / "test.hyp.en").write_text("\n".join(hyps) + "\n")
            s = metrics.score(hyps, refs, "es", "en")
            bleus.setdefault(method, []).append(s.bleu)
            (run / "eval.json").write_text(json.dumps({
                "run": {"name": run.name, "method": method, "arch": "transformer_twwt",
                        "tying": "three_way", "output_layer": out_layer, "seed": seed},
                "corpus": "toy", "src": "es", "tgt": "en", "subset": "test",
                "hypotheses": "test.hyp.en", "references": str(ref_path),
                "references_sha256": sha, **s.as_dict()}))
    return bleus


@pytest.fixture()
def runs(tmp_path: Path) -> tuple[Path, dict[str, list[float]]]:
    return tmp_path, _make_runs(tmp_path)


def test_collect_lists_scores_and_compares_nothing(runs, capsys):
    """Each method's mean ± t-CI over its seeds and each run's scores, a plot, and no Δ or p:
    a sweep's comparisons are its answer's, each cell against its own baseline."""
    root, bleus = runs
    out = root / "report"
    assert main(["collect", str(root / "runs"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    md = (out / "results.md").read_text()
    assert md in printed  # the same table goes to the terminal
    for values in bleus.values():
        assert format_ci(*mean_ci(values)) in md  # mean ± t-CI over the three seeds
        assert all(f" {v:.2f} " in md for v in values)  # and each run's BLEU
    assert "No Δ or p here" in md and "studies answer SWEEP.yaml" in md
    assert "Δ BLEU" not in md and "p BLEU" not in md and "significant" not in md
    results = json.loads((out / "results.json").read_text())
    [group] = results["groups"]
    methods = {m["method"]: m for m in group["methods"]}
    assert methods["l2norm"]["bleu_mean"] == pytest.approx(np.mean(bleus["l2norm"]))
    assert methods["l2norm"]["bleu_values"] == pytest.approx(bleus["l2norm"])
    assert not any(k.startswith(("delta", "vs_", "significant")) or k.endswith("_p")
                   for row in [*group["methods"], *group["runs"]] for k in row)
    assert {r["name"] for r in group["runs"]} == {f"{m}-s{s}" for m in bleus for s in (1, 2, 3)}
    # the options of a comparison against one baseline are gone
    with pytest.raises(SystemExit):
        main(["collect", str(root / "runs"), "--out", str(out), "--baseline", "dot"])

    png = out / "bleu.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    img = mpimg.imread(png)[..., :3]
    assert img.shape[0] > 200 and img.shape[1] > 200
    blue = np.all(np.abs(img - np.array([0.12, 0.47, 0.71])) < 0.08, axis=-1).sum()
    assert blue > 40  # both methods' markers are drawn, neither as a baseline


def test_collect_without_runs_is_an_error(tmp_path, capsys):
    assert main(["collect", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "no eval.json" in capsys.readouterr().err


def test_the_evaluation_of_one_run_names_the_command_that_compares_runs(capsys):
    assert evaluation(["collect", "runs", "--out", "o"]) == 2
    assert "python -m fairseq_tying.studies collect runs --out o" in capsys.readouterr().err


def test_foreign_eval_json_is_an_error(tmp_path, capsys):
    run = tmp_path / "runs" / "x"
    run.mkdir(parents=True)
    (run / "eval.json").write_text(json.dumps({"run": "x", "bleu": 1.0}))
    assert main(["collect", str(tmp_path / "runs"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert str(run / "eval.json") in err and "evaluate" in err


def test_collect_and_study_agree_on_the_same_runs(runs):
    """The two views of one pipeline: collect's method rows equal the study's cells built from
    the same runs (BLEU/chrF mean ± CI over seeds)."""
    root, bleus = runs
    res = collect(root / "runs", root / "out")
    methods = {m["method"]: m for m in res["results"]["groups"][0]["methods"]}
    refs = (root / "data" / "test.en").read_text().splitlines()
    # the study's records also carry training facts, not compared here
    facts = Training(params=1, params_trained=1, valid={"nll_loss": 0.0}, valid_history=[])
    records = [replace(r, train=facts) for r in load_evaluated(root / "runs")]
    [section] = engine.sections(specs.GRID, records, refs, 200)
    cells = section.summary
    dot, l2 = cells["three_way/dot"], cells["three_way/l2norm"]
    for cell, method in ((dot, methods["dot"]), (l2, methods["l2norm"])):
        assert cell.stat("bleu").mean == method["bleu_mean"] == pytest.approx(
            np.mean(bleus[method["method"]]))
        assert cell.stat("bleu").ci95 == method["bleu_ci95"]
        assert cell.stat("chrf").mean == method["chrf_mean"]


def _log_line(time: str, name: str, stats: dict) -> str:
    return f"2026-11-25 {time} | INFO | {name} | {json.dumps(stats)}"


def test_training_time_of_a_resumed_run_counts_every_process(tmp_path):
    """fairseq's "done training in" times the last process only. A run whose first process
    last logged its wall clock at 4,968 s (train_inner's "wall"; its "train_wall" is the
    interval's) and that was resumed for 324.2 s trained for 5,292.2 s. An uninterrupted run
    keeps fairseq's time."""
    params = "2026-11-25 02:21:50 | INFO | fairseq_cli.train | num. shared model params: " \
             "1,676,800 (num. trained: 1,676,800)"
    valid = _log_line("03:46:18", "valid", {"epoch": 14, "valid_loss": "6.036",
                                            "valid_num_updates": "2954"})
    first = [params, _log_line("03:44:00", "train_inner", {"epoch": 14, "train_wall": "156",
                                                           "wall": "4968"}),
             _log_line("03:46:18", "train", {"epoch": 14, "train_train_wall": "346",
                                             "train_wall": "5072"}), valid]
    resumed = [params, _log_line("03:48:00", "train_inner", {"epoch": 15, "train_wall": "67",
                                                             "wall": "69"}),
               _log_line("03:52:50", "train", {"epoch": 15, "train_wall": "326"}),
               _log_line("03:52:50", "valid", {"epoch": 15, "valid_loss": "6.046",
                                               "valid_num_updates": "3165"}),
               "2026-11-25 03:52:51 | INFO | fairseq_cli.train | done training in 324.2 seconds"]
    log = tmp_path / "train.rank0.log"
    log.write_text("\n".join(first + resumed) + "\n")
    summary = training_summary(log)
    assert summary.train_seconds == 5292.2
    assert summary.valid_history == [[2954, 6.036], [3165, 6.046]]
    log.write_text("\n".join([params] + resumed[1:]) + "\n")
    assert training_summary(log).train_seconds == 324.2


def test_training_time_of_a_continued_run_counts_the_finished_process_it_continues(tmp_path):
    """A run continued from a finished run's checkpoints (its log goes on from that run's) is
    two processes that each say "done training in". The second one's wall clock need not go
    back, since fairseq logs it rounded to the second: 0 in both here. So a new process is told
    by its parameter count line, and the finished one adds its own 0.9 s to the 0.4 s."""
    params = "2026-11-25 02:21:50 | INFO | fairseq_cli.train | num. shared model params: " \
             "1,676,800 (num. trained: 1,676,800)"

    def process(epoch: int, seconds: float) -> list[str]:
        return [params, _log_line("02:21:51", "train_inner", {"epoch": epoch, "wall": "0"}),
                _log_line("02:21:51", "valid", {"epoch": epoch, "valid_loss": "6.0",
                                                "valid_num_updates": str(10 * epoch)}),
                "2026-11-25 02:21:51 | INFO | fairseq_cli.train | done training in "
                f"{seconds} seconds"]

    log = tmp_path / "train.rank0.log"
    log.write_text("\n".join(process(1, 0.9) + process(2, 0.4)) + "\n")
    assert training_summary(log).train_seconds == 1.3


def test_exporting_records_needs_no_matplotlib():
    """A GPU machine exports its runs' records (row norms need the checkpoints it holds) with
    only what training needs: the record path must not import the plotting stack."""
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from fairseq_tying.evaluation import norms\n"
            "from fairseq_tying.studies.records import records\n"
            "assert callable(records.export) and callable(norms.row_norms)\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def _trained_run(tmp_path: Path, rank0: dict) -> Path:
    """A run folder with a one-validation training log and ``rank0`` as its rank file."""
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "ranks").mkdir()
    (run / "logs" / "train.rank0.log").write_text(
        "x | num. shared model params: 10 (num. trained: 10)\n"
        + _log_line("00:00:01", "valid", {"valid_loss": "6.0", "valid_num_updates": "5"}) + "\n")
    (run / "ranks" / "rank0.json").write_text(json.dumps(rank0))
    return run


def test_a_record_names_every_processor_that_trained_its_run(tmp_path):
    """train.cpu is the training job's rank-0 file's: a run resumed on another processor names
    both, in order; one resumed on the same keeps one name."""
    a, b = "AMD EPYC, AVX2 kernels", "Intel(R) Xeon(R) Processor, AVX2 kernels"
    assert machines(None, a) == machines(a, a) == a
    assert machines(machines(a, b), b) == f"{a}; then {b}"
    assert machines(f"{a}; then {b}", a) == f"{a}; then {b}; then {a}"
    run = _trained_run(tmp_path, {"device": "cpu", "cpu": f"{a}; then {b}"})
    facts = train_facts(run)
    assert (facts.device, facts.cpu) == ("cpu", f"{a}; then {b}")


def test_a_record_names_torch_and_the_day_its_training_ended(tmp_path):
    """The rank file names torch's version and the day of its write (the last one is the
    run's end); the record's train carries both, and a record made before it held them reads
    without them."""
    import datetime

    import torch

    before = datetime.datetime.now(datetime.timezone.utc).date()
    facts = rank_facts(torch.device("cpu"), None)
    after = datetime.datetime.now(datetime.timezone.utc).date()
    assert facts["torch"] == torch.__version__ and facts["device"] == "cpu"
    assert before <= datetime.date.fromisoformat(facts["date"]) <= after
    assert "kernels" in facts["cpu"]
    run = _trained_run(tmp_path, {**facts, "rank": 0, "pid": 1})
    train = train_facts(run)
    assert (train.torch, train.date, train.cpu) == (facts["torch"], facts["date"], facts["cpu"])
    again = Training.from_dict(json.loads(json.dumps(train.to_dict())), "train")
    assert (again.torch, again.date) == (train.torch, train.date)
    old = {k: v for k, v in train.to_dict().items() if k not in ("torch", "date")}
    assert (Training.from_dict(old, "train").torch, Training.from_dict(old, "train").date) == (
        None, None)
