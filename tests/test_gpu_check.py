"""make gpu-check: what runs without a GPU (its refusal, its flags, its log checks on a real
fp16 training log from the CPU and on one from an H100). The GPU run itself is not simulated."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from fairseq_tying import translate
from fairseq_tying.bench import gpu_check
from fairseq_tying.core import output_layers
from tests.helpers import REPO, TINY_MODEL, run_cli


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
    makefile = (REPO / "Makefile").read_text()
    line = "$(PY) -m fairseq_tying.bench --mode gpu-check --out work/gpu_check"
    assert f"gpu-check: setup\n\t{line}" in makefile


H100_LOG = REPO / "tests" / "fixtures" / "h100_fp16_dot_train.log"


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


GPU_LAYERS = {  # make gpu-check step 1, the output layers side by side on one GPU:
    # (overflows, late halvings, first and last logged loss scale); SECONDS: training's bounds
    "h100": {"l2norm": (3, 0, 64, 16), "sqnorm": (3, 0, 64, 16), "distance": (4, 1, 64, 8),
             "cosine": (2, 0, 64, 32)},
    "h200": {"dot": (2, 1, 64, 32), "l2norm": (3, 0, 64, 16), "sqnorm": (3, 0, 64, 16),
             "distance": (4, 1, 64, 8), "cosine": (2, 0, 64, 32), "fixnorm": (1, 0, 64, 64)},
}
SECONDS = {"h100": (80, 100), "h200": (90, 110)}


@pytest.mark.parametrize("gpu,output_layer",
                         [(g, la) for g, layers in GPU_LAYERS.items() for la in sorted(layers)])
def test_log_checks_on_the_gpu_runs_of_each_layer(gpu, output_layer):
    """Their fp16 training passed on the GPU (H100: the normalized layers; H200, torch
    2.11.0+cu130: all six, fixnorm too): finite, falling losses and a stable loss scale
    (distance's one late overflow, 16 -> 8, is the halving the check allows)."""
    log = (REPO / "tests" / "fixtures" / f"{gpu}_fp16_{output_layer}_train.log").read_text()
    assert f"--output-layer {output_layer} --fp16" in log and f"NVIDIA {gpu.upper()}" in log
    checks = gpu_check.train_log_checks(log, updates=300)
    overflows, late, first, last = GPU_LAYERS[gpu][output_layer]
    assert (checks["overflows"], checks["late_halvings"]) == (overflows, late)
    assert (checks["loss_scales"][0], checks["loss_scales"][-1]) == (first, last)
    low, high = SECONDS[gpu]
    assert len(checks["logged_losses"]) == 30 and low < checks["seconds"] < high
    assert checks["passed"], checks


class GpuSteps:
    """check_output_layer and ct2_fp16 need a GPU: here they are replaced by stubs that count
    their calls and, like the real steps, keep steps 1-2 on disk before step 3."""

    def __init__(self, monkeypatch):
        self.calls: list[str] = []
        monkeypatch.setattr(gpu_check, "check_output_layer", self.check)
        monkeypatch.setattr(gpu_check, "ct2_fp16", self.decode)
        monkeypatch.setattr(gpu_check, "generated_hypotheses", lambda run_dir: {})

    def check(self, data, layer, out, opts, settings):
        self.calls.append(f"check {layer}")
        result = {"passed": True}
        gpu_check.atomic.write_json(gpu_check.layer_path(out, layer),
                                    {"settings": settings, "result": result})
        return result

    def decode(self, data, run_dir, reference):
        self.calls.append(f"decode {run_dir.name}")
        if self.decode_error:
            raise translate.cuda_library_error(RuntimeError(self.decode_error))
        return {"bleu": 1.0}

    decode_error = ""


def test_a_checked_layer_is_kept_and_not_checked_again(tmp_path, monkeypatch):
    """A cut-off check resumes: a layer with a complete result for the same settings is not run
    again; one cut off during CTranslate2 decoding is only decoded again; with other settings
    it is checked again."""
    steps = GpuSteps(monkeypatch)
    opts = gpu_check.parse_args(["--out", str(tmp_path)])
    done = {"passed": True, "ct2_float16": {"bleu": 1.0}}
    assert gpu_check.checked_layer(tmp_path, "l2norm", opts) == done
    path = gpu_check.layer_path(tmp_path, "l2norm")
    assert json.loads(path.read_text()) == {
        "settings": {"updates": 300, "max_tokens": 4096, "chunked_loss": True},
        "result": done}
    assert gpu_check.checked_layer(tmp_path, "l2norm", opts) == done
    assert steps.calls == ["check l2norm", "decode l2norm"]

    kept = json.loads(path.read_text())
    del kept["result"]["ct2_float16"]
    path.write_text(json.dumps(kept))
    assert gpu_check.checked_layer(tmp_path, "l2norm", opts) == done
    assert steps.calls == ["check l2norm", "decode l2norm", "decode l2norm"]

    gpu_check.checked_layer(tmp_path, "l2norm", gpu_check.parse_args(
        ["--out", str(tmp_path), "--updates", "600"]))
    assert steps.calls[3:] == ["check l2norm", "decode l2norm"]


def test_output_layers_are_checked_side_by_side(tmp_path, monkeypatch):
    """--jobs N runs N layers at once (the stubs wait at a barrier that only N concurrent calls
    pass) and keeps the layers' order; the default is all of them."""
    assert gpu_check.parse_args([]).jobs == len(output_layers.names())
    assert gpu_check.parse_args(["--output-layer", "dot", "cosine"]).jobs == 2
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--jobs", "0"])
    barrier = threading.Barrier(3, timeout=20)
    monkeypatch.setattr(gpu_check, "checked_layer",
                        lambda data, layer, opts: barrier.wait() is not None and layer)
    opts = gpu_check.parse_args(["--out", str(tmp_path), "--output-layer", "cosine", "dot",
                                 "sqnorm", "--jobs", "3"])
    assert gpu_check.checked_layers(tmp_path, opts) == {
        "cosine": "cosine", "dot": "dot", "sqnorm": "sqnorm"}


def test_a_failed_decoding_keeps_the_verdict_and_is_tried_again(tmp_path, monkeypatch):
    """CTranslate2 float16 is reported, not checked: when it fails (here: the error CTranslate2
    raises on a machine without CUDA 12's cuBLAS), the layer keeps its verdict and the error,
    and a rerun decodes again."""
    steps = GpuSteps(monkeypatch)
    steps.decode_error = "Library libcublas.so.12 is not found or cannot be loaded"
    opts = gpu_check.parse_args(["--out", str(tmp_path)])
    result = gpu_check.checked_layer(tmp_path, "cosine", opts)
    assert result["passed"] and "nvidia-cublas-cu12" in result["ct2_float16"]["error"]
    steps.decode_error = ""
    assert gpu_check.checked_layer(tmp_path, "cosine", opts)["ct2_float16"] == {"bleu": 1.0}
    assert steps.calls == ["check cosine", "decode cosine", "decode cosine"]


def test_cuda_library_errors_say_what_to_do():
    hint = translate.cuda_library_error(RuntimeError("Library libcublas.so.12 is not found or "
                                                     "cannot be loaded"))
    assert "libcublas.so.12" in str(hint) and "nvidia-cublas-cu12" in str(hint)
    assert "--device cpu" in str(hint)
    other = RuntimeError("out of memory")
    assert translate.cuda_library_error(other) is other


def test_chunked_training_must_log_the_reference_losses():
    """Step 3's verdict: the H100 log's checks pass against themselves, and fail for losses 2 %
    off or for fewer than three logged values."""
    log = H100_LOG.read_text()
    reference = gpu_check.train_log_checks(log, updates=300)
    same = gpu_check.compare_first_losses(reference, reference)
    assert same["passed"] and same["first_losses_rel_gap"] == 0.0
    off = {**reference, "logged_losses": [x * 1.02 for x in reference["logged_losses"]]}
    assert not gpu_check.compare_first_losses(off, reference)["passed"]
    short = {**reference, "logged_losses": reference["logged_losses"][:2]}
    assert not gpu_check.compare_first_losses(short, reference)["same_first_losses"]


def test_no_ctranslate2_skips_step_4_and_says_so(tmp_path, monkeypatch):
    """--no-ctranslate2 checks steps 1-3 without decoding and records the skip; a later run
    without the flag decodes the kept checkpoint only; torch alone must see the GPU."""
    steps = GpuSteps(monkeypatch)
    skip = gpu_check.parse_args(["--out", str(tmp_path), "--no-ctranslate2"])
    result = gpu_check.checked_layer(tmp_path, "dot", skip)
    assert result == {"passed": True, "ct2_float16": {"skipped": "--no-ctranslate2"}}
    assert gpu_check.checked_layer(tmp_path, "dot", skip) == result
    assert steps.calls == ["check dot"]
    opts = gpu_check.parse_args(["--out", str(tmp_path)])
    assert gpu_check.checked_layer(tmp_path, "dot", opts)["ct2_float16"] == {"bleu": 1.0}
    assert steps.calls == ["check dot", "decode dot"]
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    with pytest.raises(gpu_check.GpuCheckError, match="torch sees none"):
        gpu_check.require_cuda(with_ctranslate2=False)

