"""``launch new-sweep``: the equal-training sweep file of a prepared data dir, its grid as the
launcher expands it, and its refusals before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fairseq_tying.core.output_layers import OUTPUT_LAYERS
from fairseq_tying.launch.__main__ import main as launch_main
from fairseq_tying.launch.config import load_sweep


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
    cells = {(r.tying, r.output_layer) for r in sweep.runs}
    assert cells == {("none", "dot"), ("decoder", "dot"),
                     *(("three_way", la) for la in OUTPUT_LAYERS)}
    assert len(sweep.runs) == 3 * len(cells) and {r.seed for r in sweep.runs} == {1, 2, 3}
    run = sweep.runs[0]
    args = run.train_args
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
    assert {r.arch for r in runs} == {"transformer_twwt", "dynamicconv_twwt"}
    assert _new(tmp_path, data, "--pilot", "--tying", "none", "three_way", "--force") == 0
    (pilot,) = load_sweep(tmp_path / "s.yaml", check_data=False).runs
    assert (pilot.tying, pilot.output_layer, pilot.seed) == ("none", "dot", 1)
    assert pilot.stopping["plateau"] is True and pilot.stopping["max_epoch"] == 100
    assert pilot.stopping["patience"] == 3 and pilot.stopping["min_epoch"] == 5


@pytest.mark.parametrize("flags, message", [
    (["--epochs", "3"], "--epochs 3: fewer than --average-last 5"),
    (["--epochs", "9", "--tying", "none", "--output-layers", "dot", "l2norm"],
     "add it to --tying"),
    (["--epochs", "9", "--seeds", "1", "1"], "--seeds 1 1: a value twice"),
    ([], "give --pilot"),
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
