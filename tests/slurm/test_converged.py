"""Training to a plateau through the real launcher (``--local``): the rule's decision, the
evaluations of the averaged and the best checkpoint, and runs that outlive a killed process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fairseq_tying.common.reproducible import has_avx2
from fairseq_tying.studies.commands import main
from fairseq_tying.studies.records import records as study_records
from fairseq_tying.studies.records.record import Record
from fairseq_tying.studies.records.records import read_stop, train_facts
from tests.helpers import REPO, first_stop, launch, run_folders, write_sweep

pytestmark = pytest.mark.slow

FAIRSEQ = {"max_update": None, "save_interval_updates": None, "keep_interval_updates": None,
           "no_epoch_checkpoints": None, "keep_last_epochs": 3, "log_format": "json",
           "best_checkpoint_metric": "nll_loss"}
EVAL = {"args": ["--average-last", "3", "--beam", "2"],
        "also": {"best": ["--checkpoint", "checkpoint_best.pt", "--beam", "2"]}}
# for runs whose test looks at the training alone: each evaluation is a job of its own (a
# process that loads torch and fairseq, then decodes twice)
NO_EVAL = {"enabled": False}


def converged_sweep(path: Path, layers: tuple[str, ...] = ("l2norm",), evaluation: dict = EVAL,
                    **stopping) -> Path:
    return write_sweep(path, grid={"output_layer": list(layers), "seed": [1]}, fairseq=FAIRSEQ,
                       evaluation=evaluation, stopping=stopping)


def only_run(out: Path) -> Path:
    (run,) = [p for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")]
    return run


@pytest.fixture(scope="module")
def plateau_runs(tiny_data, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("plateau")
    sweep = converged_sweep(tmp / "s.yaml", ("dot", "l2norm"), patience=1, min_gain=0.05,
                            max_epoch=8)
    launch(str(sweep), "--local", "--workers", "2", "--output-dir", str(tmp / "runs"),
           data=tiny_data)
    return tmp / "runs"


def test_plateau_run_stops_where_the_rule_says_and_is_scored_twice(plateau_runs):
    import torch

    for run in run_folders(plateau_runs):
        history = json.loads((run / "valid_history.json").read_text())
        assert history["metric"] == "nll_loss"
        values = [h["value"] for h in history["epochs"]]
        assert [h["epoch"] for h in history["epochs"]] == list(range(1, len(values) + 1))
        epoch, reason = first_stop(values, patience=1, gain=0.05, cap=8)
        stop = read_stop(run)
        assert (stop.epoch, stop.reason) == (epoch, reason)
        assert stop.update == history["epochs"][-1]["update"]
        ckpts = run / "checkpoints"
        kept = sorted(int(p.stem[len("checkpoint"):]) for p in ckpts.glob("checkpoint[0-9]*.pt"))
        assert kept == list(range(max(1, epoch - 2), epoch + 1))  # keep_last_epochs 3
        main = json.loads((run / "eval.json").read_text())
        best = json.loads((run / "eval.best.json").read_text())
        assert main["averaged"] == [f"checkpoint{e}.pt" for e in kept]
        assert Path(best["checkpoint"]).name == "checkpoint_best.pt" and best["tag"] == "best"
        assert (run / best["hypotheses"]).is_file() and best["hypotheses"] != main["hypotheses"]
        # the best checkpoint is the epoch of the lowest validation NLL
        state = torch.load(ckpts / "checkpoint_best.pt", map_location="cpu", weights_only=False)
        assert state["extra_state"]["val_loss"] == pytest.approx(min(values), abs=1e-6)


def test_converged_records_and_report(plateau_runs, tiny_data, tmp_path):
    records, report, plots = tmp_path / "records", tmp_path / "results.md", tmp_path / "plots"
    report.write_text("# Results\n\n<!-- converged:begin -->\nold\n<!-- converged:end -->\n"
                      "\nWritten by hand.\n")
    args = ["study", "--records", str(records), "--report", str(report), "--plots", str(plots),
            "--references", str(tiny_data / "raw" / "test.en"), "--bootstrap-samples", "100",
            "--block", "converged"]
    assert main([*args, "--runs", str(plateau_runs)]) == 0
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True,
                           env={**os.environ, "LC_ALL": "C"}).stdout
    cpu = next(line.split(":", 1)[1].strip() for line in lscpu.splitlines()
               if line.startswith("Model name:"))
    kernels = "AVX2" if has_avx2() else torch.backends.cpu.get_cpu_capability()
    for run in run_folders(plateau_runs):
        rec = Record.load(records / f"{run.name}.json")
        history = json.loads((run / "valid_history.json").read_text())["epochs"]
        assert rec.train.stop == read_stop(run)
        assert rec.train.device == "cpu"  # what trained it (a GPU's name on a GPU)
        assert rec.train.cpu == f"{cpu}, {kernels} kernels"  # the launcher's pin
        assert rec.train.valid_epochs == [[h["epoch"], h["update"], h["value"]]
                                          for h in history]
        assert rec.eval_best.bleu == json.loads((run / "eval.best.json").read_text())["bleu"]
        assert rec.eval.averaged == json.loads((run / "eval.json").read_text())["averaged"]
    text = report.read_text()
    assert "**Epochs trained**" in text and "BLEU of the best single checkpoint" in text
    common = min(read_stop(run).epoch for run in run_folders(plateau_runs))
    assert f"**Validation NLL after epoch {common}**" in text
    assert text.endswith("Written by hand.\n") and "\nold\n" not in text
    for png in ("valid_nll_epochs.png", "bleu_by_stop_epoch.png"):
        assert (plots / png).stat().st_size > 10_000
    first = text
    assert main(args) == 0  # from the records alone: the same report
    assert report.read_text() == first


def _param_sum(run: Path) -> float:
    return json.loads((run / "train.done").read_text())["param_sum"]


def test_killed_run_resumes_to_the_same_model(tiny_data, tmp_path):
    """SIGKILL the whole launcher once epoch 2 is saved; the rerun resumes from
    checkpoint_last.pt and ends exactly like an uninterrupted run (epoch batches from seed +
    epoch, history cut back to the checkpoint)."""
    sweep = converged_sweep(tmp_path / "s.yaml", evaluation=NO_EVAL, patience=50, min_gain=0.0,
                            max_epoch=4)
    ref, out = tmp_path / "ref", tmp_path / "killed"
    launch(str(sweep), "--local", "--output-dir", str(ref), data=tiny_data)

    env = {**os.environ, "OMP_NUM_THREADS": "1", "FAIRSEQ_TYING_TINY_DATA": str(tiny_data)}
    proc = subprocess.Popen([sys.executable, "-m", "fairseq_tying.launch", str(sweep), "--local",
                             "--output-dir", str(out)], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 240
    while not list(out.glob("*/checkpoints/checkpoint2.pt")) and time.monotonic() < deadline:
        assert proc.poll() is None, "the launcher ended before epoch 2"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    run = only_run(out)
    assert not (run / "train.done").exists()
    launch(str(sweep), "--local", "--output-dir", str(out), data=tiny_data)

    ref_run = only_run(ref)
    assert _param_sum(run) == _param_sum(ref_run)
    for name in ("valid_history.json",):
        assert json.loads((run / name).read_text()) == json.loads((ref_run / name).read_text())
    stop = read_stop(run)
    assert stop.reason == "cap" and stop.epoch == 4


def test_plateau_reached_before_a_kill_is_not_trained_again(tiny_data, tmp_path):
    sweep = converged_sweep(tmp_path / "s.yaml", evaluation=NO_EVAL, patience=1, min_gain=0.9,
                            min_epoch=3, max_epoch=8)
    out = tmp_path / "runs"
    launch(str(sweep), "--local", "--output-dir", str(out), data=tiny_data)
    run = only_run(out)
    done, stop = json.loads((run / "train.done").read_text()), read_stop(run)
    assert stop.reason == "plateau" and stop.epoch == 3
    last = run / "checkpoints" / "checkpoint_last.pt"
    before = last.stat().st_mtime_ns
    (run / "train.done").unlink()  # as if killed between the last save and train.done
    launch(str(sweep), "--local", "--output-dir", str(out), data=tiny_data)
    again = json.loads((run / "train.done").read_text())
    assert read_stop(run) == stop and again["param_sum"] == done["param_sum"]
    assert last.stat().st_mtime_ns == before


def _equal_sweep(path: Path, last: int, source: Path | None, evaluation: dict = EVAL) -> Path:
    extra = {"continue_from": str(source)} if source else {}
    return write_sweep(path, grid={"output_layer": ["dot", "l2norm"], "seed": [1]},
                       fairseq=FAIRSEQ, evaluation=evaluation,
                       stopping={"plateau": False, "max_epoch": last}, **extra)


def test_equal_training_continues_plateau_runs_to_the_model_trained_from_epoch_1(
        plateau_runs, tiny_data, tmp_path):
    """``continue_from`` the plateau runs and ``plateau: false``: each run trains on from its
    plateau run's checkpoints to the common last epoch, and ends with the model (and history)
    that training to that epoch from epoch 1 gives; only the missing epochs are trained."""
    stops = {run.name: read_stop(run).epoch for run in run_folders(plateau_runs)}
    last = max(stops.values()) + 1
    out, scratch = tmp_path / "equal", tmp_path / "scratch"
    proc = launch(str(_equal_sweep(tmp_path / "e.yaml", last, plateau_runs)), "--local",
                  "--workers", "2", "--output-dir", str(out), data=tiny_data)
    # the same runs trained from epoch 1 (their model and history are compared, not scored)
    launch(str(_equal_sweep(tmp_path / "s.yaml", last, None, NO_EVAL)), "--local", "--workers",
           "2", "--output-dir", str(scratch), data=tiny_data)
    for run in run_folders(out):
        source = plateau_runs / run.name
        assert f"{run.name}: continues from epoch {stops[run.name]} of {source}" in proc.stderr
        continued = json.loads((run / "continued_from.json").read_text())
        assert continued == {"output_dir": str(plateau_runs), "run": run.name,
                             "epochs": stops[run.name]}
        done, stop = json.loads((run / "train.done").read_text()), read_stop(run)
        assert (stop.epoch, stop.reason) == (last, "budget")
        assert done["param_sum"] == _param_sum(scratch / run.name)
        history = json.loads((run / "valid_history.json").read_text())
        assert history == json.loads((scratch / run.name / "valid_history.json").read_text())
        assert history["epochs"][:stops[run.name]] == json.loads(
            (source / "valid_history.json").read_text())["epochs"]
        # the log goes on from the plateau run's: every epoch validated once, none trained again
        log = (run / "logs" / "train.rank0.log").read_text()
        valid = [json.loads(line.split("| valid | ", 1)[1])["epoch"]
                 for line in log.splitlines() if "| valid | " in line]
        assert valid == list(range(1, last + 1))
        train = train_facts(run)
        assert train.continued_from == {"run": run.name, "epochs": stops[run.name]}
        assert len(train.valid_history) == last
        assert train.train_seconds > train_facts(source).train_seconds
        assert json.loads((run / "eval.json").read_text())["averaged"] == [
            f"checkpoint{e}.pt" for e in range(last - 2, last + 1)]
    # the equal-training view of these runs: every run trained `last` epochs
    report, records = tmp_path / "equal.md", tmp_path / "records"
    assert main(["study", "--runs", str(out), "--records", str(records), "--report", str(report),
                 "--plots", str(tmp_path / "plots"), "--references",
                 str(tiny_data / "raw" / "test.en"), "--bootstrap-samples", "100",
                 "--block", "equal", "--view", "equal", "--expected-runs", "2"]) == 0
    text = report.read_text()
    assert "2 of 2 runs are recorded.\n\nScope: `tiny`; " in text
    assert f"{last} epochs, scored as the average of the last 3 epoch checkpoints.\n\nEvery " \
        f"run trained {last} epochs;" in text
    row = next(line for line in text.splitlines() if line.startswith("| `l2norm` vs `dot`"))
    assert row.rstrip(" |").endswith("unresolved (1 of 3 seeds)")
    for rec in study_records.load(records):
        assert rec.train.stop.reason == "budget" and f"{rec.eval.bleu:.2f}" in text
    for png in ("valid_nll_epochs.png", "valid_nll_delta_epochs.png"):
        assert (tmp_path / "plots" / png).stat().st_size > 10_000


def test_dynamicconv_runs_to_a_budget_are_recorded_and_compared_as_e2(tiny_data, tmp_path):
    """E2's path at a tiny size: DynamicConv three-way × {dot, l2norm} trained to a fixed
    budget by the launcher, scored on the average of its last epoch checkpoints, exported as
    records (row norms of its tied matrix included) and reported by the equal view as a
    section of its own, its l2norm row against the paper's DynamicConv figures (+0.34 on
    IWSLT'14 De→En, +0.5 on WMT'16 En→De)."""
    last = 3
    sweep = write_sweep(tmp_path / "e2.yaml", grid={"arch": ["dynamicconv_twwt"],
                                                    "output_layer": ["dot", "l2norm"],
                                                    "seed": [1]},
                        fairseq=FAIRSEQ, evaluation=EVAL,
                        stopping={"plateau": False, "max_epoch": last})
    out = tmp_path / "runs"
    launch(str(sweep), "--local", "--workers", "2", "--output-dir", str(out), data=tiny_data)
    report, records = tmp_path / "equal.md", tmp_path / "records"
    assert main(["study", "--runs", str(out), "--records", str(records), "--report", str(report),
                 "--plots", str(tmp_path / "plots"), "--references",
                 str(tiny_data / "raw" / "test.en"), "--bootstrap-samples", "100",
                 "--block", "equal", "--view", "equal", "--expected-runs", "6"]) == 0
    recs = study_records.load(records)
    assert [(r.run.arch, r.run.output_layer) for r in recs] == [
        ("dynamicconv_twwt", "dot"), ("dynamicconv_twwt", "l2norm")]
    for rec in recs:
        assert (rec.train.stop.epoch, rec.train.stop.reason) == (last, "budget")
        assert rec.eval.averaged == [f"checkpoint{e}.pt" for e in range(1, last + 1)]
        assert len(rec.output_row_norms) > 0
    text = report.read_text()
    assert text.startswith("# Results\n\n<!-- equal:begin -->\n2 of 6 runs are recorded.\n\n"
                           "Scope: `tiny`; `dynamicconv_twwt`, ")
    assert (f"\n\nEvery run trained {last} epochs; its score is the average of its last 3 "
            "epoch checkpoints.") in text
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| `")]
    assert [r[:3] for r in rows[:2]] == [["`dynamicconv_twwt`", "three_way", "dot"],
                                         ["`dynamicconv_twwt`", "three_way", "l2norm"]]
    (claim,) = [r for r in rows if r[0] == "`l2norm` vs `dot` (three-way tying)"]
    assert claim[1] == "`dynamicconv_twwt`"
    assert claim[3] == "+0.34 (IWSLT'14 De→En), +0.50 (WMT'16 En→De)"
    assert claim[5] == "unresolved (1 of 3 seeds)"


def test_continuing_from_another_command_is_refused_before_anything_trains(
        plateau_runs, tiny_data, tmp_path):
    sweep = _equal_sweep(tmp_path / "e.yaml", 9, plateau_runs)
    text = sweep.read_text().replace("lr: 0.005", "lr: 0.004")
    assert text != sweep.read_text()
    sweep.write_text(text)
    proc = launch(str(sweep), "--local", "--output-dir", str(tmp_path / "out"), data=tiny_data,
                  check=False)
    assert proc.returncode == 2
    assert "was trained with another command" in proc.stderr and "--lr" in proc.stderr
    assert "0.004" in proc.stderr and "0.005" in proc.stderr
    assert not (tmp_path / "out").exists()
