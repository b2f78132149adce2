"""--chunked-loss: the same loss, nll_loss, accuracy and gradients as fairseq's criterions (which
score every token, then take the log-softmax), for every output layer, tying mode and flag."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fairseq import options, tasks
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

from fairseq_tying.core import scoring
from fairseq_tying.core.criterions.chunked import linear_label_smoothed_nll_loss, predictions
from tests.helpers import PLUGIN_DIR, TINY_LM, TINY_MODEL

RTOL = 1e-5  # fp32, relative
TRANSLATION = ["--criterion", "label_smoothed_cross_entropy_pr", "--label-smoothing", "0.1"]
# the projection and the output bias, the first target token ignored, losses per sentence
ALL_FLAGS = ["--tied-projection", "--output-bias", "--ignore-prefix-size", "1", "--sentence-avg"]


def _setup(data, arch: str, *flags: str, model_flags=TINY_MODEL):
    import fairseq_tying  # noqa: F401

    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(data), "--user-dir", PLUGIN_DIR, "--arch", arch, *model_flags, *flags])
    task = tasks.setup_task(args)
    task.load_dataset("train")
    model, criterion = task.build_model(args), task.build_criterion(args)
    scorer = getattr(model.decoder, "scorer", None)
    if scorer is not None and scorer.bias is not None:
        with torch.no_grad():  # b₂ starts at zero; make it count
            scorer.bias.normal_()
    data = task.dataset("train")
    sample = data.collater([data[i] for i in range(6)])  # a real batch, padded
    assert sample["target"].eq(task.target_dictionary.pad()).any()
    return model, criterion, sample


def _run(model, criterion, sample, chunked: bool):
    """(loss, logging output, every parameter's gradient) of one forward and backward."""
    criterion.chunked_loss = chunked
    model.zero_grad()
    torch.manual_seed(0)  # the same dropout masks: the chunked loss draws no random numbers
    loss, sample_size, log = criterion(model, sample)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), sample_size, log, grads


def _relative(got, want) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def assert_same_loss_and_gradients(model, criterion, sample):
    model.train()
    want, want_size, want_log, want_grads = _run(model, criterion, sample, chunked=False)
    got, got_size, got_log, got_grads = _run(model, criterion, sample, chunked=True)
    assert got.dtype == torch.float32 and got_size == want_size
    assert set(got_log) == set(want_log)
    for key in ("loss", "nll_loss"):
        if key in want_log:
            assert _relative(got_log[key], want_log[key]) < RTOL, key
    assert _relative(got, want) < RTOL
    assert set(got_grads) == set(want_grads)
    scale = max(g.norm() for g in want_grads.values())
    for name, g in want_grads.items():
        if name.endswith("k_proj.bias"):  # attention's softmax ignores it: its gradient is noise
            assert g.norm() < 1e-5 * scale and got_grads[name].norm() < 1e-5 * scale
        else:
            assert _relative(got_grads[name], g) < RTOL, name
    return got_log


# --- the formula ----------------------------------------------------------------------------


@pytest.mark.parametrize("reduce", [True, False])
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
@pytest.mark.parametrize("with_bias", [True, False])
def test_formula_equals_fairseqs_on_the_full_scores(reduce, epsilon, with_bias):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(50, 12, generator=g, requires_grad=True)
    w = torch.randn(300, 12, generator=g, requires_grad=True)
    b = torch.randn(300, generator=g, requires_grad=True) if with_bias else None
    target = torch.randint(0, 300, (50,), generator=g)
    target[::7] = 1  # padding
    inputs = [t for t in (h, w, b) if t is not None]

    lprobs = F.log_softmax(F.linear(h, w, b).float(), dim=-1)
    want = label_smoothed_nll_loss(lprobs, target, epsilon, ignore_index=1, reduce=reduce)
    got = linear_label_smoothed_nll_loss(h, w, b, target, epsilon, ignore_index=1, reduce=reduce)
    for x, y in zip(got, want, strict=True):
        assert x.shape == y.shape and _relative(x, y) < RTOL
    upstream = torch.rand_like(want[0], generator=g)
    want_grads = torch.autograd.grad(want[0], inputs, upstream)
    got_grads = torch.autograd.grad(got[0], inputs, upstream)
    for x, y in zip(got_grads, want_grads, strict=True):
        assert _relative(x, y) < RTOL


def test_predictions_are_the_argmax_of_the_scores_in_chunks():
    g = torch.Generator().manual_seed(1)
    h, w, b = torch.randn(70, 4, generator=g), torch.randn(500, 4, generator=g), torch.randn(500)
    assert torch.equal(predictions(h, w, b), F.linear(h, w, b).argmax(-1))


# --- every output layer and tying mode through the criterions --------------------------------


@pytest.mark.parametrize("flags", [[], ALL_FLAGS], ids=["plain", "projection-bias-prefix-sent"])
@pytest.mark.parametrize("tying", ["none", "decoder", "three_way"])
@pytest.mark.parametrize("output_layer", scoring.OUTPUT_LAYERS)
def test_transformer_same_loss_and_gradients(joined_bin, output_layer, tying, flags):
    model, criterion, sample = _setup(joined_bin, "transformer_twwt", "--tying", tying,
                                      "--output-layer", output_layer, *TRANSLATION, *flags)
    assert criterion.ignore_prefix_size == (1 if flags else 0)
    assert criterion.sentence_avg == bool(flags)
    assert_same_loss_and_gradients(model, criterion, sample)


@pytest.mark.parametrize("output_layer", ["dot", "distance"])
def test_dynamicconv_same_loss_and_gradients(joined_bin, output_layer):
    model, criterion, sample = _setup(joined_bin, "dynamicconv_twwt", "--output-layer",
                                      output_layer, *TRANSLATION, *ALL_FLAGS)
    assert_same_loss_and_gradients(model, criterion, sample)


LM = ["--task", "language_modeling", "--sample-break-mode", "eos"]  # sentences: padded blocks


@pytest.mark.parametrize("flags", [[], ["--tied-embed-dim", "8", "--tied-projection",
                                         "--output-bias"]], ids=["plain", "tiedL-bias"])
@pytest.mark.parametrize("output_layer", scoring.OUTPUT_LAYERS)
def test_language_model_same_loss_and_gradients(lm_bin, output_layer, flags):
    model, criterion, sample = _setup(lm_bin, "transformer_lm_tied", *LM, "--criterion",
                                      "cross_entropy_tying", "--output-layer", output_layer,
                                      *flags, model_flags=TINY_LM)
    assert_same_loss_and_gradients(model, criterion, sample)


def test_cross_entropy_tying_is_fairseqs_cross_entropy(lm_bin):
    """Without --chunked-loss it is stock cross_entropy, log for log."""
    model, criterion, sample = _setup(lm_bin, "transformer_lm_tied", *LM, "--criterion",
                                      "cross_entropy_tying", model_flags=TINY_LM)
    _, stock, _ = _setup(lm_bin, "transformer_lm_tied", *LM, "--criterion", "cross_entropy",
                         model_flags=TINY_LM)
    model.eval()
    with torch.no_grad():
        want, got = stock(model, sample), criterion(model, sample)
    assert type(stock).__name__ == "CrossEntropyCriterion"
    assert got[1] == want[1] and torch.equal(got[0], want[0]) and got[2] == want[2]


def test_validation_without_autograd_uses_the_same_loss(joined_bin):
    """In eval mode without autograd the scorer's cached (W_out, b) feeds the chunked loss."""
    model, criterion, sample = _setup(joined_bin, "transformer_twwt", "--output-layer", "sqnorm",
                                      *TRANSLATION, "--output-bias")
    model.eval()
    with torch.no_grad():
        want = criterion(model, sample)
        criterion.chunked_loss = True
        got = criterion(model, sample)
    assert _relative(got[0], want[0]) < RTOL
    assert _relative(got[2]["nll_loss"], want[2]["nll_loss"]) < RTOL


def test_report_accuracy_counts_the_same_correct_tokens(joined_bin):
    model, criterion, sample = _setup(joined_bin, "transformer_twwt", "--output-layer", "l2norm",
                                      *TRANSLATION, "--output-bias", "--report-accuracy")
    target = sample["target"]
    common = target[target.ne(1)].mode().values  # the most frequent real target token
    with torch.no_grad():
        model.decoder.scorer.bias[common] = 50.0  # predicted everywhere: a known count
    log = assert_same_loss_and_gradients(model, criterion, sample)
    assert log["n_correct"] == target.eq(common).sum().item() > 0
    assert log["total"] == target.ne(1).sum().item()


def test_stock_architecture_is_refused_by_name(joined_bin):
    model, criterion, sample = _setup(joined_bin, "transformer", "--share-all-embeddings",
                                      *TRANSLATION, "--chunked-loss")
    with pytest.raises(ValueError, match="--chunked-loss.*plugin's --arch"):
        criterion(model, sample)


# --- half precision -------------------------------------------------------------------------


# (loss, gradient) relative error bounds against the exact (fp64) loss of the same half inputs;
# a sum of the losses in half precision would be off by ~5e-4 (fp16) and ~4e-3 (bf16)
HALF_BOUNDS = {torch.float16: (5e-5, 2e-3), torch.bfloat16: (2e-4, 2e-2)}


@pytest.mark.parametrize("dtype", HALF_BOUNDS, ids=str)
def test_half_precision_loss_is_summed_in_fp32(dtype):
    """Half inputs: log Z accumulated in fp32 by torch's op, each token's loss rounded once to
    half (as fairseq's half scores are), the tokens summed in fp32."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(4096, 16, generator=g).to(dtype).requires_grad_()
    w = torch.randn(64, 16, generator=g).to(dtype).requires_grad_()
    b = torch.randn(64, generator=g).to(dtype).requires_grad_()
    target = torch.randint(0, 64, (4096,), generator=g)
    target[::9] = 1
    lprobs = F.log_softmax(F.linear(h.double(), w.double(), b.double()), dim=-1)
    exact = label_smoothed_nll_loss(lprobs, target, 0.1, ignore_index=1)[0]
    got = linear_label_smoothed_nll_loss(h, w, b, target, 0.1, ignore_index=1)[0]
    assert got.dtype == torch.float32
    loss_bound, grad_bound = HALF_BOUNDS[dtype]
    assert _relative(got, exact) < loss_bound
    for x, y in zip(torch.autograd.grad(got, (h, w, b)), torch.autograd.grad(exact, (h, w, b)),
                    strict=True):
        assert x.dtype == dtype and _relative(x, y) < grad_bound


@pytest.mark.parametrize("dtype", HALF_BOUNDS, ids=str)
@pytest.mark.parametrize("output_layer", ["l2norm", "distance"])
def test_half_model_trains_as_with_fairseqs_loss(joined_bin, dtype, output_layer):
    """A half model, as fairseq's trainer makes it under --fp16 (--bf16 implies a TPU in
    fairseq, so only this path runs it on a CPU): loss and gradients close to fairseq's."""
    model, criterion, sample = _setup(joined_bin, "transformer_twwt", "--output-layer",
                                      output_layer, *TRANSLATION, "--output-bias")
    model.to(dtype).train()
    want, _, want_log, want_grads = _run(model, criterion, sample, chunked=False)
    got, _, got_log, got_grads = _run(model, criterion, sample, chunked=True)
    assert got.dtype == want.dtype == torch.float32
    assert _relative(got, want) < 1e-3
    assert _relative(got_log["nll_loss"], want_log["nll_loss"]) < 1e-3
    grad_bound = HALF_BOUNDS[dtype][1]
    for name, g in want_grads.items():
        if not name.endswith("k_proj.bias"):  # noise, see assert_same_loss_and_gradients
            assert got_grads[name].dtype == dtype
            assert _relative(got_grads[name], g) < 2 * grad_bound, name
