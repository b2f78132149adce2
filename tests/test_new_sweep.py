"""``launch new-sweep``: the equal-training sweep file of a prepared data dir, its grid as the
launcher expands it, and its refusals before anything is written."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from fairseq_tying.common import PLUGIN_DIR
from fairseq_tying.core.output_layers import OUTPUT_LAYERS
from fairseq_tying.launch import cost
from fairseq_tying.launch.__main__ import main as launch_main
from fairseq_tying.sweeps.config import load_sweep
from tests.helpers import build_tiny_data, run_cli


@pytest.fixture
def data(tmp_path) -> Path:
    d = tmp_path / "mine"
    d.mkdir()
    (d / "prep.json").write_text(json.dumps({"src": "en", "tgt": "es"}))
    return d


def _new(tmp_path: Path, data: Path, *flags: str) -> int:
    """new-sweep without its estimate (the data dir of these tests holds no binarized data)."""
    return launch_main(["new-sweep", "--data", str(data), "--out", str(tmp_path / "s.yaml"),
                        "--no-estimate", *flags])


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
                        "--output-dir", str(pilot_dir), "--no-estimate", *cells]) == 0
    runs = load_sweep(pilot_yaml, check_data=False).runs
    # a block added by hand (a tag: another cell, e.g. with the z-loss) sets no budget here,
    # finished or not
    text = pilot_yaml.read_text()
    block = [line for line in text.splitlines() if "output_layer: [dot]" in line][0]
    pilot_yaml.write_text(text.replace(block, block + "\n" + block.replace(
        "priority: 1}", "tag: zloss, flags: {z_loss: 0.0001}, priority: 9}")))
    assert any(r.identity.tag == "zloss" for r in load_sweep(pilot_yaml, check_data=False).runs)
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


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_the_size_flags_override_the_preset_and_reach_the_file(tmp_path, data):
    assert _new(tmp_path, data, "--epochs", "9", "--model", "small", "--embed-dim", "256",
                "--layers", "3", "--max-tokens", "2000") == 0
    text = (tmp_path / "s.yaml").read_text()
    assert "--local --workers N" in text  # no --workers given: the file leaves it to you
    assert ("# Model:   --model small, --embed-dim 256, --layers 3, --max-tokens 2000: 3+3 "
            "layers, width 256, feed-forward 1024, 4 heads, 2000 tokens a batch") in text
    args = load_sweep(tmp_path / "s.yaml", check_data=False).runs[0].identity.train_args
    for side in ("encoder", "decoder"):  # the feed-forward follows the width: small's 4 times
        assert _flag(args, f"--{side}-embed-dim") == "256"
        assert _flag(args, f"--{side}-ffn-embed-dim") == "1024"
        assert _flag(args, f"--{side}-layers") == "3"
        assert _flag(args, f"--{side}-attention-heads") == "4"
    assert _flag(args, "--max-tokens") == "2000" and _flag(args, "--lr") == "0.003"
    assert _new(tmp_path, data, "--epochs", "9", "--model", "tiny", "--embed-dim", "24",
                "--ffn-dim", "40", "--heads", "3", "--force") == 0
    args = load_sweep(tmp_path / "s.yaml", check_data=False).runs[0].identity.train_args
    assert [_flag(args, f) for f in ("--decoder-embed-dim", "--decoder-ffn-embed-dim",
                                     "--decoder-attention-heads", "--decoder-layers",
                                     "--max-tokens")] == ["24", "40", "3", "1", "400"]


@pytest.mark.parametrize("flags, message", [
    (["--embed-dim", "30"], "--embed-dim 30: a width of 30 does not split into 4 attention "
     "heads (--model small has 4); give --heads dividing it (1, 2, 3, 5, 6, 10, 15)"),
    (["--heads", "3"], "--heads 3: a width of 128 does not split into 3 attention heads"),
    (["--model", "tiny", "--embed-dim", "20", "--heads", "8"],
     "--embed-dim 20 --heads 8: a width of 20 does not split into 8"),
    (["--layers", "0"], "--layers 0: at least 1"),
    (["--max-tokens", "-5"], "--max-tokens -5: at least 1"),
    (["--workers", "0"], "--workers 0: at least 1"),
])
def test_a_size_fairseq_cannot_build_is_refused_by_name(tmp_path, data, capsys, flags,
                                                         message):
    assert _new(tmp_path, data, "--epochs", "9", *flags) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "s.yaml").exists()


def test_the_help_documents_the_smoke_test_model(capsys):
    with pytest.raises(SystemExit):
        launch_main(["new-sweep", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "tiny: 1+1 layers of width 16, 400 tokens a batch (a smoke test" in out
    assert "--no-estimate" in out and "--sample-seconds" in out and "--embed-dim" in out


def _number(pattern: str, text: str) -> list[str]:
    found = re.search(pattern, text)
    assert found, f"{pattern!r} not in:\n{text}"
    return list(found.groups())


def _seconds(text: str) -> float:
    """``4.37 s``, ``3 min 28 s``, ``2 h 05 min`` in seconds."""
    if m := re.fullmatch(r"(\d+) h (\d+) min", text):
        return 3600 * int(m[1]) + 60 * int(m[2])
    if m := re.fullmatch(r"(\d+) min (\d+) s", text):
        return 60 * int(m[1]) + int(m[2])
    return float(text.removesuffix(" s"))


@pytest.mark.slow
def test_the_estimate_times_a_sample_and_multiplies_it_out(tmp_path, capsys, monkeypatch):
    data = build_tiny_data(tmp_path / "tiny")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # the sample's save dir
    (tmp_path / "tmp").mkdir()
    out = tmp_path / "s.yaml"
    started = time.monotonic()
    assert launch_main(["new-sweep", "--data", str(data), "--out", str(out), "--model", "tiny",
                        "--epochs", "6", "--tying", "none", "three_way", "--output-layers",
                        "dot", "l2norm", "--seeds", "1", "--workers", "2",
                        "--sample-seconds", "1"]) == 0
    took = time.monotonic() - started
    text = capsys.readouterr().out
    assert "launch THIS_FILE --local --workers 2" in out.read_text()
    wall, start = _number(r"the sample: (.+?) in all .*\n.*a run's start ([\d.]+) s", text)
    wall, start = _seconds(wall), float(start)
    timed, seconds, warmup, step = _number(r"(\d+) updates timed in ([\d.]+) s after (\d+) of "
                                           r"warm-up: ([\d.e-]+) s an update", text)
    end = float(_number(r"an epoch's end \(validation, checkpoint\) ([\d.e-]+) s", text)[0])
    updates, epoch = _number(r"an epoch: +(\d+) updates ≈ (.+)\n", text)
    run, = _number(r"a run: +6 epochs ≈ (.+) \(its start included", text)
    sweep, = _number(r"the sweep: +3 runs, 2 runs side by side ≈ (.+)\n", text)
    # the printed numbers are the sample's, multiplied out (each printed to 3 digits)
    assert int(timed) >= 5 and int(warmup) == 3 and float(seconds) >= 1
    assert float(step) == pytest.approx(float(seconds) / int(timed), rel=0.01)
    assert _seconds(epoch) == pytest.approx(int(updates) * float(step) + end, rel=0.01)
    assert _seconds(run) == pytest.approx(start + 6 * _seconds(epoch), rel=0.01)
    assert _seconds(sweep) == pytest.approx(2 * _seconds(run), rel=0.01, abs=1)  # 2 then 1
    assert start + float(seconds) < wall < took + 0.1  # the sample's wall printed to 3 digits
    assert "Intel" in text or "AMD" in text or "processor" in text
    # an epoch's updates are those fairseq-train counts when it trains one on the run's command
    args = load_sweep(out).runs[0].identity.train_args
    args[args.index("--max-epoch") + 1] = "1"
    log = run_cli("fairseq-train", data / "bin", "--user-dir", PLUGIN_DIR, "--save-dir",
                  tmp_path / "one_epoch", "--log-interval", "1", "--disable-validation",
                  "--no-save", *args).stdout
    counted = re.findall(r'"train_num_updates": "(\d+)"', log)  # the epoch's JSON line
    assert counted == [updates]
    # no checkpoint left in the user's folders, nor in the temporary one
    shutil.rmtree(tmp_path / "one_epoch", ignore_errors=True)
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert set(after) - set(before) == {Path("tmp"), Path("s.yaml")}


def _measured(run: str, step: float, start: float = 5.0) -> cost.Sample:
    """What a sample of ``run`` would report: 10 batches an epoch, ``step`` s an update (the
    mean of two), an epoch's end of 1 s."""
    return cost.Sample(run=run, step_seconds=[step / 2, 3 * step / 2], epoch_end_seconds=[1.0],
                       batches=10, update_freq=1, warmup=3, updates=5, device="cpu",
                       cpu="a processor", threads=1, start=start, wall=9.0)


def test_each_architecture_is_priced_at_its_own_sample():
    samples = {"transformer_twwt": _measured("d.transformer_twwt.none.dot.s1", 0.2),
               "dynamicconv_twwt": _measured("d.dynamicconv_twwt.none.dot.s1", 0.5)}
    runs = [("transformer_twwt", 4, 4)] * 2 + [("dynamicconv_twwt", 4, 4)] * 2
    text = cost.report(samples, runs, world=1, workers=2, seconds=5, busy=(2, 0.3))
    assert text.startswith("Estimated cost on this machine (a processor; 1 thread a run; 2 "
                           "cores, load 0.3):") and "Other processes" not in text
    # an epoch: 10 updates x 0.2 s + 1 s = 3 s, a run 5 s + 4 x 3 s = 17 s; DynamicConv 6 s, 29 s
    assert "an epoch:   10 updates ≈ 3 s\n  a run:      4 epochs ≈ 17 s" in text
    assert "an epoch:   10 updates ≈ 6 s\n  a run:      4 epochs ≈ 29 s" in text
    # two workers: 17 and 17 side by side, then 29 and 29
    assert "the sweep:  4 runs, 2 runs side by side ≈ 46 s" in text
    pilot = cost.report({"transformer_twwt": samples["transformer_twwt"]},
                        [("transformer_twwt", 5, 100)] * 3, world=2, workers=1, seconds=5,
                        busy=(2, 3.5))
    assert "Other processes ran (load 3.5 on 2 cores)" in pilot
    # two devices share an epoch's 10 batches: 5 updates of 0.2 s, and the epoch's end
    assert "5 updates (its batches shared by 2 devices) ≈ 2 s" in pilot
    assert "a run:      5 to 100 epochs ≈ 15 s to 3 min 25 s" in pilot
    assert "the sweep:  3 runs, one run at a time ≈ 45 s to 10 min 15 s" in pilot


@pytest.mark.slow
def test_a_sample_that_cannot_train_names_fairseqs_error(tmp_path, capsys):
    data = build_tiny_data(tmp_path / "tiny")
    # a batch of 3 tokens holds no sentence of the tiny data: fairseq skips them all
    assert launch_main(["new-sweep", "--data", str(data), "--out", str(tmp_path / "s.yaml"),
                        "--model", "tiny", "--epochs", "6", "--max-tokens", "3"]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 's.yaml'} is written, but the timed sample of training failed" in err
    assert "Try increasing the max number of allowed tokens" in err and "--no-estimate" in err


def test_it_says_what_its_seeds_can_show_from_the_committed_study(tmp_path, data, capsys):
    """The spread it assumes is the median sd of the equal-training study's per-seed claim
    differences; with 3 seeds: statsmodels' detectable effect × that sd."""
    import numpy as np
    from statsmodels.stats.power import TTestPower

    from fairseq_tying.launch.new_sweep import TYPICAL_SD
    from fairseq_tying.studies.statistics.stats import seeds_for_equivalence
    from tests.helpers import REPO

    summary = json.loads((REPO / "docs" / "equal" / "summary.json").read_text())
    sds = [np.std(list(t["per_seed_delta"].values()), ddof=1)
           for cells in summary.values() for c in cells.values()
           for t in (c.get("vs_dot"), c.get("vs_untied"))
           if isinstance(t, dict) and len(t.get("per_seed_delta", ())) >= 2]
    assert TYPICAL_SD == round(float(np.median(sds)), 2)
    assert _new(tmp_path, data, "--epochs", "9", "--no-estimate") == 0
    out = capsys.readouterr().out
    effect = TTestPower().solve_power(nobs=3, alpha=0.05, power=0.8) * TYPICAL_SD
    assert "What 3 seeds can show" in out and f"a Δ of ±{effect:.2f} BLEU or more" in out
    assert f"equivalence within ±0.5 needs {seeds_for_equivalence(TYPICAL_SD, 0.5)} seeds" in out


def test_the_z_loss_block_is_a_cell_of_its_own(tmp_path, data, capsys):
    """--z-loss λ adds three-way dot trained with the z-loss, tagged zloss: its runs are the
    plain dot runs' commands plus --z-loss λ; its pilot sets the budget with the others', and
    a pilot without it is refused by name."""
    cells = ["--tying", "none", "three_way", "--output-layers", "dot"]
    assert _new(tmp_path, data, "--epochs", "9", "--z-loss", "0", *cells) == 2
    assert "--z-loss 0: λ is positive" in capsys.readouterr().err
    assert _new(tmp_path, data, "--epochs", "9", "--z-loss", "1e-4", *cells) == 0
    runs = {r.name: r for r in load_sweep(tmp_path / "s.yaml", check_data=False).runs}
    tagged = [r for r in runs.values() if r.identity.tag == "zloss"]
    assert len(tagged) == 3 and {r.identity.output_layer for r in tagged} == {"dot"}
    for r in tagged:
        plain = runs[r.name.replace(".dot.zloss.", ".dot.")].identity.train_args
        plain = [a.replace(".dot.", ".dot.zloss.") for a in plain]
        assert sorted(r.identity.train_args) == sorted([*plain, "--z-loss", "0.0001"])
    pilot_yaml, pilot_dir = tmp_path / "pilot.yaml", tmp_path / "pilot_runs"
    assert launch_main(["new-sweep", "--data", str(data), "--out", str(pilot_yaml), "--pilot",
                        "--output-dir", str(pilot_dir), "--no-estimate", "--z-loss", "1e-4",
                        *cells]) == 0
    pilots = load_sweep(pilot_yaml, check_data=False).runs
    assert [r.identity.tag for r in pilots] == [None, None, "zloss"]
    for run, epoch in zip(pilots, (9, 11, 16), strict=True):
        _finish(run.run_dir, epoch)
    assert _new(tmp_path, data, "--budget-from", str(pilot_yaml), "--force", "--z-loss",
                "1e-4", *cells) == 0
    assert {r.stopping["max_epoch"] for r in load_sweep(tmp_path / "s.yaml",
                                                         check_data=False).runs} == {16}
    assert _new(tmp_path, data, "--budget-from", str(pilot_yaml), "--force", *cells) == 0
    assert {r.stopping["max_epoch"] for r in load_sweep(tmp_path / "s.yaml",
                                                         check_data=False).runs} == {11}
    plain_pilot = tmp_path / "plain_pilot.yaml"
    assert launch_main(["new-sweep", "--data", str(data), "--out", str(plain_pilot), "--pilot",
                        "--output-dir", str(pilot_dir), "--no-estimate", *cells]) == 0
    assert _new(tmp_path, data, "--budget-from", str(plain_pilot), "--force", "--z-loss",
                "1e-4", *cells) == 2
    assert "no pilot run of transformer_twwt/three_way/dot+zloss" in capsys.readouterr().err
