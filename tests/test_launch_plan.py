"""The launch's plan: what it does to each run, from the sweep and run folders written as the
launcher writes them (run.json, checkpoints/checkpoint_last.pt, train.done, eval.json); nothing
is trained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fairseq_tying.common import EVAL_JSON, RUN_JSON, TRAIN_DONE, VALID_HISTORY
from fairseq_tying.common.run_spec import read_run_json, write_run_json
from fairseq_tying.launch.__main__ import main
from fairseq_tying.launch.plan import make_plan, replaced_dir
from fairseq_tying.launch.submit import prepare_run_dir
from fairseq_tying.sweeps.config import Sweep, load_sweep
from tests.helpers import TINY_MODEL, fairseq_train, write_sweep

EPOCHS = {"max_update": None, "save_interval_updates": None, "keep_interval_updates": None,
          "no_epoch_checkpoints": None}


def fake_data(folder: Path, words: str = "a b c") -> Path:
    """A data dir as check_data and the plan read it: D/bin/dict.*.txt."""
    (folder / "bin").mkdir(parents=True)
    for lang in ("es", "en"):
        (folder / "bin" / f"dict.{lang}.txt").write_text(
            "".join(f"{w} 1\n" for w in words.split()))
    return folder


@pytest.fixture
def data(tmp_path, monkeypatch) -> Path:
    folder = fake_data(tmp_path / "data")
    monkeypatch.setenv("FAIRSEQ_TYING_TINY_DATA", str(folder))
    return folder


def sweep_file(tmp_path: Path, name: str = "s.yaml", **changes) -> Path:
    return write_sweep(tmp_path / name, output_dir=str(tmp_path / "out"), **changes)


def trained(sweep: Sweep, index: int, epoch: int = 3, done: bool = False,
            evaluated: bool = False) -> Path:
    """The run ``index`` of ``sweep`` as its launch and training leave it."""
    run = sweep.runs[index]
    run.run_dir.mkdir(parents=True)
    write_run_json(sweep.spec(run))
    (run.run_dir / "checkpoints").mkdir()
    torch.save({"model": {"w": torch.zeros(2)}, "optimizer_history": [{"num_updates": 12}],
                "extra_state": {"train_iterator": {"epoch": epoch, "iterations_in_epoch": 0}}},
               run.run_dir / "checkpoints" / "checkpoint_last.pt")
    if done:
        (run.run_dir / TRAIN_DONE).write_text("{}")
    if evaluated:
        (run.run_dir / EVAL_JSON).write_text("{}")
    return run.run_dir


def kinds(sweep: Sweep, **kw) -> dict[str, str]:
    return {a.run.name: a.describe() for a in make_plan(sweep, sweep.runs, **kw).actions}


def test_plan_says_train_resume_evaluate_skip(tmp_path, data):
    sweep = load_sweep(sweep_file(tmp_path))
    trained(sweep, 1, epoch=3)
    trained(sweep, 2, done=True)
    trained(sweep, 3, done=True, evaluated=True)
    names = [r.name for r in sweep.runs]
    assert kinds(sweep) == {
        names[0]: f"{names[0]}: train from epoch 1, then evaluate",
        names[1]: f"{names[1]}: resume at epoch 3, then evaluate (from checkpoint_last.pt)",
        names[2]: f"{names[2]}: evaluate (trained)",
        names[3]: f"{names[3]}: skip (trained and evaluated)",
    }


def test_plan_skips_recorded_runs(tmp_path, data):
    sweep = load_sweep(sweep_file(tmp_path))
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / f"{sweep.runs[0].name}.json").write_text("{}")
    plan = make_plan(sweep, sweep.runs, skip_recorded=tmp_path / "records")
    assert plan.actions[0].kind == "skip" and "a study record in" in plan.actions[0].why
    assert [a.kind for a in plan.actions[1:]] == ["train"] * 3


def test_a_changed_sweep_is_refused_naming_the_run_and_each_setting(tmp_path, data):
    old = load_sweep(sweep_file(tmp_path, stopping={"patience": 2, "max_epoch": 4},
                                fairseq=EPOCHS))
    trained(old, 0)
    trained(old, 3, done=True, evaluated=True)
    new = load_sweep(sweep_file(tmp_path, "new.yaml", batch={"max_tokens": 800},
                                stopping={"patience": 2, "max_epoch": 6},
                                fairseq={**EPOCHS, "warmup_updates": 7}))
    plan = make_plan(new, new.runs)
    assert [a.kind for a in plan.actions] == ["refuse", "train", "train", "refuse"]
    why = plan.actions[0].why
    for setting in ("--max-tokens 800 now, 400 in its run.json",
                    "--warmup-updates 7 now, 5 in its run.json",
                    "--max-epoch 6 now, 4 in its run.json",
                    "stopping.max_epoch 6 now, 4 in its run.json"):
        assert setting in why
    with pytest.raises(ValueError) as err:
        plan.check()
    message = str(err.value)
    assert "2 run(s) refused, nothing was started" in message
    assert f"{new.runs[0].name} ({new.runs[0].run_dir}): trained with other settings" in message
    assert "--output-dir" in message and "--restart-changed" in message


def test_a_refused_relaunch_trains_nothing(tmp_path, data, capsys):
    old = load_sweep(sweep_file(tmp_path))
    run_dir = trained(old, 0)
    before = (run_dir / RUN_JSON).read_text()
    new = sweep_file(tmp_path, "new.yaml", fairseq={"lr": 0.001})
    assert main([str(new), "--local"]) == 2
    err = capsys.readouterr().err
    assert f"{old.runs[0].name} ({run_dir}): trained with other settings: " \
           "--lr 0.001 now, 0.005 in its run.json" in err
    assert "Traceback" not in err
    assert (run_dir / RUN_JSON).read_text() == before  # not rewritten with the new settings
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == [old.runs[0].name]  # no other run started
    assert not (run_dir / "command.sh").exists() and not (out / "jobs.json").exists()


def test_the_dry_run_prints_the_plan_and_the_refusal(tmp_path, data, capsys):
    old = load_sweep(sweep_file(tmp_path))
    trained(old, 1, epoch=2)
    assert main([str(sweep_file(tmp_path)), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"{old.runs[0].name}: train from epoch 1, then evaluate" in out
    assert f"{old.runs[1].name}: resume at epoch 2" in out
    assert main([str(sweep_file(tmp_path, "new.yaml", fairseq={"lr": 0.001})), "--dry-run"]) == 2
    captured = capsys.readouterr()
    assert f"{old.runs[1].name}: refuse (trained with other settings: --lr 0.001 now" \
        in captured.out
    assert "1 run(s) refused" in captured.err


def test_other_data_is_refused(tmp_path, data, monkeypatch):
    old = load_sweep(sweep_file(tmp_path))
    trained(old, 0)
    other = fake_data(tmp_path / "other", words="x y")
    monkeypatch.setenv("FAIRSEQ_TYING_TINY_DATA", str(other))
    new = load_sweep(sweep_file(tmp_path))
    plan = make_plan(new, new.runs[:1])
    assert plan.actions[0].kind == "refuse"
    assert f"data {other / 'bin'} now, {data / 'bin'} in its run.json" in plan.actions[0].why
    # the same dictionaries elsewhere (the data moved) are the same data
    monkeypatch.setenv("FAIRSEQ_TYING_TINY_DATA", str(fake_data(tmp_path / "moved")))
    moved = load_sweep(sweep_file(tmp_path))
    assert make_plan(moved, moved.runs[:1]).actions[0].kind == "resume"


def test_restart_changed_moves_the_old_folder_aside(tmp_path, data):
    old = load_sweep(sweep_file(tmp_path))
    run_dir = trained(old, 0, done=True, evaluated=True)
    new = load_sweep(sweep_file(tmp_path, "new.yaml", fairseq={"lr": 0.001}))
    action = make_plan(new, new.runs, restart_changed=True).actions[0]
    assert action.kind == "restart" and action.evaluate
    assert action.describe().startswith(f"{new.runs[0].name}: start afresh, then evaluate "
                                        "(trained with other settings: --lr 0.001 now")
    prepare_run_dir(new, action)  # what the executor does before it trains
    moved = list(replaced_dir(new).iterdir())
    assert len(moved) == 1 and moved[0].name.startswith(f"{new.runs[0].name}.")
    assert (moved[0] / EVAL_JSON).is_file() and (moved[0] / TRAIN_DONE).is_file()
    assert read_run_json(moved[0]).identity.train_args == old.runs[0].identity.train_args
    assert read_run_json(run_dir).identity.train_args == new.runs[0].identity.train_args
    assert not (run_dir / "checkpoints").exists() and not (run_dir / EVAL_JSON).exists()


def continued(tmp_path: Path, source_changes: dict, epochs: int = 2) -> Sweep:
    """A plateau sweep finished ``epochs`` epochs in ``src``; the sweep continuing from it."""
    stopping = {"patience": 2, "max_epoch": 5}
    src = load_sweep(write_sweep(tmp_path / "src.yaml", output_dir=str(tmp_path / "src"),
                                 stopping=stopping, fairseq={**EPOCHS, **source_changes}))
    run_dir = trained(src, 0, epoch=epochs + 1, done=True)
    history = [{"epoch": e, "update": 3 * e, "value": 5.0 - e} for e in range(1, epochs + 1)]
    (run_dir / VALID_HISTORY).write_text(json.dumps({"metric": "loss", "epochs": history}))
    return load_sweep(sweep_file(tmp_path, stopping={**stopping, "max_epoch": 8},
                                 fairseq=EPOCHS, continue_from=str(tmp_path / "src")))


def test_continue_from_is_its_own_action(tmp_path, data):
    sweep = continued(tmp_path, {})
    plan = make_plan(sweep, sweep.runs)
    source = tmp_path / "src" / sweep.runs[0].name
    assert plan.actions[0].describe() == \
        f"{sweep.runs[0].name}: continue from {source} epoch 2, then evaluate"
    other = source.parent / sweep.runs[1].name
    assert plan.actions[1].describe() == (f"{sweep.runs[1].name}: train from epoch 1, then "
                                          f"evaluate (no run at {other} to continue)")
    rank = {"rank": 0, "cpu": "Intel Xeon, AVX2 kernels", "device": "cpu", "torch": "2.13.0"}
    (source / "ranks").mkdir(exist_ok=True)
    (source / "ranks" / "rank0.json").write_text(json.dumps(rank))
    prepare_run_dir(sweep, plan.actions[0])
    copied = sweep.runs[0].run_dir
    assert (copied / "checkpoints" / "checkpoint_last.pt").is_file()
    assert json.loads((copied / "continued_from.json").read_text())["epochs"] == 2
    # what trained those epochs: a run with none left to train keeps it in its record
    assert json.loads((copied / "ranks" / "rank0.json").read_text()) == rank


def test_continue_from_a_run_with_another_command_is_refused(tmp_path, data):
    sweep = continued(tmp_path, {"lr": 0.001})
    action = make_plan(sweep, sweep.runs).actions[0]
    assert action.kind == "refuse"
    assert "--lr 0.005 here, 0.001 there" in action.why


@pytest.mark.slow
def test_the_resume_epoch_is_read_from_a_real_fairseq_checkpoint(tmp_path, data, joined_bin):
    """fairseq's own checkpoint_last.pt (its iterator's state, its pickled config) after two
    epochs: the plan resumes at epoch 3."""
    sweep = load_sweep(sweep_file(tmp_path))
    run = sweep.runs[0]
    run.run_dir.mkdir(parents=True)
    write_run_json(sweep.spec(run))
    fairseq_train(joined_bin, run.run_dir / "checkpoints", "transformer_twwt", *TINY_MODEL,
                  "--optimizer", "adam", "--lr", "0.002", "--max-tokens", "600",
                  "--max-epoch", "2", "--no-epoch-checkpoints")
    assert make_plan(sweep, [run]).actions[0].describe() == \
        f"{run.name}: resume at epoch 3, then evaluate (from checkpoint_last.pt)"
