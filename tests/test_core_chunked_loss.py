"""--chunked-loss: the same loss, nll_loss, accuracy and gradients as fairseq's criterions (which
score every token, then take the log-softmax), for every output layer, tying mode, flag and chunk
size; half precision without underflow; where it is the default."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fairseq import options, tasks
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

from fairseq_tying.core import output_layers, scoring
from fairseq_tying.core.criterions import chunked
from fairseq_tying.core.criterions.chunked import linear_label_smoothed_nll_loss, rows_per_chunk
from tests.helpers import PLUGIN_DIR, TINY_LM, TINY_MODEL

RTOL = 1e-5  # fp32, relative
TRANSLATION = ["--criterion", "label_smoothed_cross_entropy_pr", "--label-smoothing", "0.1"]
# the projection and the output bias, the first target token ignored, losses per sentence
ALL_FLAGS = ["--tied-projection", "--output-bias", "--ignore-prefix-size", "1", "--sentence-avg"]
CHUNK_ROWS = 7  # the criterions' chunks in these tests: several per batch, the last one shorter


def budget(rows: int, vocab: int, dtype: torch.dtype = torch.float32) -> float:
    """--chunked-loss-mb that gives chunks of ``rows`` rows."""
    mb = rows * vocab * (4 if dtype == torch.float32 else 6) / 2**20
    assert rows_per_chunk(vocab, dtype, mb) == rows
    return mb


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
    vocab = len(criterion.task.target_dictionary)
    criterion.chunked_loss_mb = budget(CHUNK_ROWS, vocab, next(model.parameters()).dtype)
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


def _fairseqs(h, w, b, target, epsilon, reduce=True):
    """fairseq's criterion on the full scores, log-softmax in fp32 as its models take it."""
    lprobs = F.log_softmax(F.linear(h, w, b).float(), dim=-1)
    return label_smoothed_nll_loss(lprobs, target, epsilon, ignore_index=1, reduce=reduce)


def _inputs(n: int, vocab: int, dim: int, with_bias: bool = True, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, dim, generator=g, requires_grad=True)
    w = torch.randn(vocab, dim, generator=g, requires_grad=True)
    b = torch.randn(vocab, generator=g, requires_grad=True) if with_bias else None
    target = torch.randint(0, vocab, (n,), generator=g)
    target[::7] = 1  # padding
    return h, w, b, target


@pytest.mark.parametrize("rows", [1, 7, 16, 50, 64], ids=lambda r: f"rows{r}")
@pytest.mark.parametrize("reduce", [True, False])
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
@pytest.mark.parametrize("with_bias", [True, False])
def test_formula_equals_fairseqs_on_the_full_scores(reduce, epsilon, with_bias, rows):
    """50 rows in chunks of 1, 7 and 16 (the last one shorter), one chunk, a chunk beyond N."""
    h, w, b, target = _inputs(50, 300, 12, with_bias)
    inputs = [t for t in (h, w, b) if t is not None]
    want = _fairseqs(h, w, b, target, epsilon, reduce)
    got = linear_label_smoothed_nll_loss(h, w, b, target, epsilon, ignore_index=1, reduce=reduce,
                                         budget_mb=budget(rows, 300))
    assert got[2] is None  # no accuracy asked for
    for x, y in zip(got[:2], want, strict=True):
        assert x.shape == y.shape and x.dtype == torch.float32 and _relative(x, y) < RTOL
    upstream = torch.rand_like(want[0], generator=torch.Generator().manual_seed(1)) + 0.5
    want_grads = torch.autograd.grad(want[0], inputs, upstream)
    got_grads = torch.autograd.grad(got[0], inputs, upstream)
    for x, y in zip(got_grads, want_grads, strict=True):
        assert x.dtype == y.dtype and _relative(x, y) < RTOL


@pytest.mark.parametrize("rows", [3, 8, 1000], ids=lambda r: f"rows{r}")
def test_correct_predictions_are_counted_as_fairseq_counts_them(rows):
    h, w, b, target = _inputs(40, 30, 4, seed=1)  # a small V: many rows predict their target
    target[1::3] = (h @ w.T + b).argmax(-1)[1::3]
    lprobs = F.log_softmax(F.linear(h, w, b), -1)
    mask = target.ne(1)
    want = lprobs.argmax(-1)[mask].eq(target[mask]).sum()
    got = linear_label_smoothed_nll_loss(h, w, b, target, 0.1, 1, budget_mb=budget(rows, 30),
                                         accuracy=True)[2]
    assert got.dtype == torch.long and got == want >= 13


def test_padding_chunks_give_nothing():
    """Chunks of 4 rows, two of them all padding, and a batch that is all padding."""
    h, w, b, target = _inputs(20, 50, 6)
    target[4:12] = 1
    want = _fairseqs(h, w, b, target, 0.1)
    got = linear_label_smoothed_nll_loss(h, w, b, target, 0.1, 1, budget_mb=budget(4, 50))
    for x, y in zip(got[:2], want, strict=True):
        assert _relative(x, y) < RTOL
    grads = torch.autograd.grad(got[0], (h, w, b))
    for x, y in zip(grads, torch.autograd.grad(want[0], (h, w, b)), strict=True):
        assert _relative(x, y) < RTOL
    assert grads[0][4:12].abs().max() == 0  # padding rows: no gradient
    loss, nll, _ = linear_label_smoothed_nll_loss(h, w, b, torch.ones_like(target), 0.1, 1,
                                                  budget_mb=budget(4, 50))
    assert loss == nll == 0
    assert all(g.abs().max() == 0 for g in torch.autograd.grad(loss, (h, w, b)))


def test_gradients_flow_on_to_the_parameters_of_w_out():
    """W_out = unit_rows(W), b = −½‖w‖² + b₂: the parameters' gradients through autograd."""
    h, weight, b2, target = _inputs(30, 40, 8)

    def affine():
        return scoring.unit_rows(weight), -0.5 * scoring.squared_norms(weight) + b2

    want = _fairseqs(h, *affine(), target, 0.1)[0]
    got = linear_label_smoothed_nll_loss(h, *affine(), target, 0.1, 1, budget_mb=budget(9, 40))
    for x, y in zip(torch.autograd.grad(got[0], (h, weight, b2)),
                    torch.autograd.grad(want, (h, weight, b2)), strict=True):
        assert _relative(x, y) < RTOL


def test_a_second_backward_is_refused():
    h, w, b, target = _inputs(10, 20, 4)
    loss = linear_label_smoothed_nll_loss(h, w, b, target, 0.1, 1)[0]
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="one backward pass"):
        loss.backward()


def test_without_autograd_no_gradient_is_kept():
    h, w, b, target = _inputs(10, 20, 4)
    with torch.no_grad():
        loss, nll, _ = linear_label_smoothed_nll_loss(h, w, b, target, 0.1, 1)
    assert loss.grad_fn is None and _relative(loss, _fairseqs(h, w, b, target, 0.1)[0]) < RTOL


# --- every output layer and tying mode through the criterions --------------------------------


@pytest.mark.parametrize("flags", [[], ALL_FLAGS], ids=["plain", "projection-bias-prefix-sent"])
@pytest.mark.parametrize("tying", ["none", "decoder", "three_way"])
@pytest.mark.parametrize("output_layer", output_layers.names())
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
@pytest.mark.parametrize("output_layer", output_layers.names())
def test_language_model_same_loss_and_gradients(lm_bin, output_layer, flags):
    model, criterion, sample = _setup(lm_bin, "transformer_lm_tied", *LM, "--criterion",
                                      "cross_entropy_tying", "--output-layer", output_layer,
                                      *flags, model_flags=TINY_LM)
    assert_same_loss_and_gradients(model, criterion, sample)


def test_cross_entropy_tying_is_fairseqs_cross_entropy(lm_bin):
    """With --no-chunked-loss it is stock cross_entropy, log for log."""
    model, criterion, sample = _setup(lm_bin, "transformer_lm_tied", *LM, "--criterion",
                                      "cross_entropy_tying", "--no-chunked-loss",
                                      model_flags=TINY_LM)
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
        criterion.chunked_loss = False
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
    """Half inputs: the scores rounded to half (as fairseq's are), log Z, the losses and their
    sum in fp32; chunks of 100 rows."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(4096, 16, generator=g).to(dtype).requires_grad_()
    w = torch.randn(64, 16, generator=g).to(dtype).requires_grad_()
    b = torch.randn(64, generator=g).to(dtype).requires_grad_()
    target = torch.randint(0, 64, (4096,), generator=g)
    target[::9] = 1
    lprobs = F.log_softmax(F.linear(h.double(), w.double(), b.double()), dim=-1)
    exact = label_smoothed_nll_loss(lprobs, target, 0.1, ignore_index=1)[0]
    got = linear_label_smoothed_nll_loss(h, w, b, target, 0.1, ignore_index=1,
                                         budget_mb=budget(100, 64, dtype))[0]
    assert got.dtype == torch.float32
    loss_bound, grad_bound = HALF_BOUNDS[dtype]
    assert _relative(got, exact) < loss_bound
    for x, y in zip(torch.autograd.grad(got, (h, w, b)), torch.autograd.grad(exact, (h, w, b)),
                    strict=True):
        assert x.dtype == dtype and _relative(x, y) < grad_bound


def test_fp16_gradients_smaller_than_fp16_survive_until_the_loss_scale():
    """A confident fp16 model: p_j ≈ e⁻²¹ off the target, so ∂loss/∂h ≈ 2e-9, which fp16 rounds
    to 0 (its smallest step is 6e-8). Kept in fp32 until the backward multiplies them by
    fairseq's loss scale (2¹⁴ here), they arrive as fairseq's fp32 log-softmax of the same
    rounded scores gives them, and as its --fp16 path (scaled before any rounding) does."""
    g = torch.Generator().manual_seed(0)
    vocab, dim, scale = 32, 32, 2.0**14
    w = torch.linalg.qr(torch.randn(vocab, dim, generator=g))[0]  # orthonormal rows
    target = torch.randint(2, vocab, (300,), generator=g)
    h = 21 * w[target] + 0.05 * torch.randn(300, dim, generator=g)  # s_y − s_j ≈ 21
    target[::10] = 1
    h, w = h.half().requires_grad_(), w.half().requires_grad_()
    h32, w32 = h.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    s32 = F.linear(h32, w32)
    s32 = s32 + (F.linear(h, w).float() - s32).detach()  # the fp16-rounded scores
    want = label_smoothed_nll_loss(F.log_softmax(s32, -1), target, 0.0, ignore_index=1)[0]
    want_grads = torch.autograd.grad(want * scale, (h32, w32))
    assert 0 < want_grads[0].abs().max() / scale < 3e-8  # 0 in fp16 before the scale
    fairseq_fp16 = torch.autograd.grad(_fairseqs(h, w, None, target, 0.0)[0] * scale, (h, w))
    got = linear_label_smoothed_nll_loss(h, w, None, target, 0.0, 1,
                                         budget_mb=budget(32, vocab, h.dtype))
    got_grads = torch.autograd.grad(got[0] * scale, (h, w))
    for x, y, z in zip(got_grads, want_grads, fairseq_fp16, strict=True):
        assert x.dtype == torch.float16 and _relative(x, y) < 5e-3 and _relative(z, y) < 5e-3


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


# --- where it is the default -----------------------------------------------------------------


def test_the_flags_choose_and_the_default_follows_the_rule(joined_bin, monkeypatch):
    model, criterion, _ = _setup(joined_bin, "transformer_twwt", *TRANSLATION)
    vocab = len(criterion.task.target_dictionary)
    assert criterion.chunked_loss is None and criterion.chunked_loss_mb == chunked.DEFAULT_MB
    for smallest, want in ((vocab, True), (vocab + 1, False), (None, False)):
        monkeypatch.setitem(chunked.CHUNKED_BY_DEFAULT, "cpu", smallest)
        assert criterion.chunked(model) is want
        assert chunked.chunked_by_default(torch.device("cpu"), vocab) is want
    monkeypatch.setitem(chunked.CHUNKED_BY_DEFAULT, "cpu", 0)
    _, off, _ = _setup(joined_bin, "transformer_twwt", *TRANSLATION, "--no-chunked-loss")
    _, on, _ = _setup(joined_bin, "transformer_twwt", *TRANSLATION, "--chunked-loss",
                      "--chunked-loss-mb", "0.5")
    assert not off.chunked(model) and on.chunked(model) and on.chunked_loss_mb == 0.5


def test_by_default_a_stock_architecture_keeps_fairseqs_loss(joined_bin, monkeypatch):
    monkeypatch.setitem(chunked.CHUNKED_BY_DEFAULT, "cpu", 0)
    model, criterion, sample = _setup(joined_bin, "transformer", "--share-all-embeddings",
                                      *TRANSLATION)
    assert not criterion.chunked(model)
    loss, _, log = criterion(model, sample)
    assert loss > 0 and "nll_loss" in log


@pytest.mark.parametrize(("flags", "message"), [
    (["--chunked-loss", "--no-chunked-loss"], "--chunked-loss and --no-chunked-loss"),
    (["--chunked-loss-mb", "0"], "--chunked-loss-mb 0"),
])
def test_contradictory_or_empty_settings_are_refused_by_name(joined_bin, flags, message):
    with pytest.raises(ValueError, match=message):
        _setup(joined_bin, "transformer_twwt", *TRANSLATION, *flags)
