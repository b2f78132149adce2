"""--chunked-loss through the real fairseq-train: the same logged losses as without it, for every
output layer, DynamicConv, the language model, half precision; and its refusal of stock archs."""

from __future__ import annotations

import pytest

from fairseq_tying.core import output_layers
from tests.helpers import (
    CHUNKED,
    LM_TRAIN,
    assert_same_logs,
    logged,
    run_cli,
    train_both,
    translation_args,
)

pytestmark = pytest.mark.slow  # every test runs fairseq's CLI


@pytest.mark.parametrize("output_layer", output_layers.names())
def test_every_output_layer_logs_the_same_losses(joined_bin, tmp_path, output_layer):
    want, got = train_both(*translation_args(joined_bin, tmp_path, "transformer_twwt",
                                             "--output-layer", output_layer, "--output-bias"))
    assert "nll_loss" in got[0][1] and "wnorm_mean" in got[0][1]
    assert_same_logs(want, got)


def test_dynamicconv_with_projection_and_accuracy(joined_bin, tmp_path):
    want, got = train_both(*translation_args(joined_bin, tmp_path, "dynamicconv_dwt",
                                             "--output-layer", "distance", "--tied-projection",
                                             "--report-accuracy", "--ignore-prefix-size", "1"))
    assert "accuracy" in got[0][1] and "train_accuracy" in got[-1][1]
    assert_same_logs(want, got)


def test_fp16_optimizer_logs_the_same_losses(joined_bin, tmp_path):
    """fairseq's FP16Optimizer (half weights, fp32 master copy, loss scale) runs on a CPU only
    without its flattened master copy, which it puts on a CUDA device. (fairseq's --bf16 implies
    a TPU: bf16 is covered by the criterion's unit tests, tests/test_core_chunked_loss.py.)"""
    want, got = train_both(*translation_args(joined_bin, tmp_path, "transformer_twwt",
                                             "--output-layer", "l2norm", "--fp16",
                                             "--fp16-no-flatten-grads"))
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
    proc = run_cli("fairseq-train", *translation_args(joined_bin, tmp_path, "transformer",
                                                      "--share-all-embeddings", "--chunked-loss"),
                   check=False)
    assert proc.returncode != 0
    assert "--chunked-loss scores the decoder's features" in proc.stderr
