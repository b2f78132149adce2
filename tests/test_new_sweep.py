"""``launch new-sweep``: the equal-training sweep file of a prepared data dir, its grid as the
launcher expands it, and its refusals before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fairseq_tying.core.output_layers import OUTPUT_LAYERS
from fairseq_tying.launch.__main__ import main as launch_main
from fairseq_tying.sweeps.config import load_sweep


@pytest.fixture
def data(tmp_path) -> Path:
    d = tmp_path / "mine"
    d.mkdir()
    (d / "prep.json").write_text(json.dumps({"src": "en", "tgt": "es"}))
    return d


def _new(tmp_path: Path, data: Path, *flags: str) -> int:
    return launch_main(["new-sweep", "--data", str(data), "--out", str(tmp_path / "s.yaml"),
                        *flags])


def test_the_default_grid_is_the_tying_table_and_every_layer_with_three_seeds(tmp_path, data):
    assert _new(tmp_path, data, "--epochs", "30") == 0
    sweep = load_sweep(tmp_path / "s.yaml", check_data=False)
    cells = {(r.identity.tying, r.identity.output_layer) for r in sweep.runs}
    assert cells == {("none", "dot"), ("decoder", "dot"),
                     *(("three_way", la) for la in OUTPUT_LAYERS)}
    assert len(sweep.runs) == 3 * len(cells) and {r.identity.seed for r in sweep.runs} == {1, 2, 3}
    run = sweep.runs[0]
    args = run.identity.train_args
    assert args[args.index("--max-epoch") + 1] == "30"
    assert args[args.index("--log-format") + 1] == "json"
    assert args[args.index("--keep-last-epochs") + 1] == "5"
    assert args[args.index("--source-lang") + 1] == "en"
    assert run.stopping["plateau"] is False and run.name.startswith("mine.transformer_twwt.")
    assert sweep.evaluation.average_last == 5


def test_a_narrowed_grid_and_the_pilot(tmp_path, data):
    assert _new(tmp_path, data, "--epochs", "9", "--tying", "none", "three_way",
                "--output-layers", "dot", "l2norm", "fixnorm", "--families", "transformer",
                "dynamicconv", "--seeds", "1", "2") == 0
    runs = load_sweep(tmp_path / "s.yaml", check_data=False).runs
    assert len(runs) == 2 * 4 * 2
    assert {r.identity.arch for r in runs} == {"transformer_twwt", "dynamicconv_twwt"}
    assert _new(tmp_path, data, "--pilot", "--tying", "none", "three_way", "--output-layers",
                "dot", "l2norm", "--seeds", "2", "3", "--force") == 0
    pilots = load_sweep(tmp_path / "s.yaml", check_data=False).runs
    # every cell, not only the baseline: a tied cell may still learn after the untied flattens
    assert {(r.identity.tying, r.identity.output_layer, r.identity.seed) for r in pilots} == {
        ("none", "dot", 2), ("three_way", "dot", 2), ("three_way", "l2norm", 2)}
    for pilot in pilots:
        assert pilot.stopping["plateau"] is True and pilot.stopping["max_epoch"] == 100
        assert pilot.stopping["patience"] == 3 and pilot.stopping["min_epoch"] == 5


def _finish(run_dir: Path, epoch: int) -> None:
    """The ``train.done`` the launcher writes when the plateau rule stops a run."""
    run_dir.mkdir(parents=True)
    (run_dir / "train.done").write_text(json.dumps(
        {"stop": {"epoch": epoch, "update": 84 * epoch, "reason": "plateau"}}))


def test_the_budget_is_the_latest_stop_of_every_cells_pilot(tmp_path, data, capsys):
    cells = ["--tying", "none", "three_way", "--output-layers", "dot", "l2norm"]
    pilot_yaml, pilot_dir = tmp_path / "pilot.yaml", tmp_path / "pilot_runs"
    assert launch_main(["new-sweep", "--data", str(data), "--out", str(pilot_yaml), "--pilot",
                        "--output-dir", str(pilot_dir), *cells]) == 0
    runs = load_sweep(pilot_yaml, check_data=False).runs
    _finish(runs[0].run_dir, 9)
    assert _new(tmp_path, data, "--budget-from", str(pilot_yaml), *cells) == 2
    err = capsys.readouterr().err
    assert "not finished: " + runs[1].name in err and str(pilot_yaml) in err
    assert not (tmp_path / "s.yaml").exists()
    for run, epoch in zip(runs[1:], (14, 11), strict=True):
        _finish(run.run_dir, epoch)
    assert _new(tmp_path, data, "--budget-from", str(pilot_yaml), *cells) == 0
    sweep = load_sweep(tmp_path / "s.yaml", check_data=False)
    assert {r.stopping["max_epoch"] for r in sweep.runs} == {14}  # the untied stopped at 9
    assert sweep.continue_from == pilot_dir.resolve()
    assert {r.name for r in runs} <= {r.name for r in sweep.runs}  # the pilots go on there
    by_name = {r.name: r for r in sweep.runs}
    for run in runs:  # the same command up to the training length: continue_from accepts it
        ours, theirs = by_name[run.name].identity.train_args, run.identity.train_args
        cut = [i for i, a in enumerate(ours) if a == "--max-epoch"][0]
        assert ours[:cut] + ours[cut + 2:] == theirs[:cut] + theirs[cut + 2:]
    # a cell the pilot did not train has no plateau to set the budget: refused by name
    assert _new(tmp_path, data, "--budget-from", str(pilot_yaml), "--force", "--tying", "none",
                "three_way", "--output-layers", "dot", "fixnorm") == 2
    assert "no pilot run of transformer_twwt/three_way/fixnorm" in capsys.readouterr().err


def test_a_learning_rate_of_ones_own(tmp_path, data, capsys):
    assert _new(tmp_path, data, "--epochs", "9", "--lr", "0.0015") == 0
    args = load_sweep(tmp_path / "s.yaml", check_data=False).runs[0].identity.train_args
    assert args[args.index("--lr") + 1] == "0.0015"
    assert _new(tmp_path, data, "--epochs", "9", "--lr", "0", "--force") == 2
    assert "--lr 0.0: a learning rate is positive" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--epochs", "3"], "--epochs 3: fewer than --average-last 5"),
    (["--epochs", "9", "--tying", "none", "--output-layers", "dot", "l2norm"],
     "add it to --tying"),
    (["--epochs", "9", "--seeds", "1", "1"], "--seeds 1 1: a value twice"),
    ([], "give one of --pilot"),
])
def test_contradictory_options_are_refused_by_name(tmp_path, data, capsys, flags, message):
    assert _new(tmp_path, data, *flags) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "s.yaml").exists()


def test_an_existing_file_and_a_missing_preparation_are_refused(tmp_path, data, capsys):
    (tmp_path / "s.yaml").write_text("mine\n")
    assert _new(tmp_path, data, "--epochs", "9") == 2
    assert "--out" in capsys.readouterr().err and (tmp_path / "s.yaml").read_text() == "mine\n"
    assert _new(tmp_path, tmp_path / "nothing", "--epochs", "9", "--force") == 2
    assert "python -m fairseq_tying.data.prepare" in capsys.readouterr().err
