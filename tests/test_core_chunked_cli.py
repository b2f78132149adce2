"""--chunked-loss through the real fairseq-train: the same logged losses as without it, for every
output layer, DynamicConv, the language model, half precision; and its refusal of stock archs."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from fairseq_tying.core import output_layers
from tests.helpers import LM_TRAIN, TINY_MODEL, run_cli

pytestmark = pytest.mark.slow  # every test runs fairseq's CLI
TIMING = {"wps", "ups", "wall", "gb_free", "cuda_gb_allocated"}  # also as train_/valid_ keys


def translation_args(data: Path, arch: str, *flags: str) -> list[str]:
    return [str(data), "--user-dir", "fairseq_tying", "--arch", arch, *TINY_MODEL,
            "--dropout", "0.1",  # the same masks with and without: the loss draws no numbers
            "--criterion", "label_smoothed_cross_entropy_pr", "--label-smoothing", "0.1",
            "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "600", "--max-update", "8",
            "--cpu", "--seed", "3", "--no-save", "--log-format", "json", "--log-interval", "1",
            *flags]


def logged(log: str) -> list[tuple[str, dict]]:
    """fairseq's JSON records (train_inner, train, valid) without the timings."""
    records = re.findall(r"\| (train_inner|train|valid) \| (\{.*\})\s*$", log, re.M)
    return [(kind, {k: v for k, v in json.loads(rec).items()
                    if k.removeprefix(f"{kind}_").removeprefix("train_") not in TIMING})
            for kind, rec in records]


def assert_same_logs(want: list, got: list) -> None:
    """The same records, keys and values to the printed digits (a value computed in another
    order may round to the neighbouring last digit). A perplexity is 2**loss of the unrounded
    loss, so a loss that differs in its 3rd printed digit moves it by up to ppl·ln 2·10⁻³."""
    assert [kind for kind, _ in got] == [kind for kind, _ in want]
    assert sum(kind == "train_inner" for kind, _ in want) >= 8
    for (_, w), (_, g) in zip(want, got, strict=True):
        assert set(g) == set(w)
        for key, value in w.items():
            digits = len(str(value).split(".")[1]) if "." in str(value) else 0
            tolerance = 1.01 * 10**-digits
            if key.endswith("ppl"):
                tolerance += float(value) * math.log(2) * 1.01e-3
            assert abs(float(g[key]) - float(value)) <= tolerance, (key, w, g)


# chunks of a few dozen rows (V ≈ 100 in these tests): several per batch
CHUNKED = ["--chunked-loss", "--chunked-loss-mb", "0.01"]


def train_both(*args: str) -> tuple[list, list]:
    runs = [run_cli("fairseq-train", *args, *extra) for extra in (["--no-chunked-loss"], CHUNKED)]
    return tuple(logged(p.stdout + p.stderr) for p in runs)


@pytest.mark.parametrize("output_layer", output_layers.names())
def test_every_output_layer_logs_the_same_losses(joined_bin, output_layer):
    want, got = train_both(*translation_args(joined_bin, "transformer_twwt", "--output-layer",
                                             output_layer, "--output-bias"))
    assert "nll_loss" in got[0][1] and "wnorm_mean" in got[0][1]
    assert_same_logs(want, got)


def test_dynamicconv_with_projection_and_accuracy(joined_bin):
    want, got = train_both(*translation_args(joined_bin, "dynamicconv_dwt", "--output-layer",
                                             "distance", "--tied-projection",
                                             "--report-accuracy", "--ignore-prefix-size", "1"))
    assert "accuracy" in got[0][1] and "train_accuracy" in got[-1][1]
    assert_same_logs(want, got)


def test_fp16_optimizer_logs_the_same_losses(joined_bin):
    """fairseq's FP16Optimizer (half weights, fp32 master copy, loss scale) runs on a CPU only
    without its flattened master copy, which it puts on a CUDA device. (fairseq's --bf16 implies
    a TPU: bf16 is covered by the criterion's unit tests, tests/test_core_chunked_loss.py.)"""
    want, got = train_both(*translation_args(joined_bin, "transformer_twwt", "--output-layer",
                                             "l2norm", "--fp16", "--fp16-no-flatten-grads"))
    assert "loss_scale" in got[0][1]
    assert_same_logs(want, got)


def test_language_model_logs_the_same_losses_as_stock_cross_entropy(lm_bin, tmp_path):
    args = [str(lm_bin), "--arch", "transformer_lm_tied", "--output-layer", "cosine",
            "--save-dir", str(tmp_path), "--no-save", *LM_TRAIN, "--max-update", "8",
            "--log-format", "json", "--log-interval", "1"]
    stock = run_cli("fairseq-train", *args, "--criterion", "cross_entropy")
    chunked = run_cli("fairseq-train", *args, "--criterion", "cross_entropy_tying", *CHUNKED)
    assert_same_logs(logged(stock.stdout + stock.stderr), logged(chunked.stdout + chunked.stderr))


def test_stock_architecture_is_refused(joined_bin, tmp_path):
    # fairseq saves crash.pt to --save-dir when a train step raises, even with --no-save
    proc = run_cli("fairseq-train", *translation_args(joined_bin, "transformer",
                                                      "--share-all-embeddings", "--chunked-loss",
                                                      "--save-dir", str(tmp_path)),
                   check=False)
    assert proc.returncode != 0
    assert "--chunked-loss scores the decoder's features" in proc.stderr
