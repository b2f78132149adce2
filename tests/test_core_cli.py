"""The plugin through fairseq's real command-line tools: train every family x tying x output
layer, generate from the checkpoints, resume training, and the errors for bad input."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from fairseq_tying.core import output_layers
from tests.helpers import generate, last_updates, run_cli, train_args

pytestmark = pytest.mark.slow  # every test runs fairseq's CLI

TYING_ARCH = {"none": "dwt", "decoder": "dwt", "three_way": "twwt"}


@pytest.mark.parametrize("output_layer", output_layers.names())
@pytest.mark.parametrize("tying", ["none", "decoder", "three_way"])
@pytest.mark.parametrize("family", ["transformer", "dynamicconv"])
def test_train_then_generate(joined_bin, tmp_path, family, tying, output_layer):
    arch = f"{family}_{TYING_ARCH[tying]}"
    proc = run_cli("fairseq-train", *train_args(joined_bin, tmp_path, arch, "--tying", tying,
                                                 "--output-layer", output_layer))
    log = proc.stdout + proc.stderr
    assert last_updates(log) == 4 and "wnorm_mean" in log
    assert re.search(r"train \| epoch 001 \| loss (\d+\.\d+)", log)
    ckpt = tmp_path / "checkpoint_last.pt"
    state = torch.load(ckpt, weights_only=True)  # the plugin's allowlist is active here
    assert (
        state["cfg"]["model"].output_layer == output_layer and state["cfg"]["model"].tying == tying
    )
    if tying != "three_way" or family == "dynamicconv" and output_layer not in ("dot", "l2norm"):
        return  # generation from every checkpoint would triple the run time; one per rule suffices
    assert len(generate(joined_bin, ckpt, "--beam", "4")) == 20


def tensorboard_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """``{"train/loss": [(update, value), ...], ...}`` read back with tensorboard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = {}
    for run in sorted(p for p in logdir.iterdir() if p.is_dir()):
        acc = EventAccumulator(str(run))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out[f"{run.name}/{tag}"] = [(e.step, e.value) for e in acc.Scalars(tag)]
    return out


def test_resume_from_checkpoint_last_continues_the_update_count(joined_bin, tmp_path):
    args = train_args(
        joined_bin, tmp_path, "transformer_twwt", "--output-layer", "distance", "--tied-projection",
        "--tensorboard-logdir", str(tmp_path / "tb"),
    )
    first = run_cli("fairseq-train", *args)
    assert "tensorboard not found" not in first.stdout + first.stderr
    resumed = run_cli("fairseq-train", *args, "--max-update", "9")
    log = resumed.stdout + resumed.stderr
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch \d+ @ 4 updates\)", log)
    assert last_updates(log) == 9
    # --tensorboard-logdir: the losses fairseq logs, per update and per validation, as events
    scalars = tensorboard_scalars(tmp_path / "tb")
    assert [step for step, _ in scalars["train_inner/loss"]] == list(range(1, 10))
    logged = re.findall(r"\| valid on 'valid' subset \| loss (\d+\.\d+) .*num_updates (\d+)", log)
    valid = dict(scalars["valid/loss"])
    assert logged and 9 in valid
    for loss, step in logged:
        assert valid[int(step)] == pytest.approx(float(loss), abs=1e-3)
    assert all(v > 0 for _, v in scalars["train/loss"])


def test_validate_and_interactive_load_plugin_checkpoints(joined_bin, tmp_path):
    run_cli(
        "fairseq-train",
        *train_args(joined_bin, tmp_path, "dynamicconv_twwt", "--output-layer", "cosine"),
    )
    ckpt = str(tmp_path / "checkpoint_last.pt")
    val = run_cli(
        "fairseq-validate",
        str(joined_bin),
        "--task",
        "translation",
        "--user-dir",
        "fairseq_tying",
        "--path",
        ckpt,
        "--cpu",
        "--max-tokens",
        "600",
    )
    assert re.search(r"valid on 'valid' subset \| loss \d", val.stdout + val.stderr)
    inter = subprocess_input(
        "fairseq-interactive",
        "w1 w2 w3\n",
        str(joined_bin),
        "--user-dir",
        "fairseq_tying",
        "--path",
        ckpt,
        "--cpu",
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        "--beam",
        "2",
    )
    assert re.search(r"^H-0\t", inter, re.M)


def subprocess_input(tool: str, text: str, *args: str) -> str:
    return run_cli(tool, *args, input=text).stdout


@pytest.mark.parametrize("output_layer", output_layers.names())
def test_half_precision_training_through_the_cli(joined_bin, tmp_path, output_layer):
    """--memory-efficient-fp16 on CPU keeps parameters and activations in real fp16."""
    proc = run_cli(
        "fairseq-train",
        *train_args(
            joined_bin,
            tmp_path,
            "transformer_twwt",
            "--output-layer",
            output_layer,
            "--memory-efficient-fp16",
        ),
    )
    log = proc.stdout + proc.stderr
    assert "loss_scale" in log and last_updates(log) == 4
    losses = [float(x) for x in re.findall(r"\| loss (\S+) \|", log)]
    assert losses and all(torch.isfinite(torch.tensor(losses)))


# --- bad input ------------------------------------------------------------------------------


def _train_error(data: Path, tmp_path: Path, arch: str, *flags: str) -> str:
    proc = run_cli("fairseq-train", *train_args(data, tmp_path, arch, *flags), check=False)
    assert proc.returncode != 0
    return proc.stderr


def test_three_way_tying_needs_a_joined_dictionary(separate_bin, tmp_path):
    err = _train_error(separate_bin, tmp_path, "transformer_twwt")
    assert "--joined-dictionary" in err and "three_way" in err
    _train_error(separate_bin, tmp_path, "dynamicconv_twwt")
    assert not (tmp_path / "checkpoint_last.pt").exists()


def test_hidden_size_differs_without_projection(joined_bin, tmp_path):
    err = _train_error(joined_bin, tmp_path, "transformer_dwt", "--tied-embed-dim", "8")
    assert "--tied-projection" in err and "H=16" in err and "D=8" in err


def test_unknown_output_layer_lists_the_choices(joined_bin, tmp_path):
    err = _train_error(joined_bin, tmp_path, "transformer_twwt", "--output-layer", "softmax")
    assert "--output-layer" in err and "invalid choice: 'softmax'" in err
    for output_layer in output_layers.names():
        assert output_layer in err


def test_checkpoint_without_user_dir_fails_loudly(joined_bin, tmp_path):
    """Without --user-dir fairseq never imports the plugin, so it cannot phrase this error: torch
    refuses the checkpoint's argparse.Namespace (the README shows the fix, --user-dir)."""
    run_cli("fairseq-train", *train_args(joined_bin, tmp_path, "transformer_twwt"))
    proc = run_cli(
        "fairseq-generate",
        str(joined_bin),
        "--path",
        str(tmp_path / "checkpoint_last.pt"),
        "--cpu",
        check=False,
    )
    assert proc.returncode != 0 and "argparse.Namespace" in proc.stderr
