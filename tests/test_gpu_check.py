"""make gpu-check: what runs without a GPU (its refusal, its flags, its log checks on a real
fp16 training log from the CPU and on one from an H100). The GPU run itself is not simulated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fairseq_tying.bench import gpu_check
from tests.conftest import TINY_MODEL, run_cli


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal needs a machine without CUDA")
def test_refuses_without_cuda_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "gpu"
    assert gpu_check.main(["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and "torch.cuda.is_available() is False" in err
    assert not out.exists()


def test_flags_are_checked():
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--updates", "10"])
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--output-layer", "softmax"])
    opts = gpu_check.parse_args(["--output-layer", "l2norm", "distance", "--no-bench"])
    assert opts.output_layers == ["l2norm", "distance"] and opts.updates == 300 and opts.no_bench


@pytest.mark.slow
def test_log_checks_on_a_real_fp16_training_log(joined_bin, tmp_path):
    """fairseq's FP16 path on the CPU (--memory-efficient-fp16) writes the same JSON log."""
    proc = run_cli("fairseq-train", str(joined_bin), "--user-dir", "fairseq_tying",
                   "--arch", "transformer_twwt", *TINY_MODEL, "--output-layer", "l2norm",
                   "--memory-efficient-fp16", "--cpu", "--optimizer", "adam", "--lr", "0.005",
                   "--max-tokens", "600", "--max-update", "30", "--log-format", "json",
                   "--log-interval", "5", "--save-dir", str(tmp_path / "ckpt"),
                   "--no-save", "--seed", "2")
    checks = gpu_check.train_log_checks(proc.stdout + proc.stderr, updates=30)
    assert len(checks["logged_losses"]) == 6 and checks["loss_scales"]
    assert checks["finite"] and checks["loss_falling"] and checks["passed"], checks
    # the same log with a NaN loss and an overflow loop fails those checks
    bad = (proc.stdout + proc.stderr).replace('"loss": "', '"loss": "nan", "x": "', 1)
    bad += "\nNOTE: gradient overflow detected, ignoring gradient, setting loss scale to: 0.5\n" * 5
    failed = gpu_check.train_log_checks(bad, updates=30)
    assert not failed["finite"] and not failed["no_overflow_loop"]
    assert not failed["loss_scale_stable"] and not failed["passed"]


def test_makefile_target_runs_the_check():
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    line = "$(PY) -m fairseq_tying.bench --mode gpu-check --out work/gpu_check"
    assert f"gpu-check: setup\n\t{line}" in makefile


H100_LOG = Path(__file__).parent / "fixtures" / "h100_fp16_dot_train.log"


def test_log_checks_on_the_h100_run():
    """The 300 fp16 updates of transformer_twwt_iwslt_de_en x dot on an H100 (make gpu-check's
    own log): two overflows, 128 -> 64 before the first log line and 64 -> 32 at update ~200.
    One late halving is fairseq's loss scaler at work; a scale that keeps halving is not."""
    log = H100_LOG.read_text()
    checks = gpu_check.train_log_checks(log, updates=300)
    assert checks["overflows"] == 2 and checks["late_halvings"] == 1
    assert checks["loss_scales"][0] == 64 and checks["loss_scales"][-1] == 32
    assert checks["finite"] and checks["loss_falling"] and checks["passed"], checks
    parts = log.split('"loss_scale": "32"')
    collapsing = "".join(p + f'"loss_scale": "{32 / 2 ** (i // 3 + 1):g}"'
                         for i, p in enumerate(parts[:-1])) + parts[-1]
    failed = gpu_check.train_log_checks(collapsing, updates=300)
    assert failed["late_halvings"] >= 3 and not failed["loss_scale_stable"]
    assert not failed["passed"]


def test_a_checked_layer_is_kept_and_not_checked_again(tmp_path, monkeypatch):
    """A cut-off check resumes: a layer with a result for the same settings is not run again;
    with other settings it is. (check_output_layer needs a GPU: here it is replaced by a stub
    that counts its calls.)"""
    calls = []
    monkeypatch.setattr(gpu_check, "check_output_layer",
                        lambda data, layer, out, opts: calls.append(layer) or {"passed": True})
    opts = gpu_check.parse_args(["--out", str(tmp_path)])
    assert gpu_check.checked_layer(tmp_path, "l2norm", opts) == {"passed": True}
    kept = json.loads((tmp_path / "layers" / "l2norm.json").read_text())
    assert kept == {"settings": {"updates": 300, "max_tokens": 4096}, "result": {"passed": True}}
    assert gpu_check.checked_layer(tmp_path, "l2norm", opts) == {"passed": True}
    assert calls == ["l2norm"]
    gpu_check.checked_layer(tmp_path, "l2norm", gpu_check.parse_args(
        ["--out", str(tmp_path), "--updates", "600"]))
    assert calls == ["l2norm", "l2norm"]
