"""The fused chunked loss (core/criterions/fused.py), its Triton kernel run by Triton's
interpreter on CPU tensors (``TRITON_INTERPRET=1``, ``FAIRSEQ_TYING_FUSED_LOSS=1``): the loss,
nll, accuracy and gradients of fairseq's criterion and of the eager chunked path, for every
output layer, tying mode and flag, fp32, fp16 and bf16, ε = 0 and 0.1, padding rows and chunks
whose last one is shorter, V not a multiple of 16 (rows padded); half precision without
underflow; autocast; the chunks' floor of rows; the probe of the half products; Triton missing,
a transform t or the z-loss: the eager path."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from fairseq import options, tasks
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

from fairseq_tying.core import output_layers
from fairseq_tying.core.criterions import chunked, fused
from fairseq_tying.core.criterions.chunked import linear_label_smoothed_nll_loss
from tests.helpers import PLUGIN_DIR, TINY_LM, TINY_MODEL, learned_values

# Triton 3.6's interpreter converts a 1-element array to an index as NumPy 1.25 deprecates
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0")
FLOOR = (fused.MIN_ROWS, fused.MIN_ROWS_PER_DIM)  # before the fixture lifts it
RTOL = 1e-5  # relative: the losses of every dtype (from the rounded scores), fp32 gradients
# gradients of half inputs, relative: G is rounded to the half type (2⁻¹¹, 2⁻⁸ of each entry)
HALF_BOUNDS = {torch.float16: 2e-3, torch.bfloat16: 2e-2}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
PAD = 1


@pytest.fixture(autouse=True)
def interpreted(monkeypatch):
    """Every test forces the fused path, its kernel interpreted on the CPU. Triton reads
    TRITON_INTERPRET when it is imported, so it is set before ``fused`` first imports Triton."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv(fused.ENV, "1")
    # the tests cut small batches into chunks of a few rows: the floor of a chunk's rows
    # (fused.min_rows, test_the_chunks_floor) would make each batch one chunk
    monkeypatch.setattr(fused, "MIN_ROWS", 1)
    monkeypatch.setattr(fused, "MIN_ROWS_PER_DIM", 0)
    if not fused.available():
        pytest.skip(f"Triton cannot be imported ({fused.TRITON_ERROR}); the fused loss's kernel "
                    "runs only through it: pip install 'triton>=3.6,<3.7' (the dev extra)")
    return monkeypatch


def budget(rows: int, vocab: int, dtype: torch.dtype) -> float:
    """MiB of scores in ``dtype`` that the fused path cuts into chunks of ``rows`` rows."""
    mb = rows * fused.padded_width(vocab) * dtype.itemsize / 2**20
    assert fused.rows_per_chunk(vocab, dtype, mb, 1) == rows
    return mb


def _relative(got, want) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def _bounds(dtype: torch.dtype) -> tuple[float, float]:
    """(loss, gradient) relative error bounds."""
    return RTOL, HALF_BOUNDS.get(dtype, RTOL)


def _exact(h, w, b, target, epsilon):
    """fairseq's criterion in fp64 on the scores rounded to the inputs' dtype, as a model's
    are (their gradient the exact one's), and its count of the rows whose first highest score
    is the target's."""
    s = F.linear(h.double(), w.double(), None if b is None else b.double())
    rounded = F.linear(h, w, b).detach()
    lprobs = F.log_softmax(s + (rounded.double() - s).detach(), dim=-1)
    loss, nll = label_smoothed_nll_loss(lprobs, target, epsilon, ignore_index=PAD)
    return loss, nll, (rounded.argmax(-1).eq(target) & target.ne(PAD)).sum()


def _both(monkeypatch, loss_fn):
    """``loss_fn()`` with the fused path, then with the eager one."""
    got = loss_fn()
    monkeypatch.setenv(fused.ENV, "0")
    want = loss_fn()
    monkeypatch.setenv(fused.ENV, "1")
    return got, want


def _inputs(n: int, vocab: int, dim: int, dtype: torch.dtype, with_bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, dim, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(vocab, dim, generator=g) / 2).to(dtype).requires_grad_()
    b = torch.randn(vocab, generator=g).to(dtype).requires_grad_() if with_bias else None
    target = torch.randint(0, vocab, (n,), generator=g)
    target[::7] = PAD
    with torch.no_grad():
        target[3::5] = (h @ w.T).argmax(-1)[3::5]  # some rows predict their target
    return h, w, b, target


# --- the formula ---------------------------------------------------------------------------


@pytest.mark.parametrize(("vocab", "with_bias"), [(1000, False), (4999, True)])
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_loss_accuracy_and_gradients_equal_fairseqs_and_the_eager_path(
        interpreted, dtype, epsilon, vocab, with_bias):
    """24 rows in chunks of 10 (the last one shorter; V = 4999 takes three blocks of the kernel,
    the last one part masked), every 7th row padding."""
    h, w, b, target = _inputs(24, vocab, 16, dtype, with_bias)
    inputs = [t for t in (h, w, b) if t is not None]

    def loss():
        out = linear_label_smoothed_nll_loss(h, w, b, target, epsilon, PAD, accuracy=True,
                                             budget_mb=budget(10, vocab, dtype))
        return (*out, torch.autograd.grad(out[0] * 3.0, inputs))

    (*got, got_grads), (*eager, eager_grads) = _both(interpreted, loss)
    exact = _exact(h, w, b, target, epsilon)
    exact_grads = torch.autograd.grad(exact[0] * 3.0, inputs)
    loss_bound, grad_bound = _bounds(dtype)
    for x, e, y in zip(got[:2], eager[:2], exact[:2], strict=True):
        assert x.dtype == torch.float32 and _relative(x, y) < loss_bound
        assert _relative(x, e) < loss_bound
    assert got[2].dtype == torch.long and got[2] == eager[2] == exact[2] > 0
    for x, e, y in zip(got_grads, eager_grads, exact_grads, strict=True):
        assert x.dtype == dtype and _relative(x, y) < grad_bound
        assert _relative(x, e) < grad_bound


def test_padding_chunks_give_nothing():
    """Chunks of 4 rows, two of them all padding, and a batch that is all padding. Every row
    scores tokens 0 and 7 highest, equally: it predicts 0 (argmax's first index), a third of
    them correctly, and padding rows are not counted."""
    h, w, b, target = _inputs(20, 50, 6, torch.float32, True)
    target[::3] = 0
    target[1::3] = 7
    target[4:12] = PAD
    with torch.no_grad():
        b[0] = b[7] = 100.0
        w[7] = w[0]
    got = linear_label_smoothed_nll_loss(h, w, b, target, 0.1, PAD, accuracy=True,
                                         budget_mb=budget(4, 50, torch.float32))
    want = _exact(h, w, b, target, 0.1)
    assert _relative(got[0], want[0]) < RTOL and _relative(got[1], want[1]) < RTOL
    assert got[2] == want[2] == target.eq(0).sum() == 5
    grads = torch.autograd.grad(got[0], (h, w, b))
    for x, y in zip(grads, torch.autograd.grad(want[0], (h, w, b)), strict=True):
        assert _relative(x, y) < RTOL
    assert grads[0][4:12].abs().max() == 0
    loss, nll, _ = linear_label_smoothed_nll_loss(h, w, b, torch.full_like(target, PAD), 0.1,
                                                  PAD, budget_mb=budget(4, 50, torch.float32))
    assert loss == nll == 0
    assert all(g.abs().max() == 0 for g in torch.autograd.grad(loss, (h, w, b)))


def test_without_autograd_no_gradient_is_written():
    h, w, b, target = _inputs(30, 200, 8, torch.float16, True)
    with torch.no_grad():
        loss, nll, _ = linear_label_smoothed_nll_loss(h, w, b, target, 0.1, PAD)
    assert loss.grad_fn is None
    assert _relative(loss, _exact(h, w, b, target, 0.1)[0]) < RTOL


def test_fp16_gradients_smaller_than_fp16_survive_until_the_loss_scale():
    """tests/test_core_chunked_loss.py's case on the fused path: p_j ≈ e⁻²¹ off the target, so
    ∂loss/∂h ≈ 2e-9, which fp16 rounds to 0; G is written pre-scaled by 2¹⁵ over the fp16
    scores and summed in fp32, so the gradients arrive as fairseq's fp32 log-softmax of the same
    rounded scores gives them."""
    g = torch.Generator().manual_seed(0)
    vocab, dim, scale = 32, 32, 2.0**14
    w = torch.linalg.qr(torch.randn(vocab, dim, generator=g))[0]  # orthonormal rows
    target = torch.randint(2, vocab, (100,), generator=g)
    h = 21 * w[target] + 0.05 * torch.randn(100, dim, generator=g)  # s_y − s_j ≈ 21
    target[::10] = PAD
    h, w = h.half().requires_grad_(), w.half().requires_grad_()
    h32, w32 = h.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    s32 = F.linear(h32, w32)
    s32 = s32 + (F.linear(h, w).float() - s32).detach()  # the fp16-rounded scores
    want = label_smoothed_nll_loss(F.log_softmax(s32, -1), target, 0.0, ignore_index=PAD)[0]
    want_grads = torch.autograd.grad(want * scale, (h32, w32))
    assert 0 < want_grads[0].abs().max() / scale < 3e-8  # 0 in fp16 before the scale
    got = linear_label_smoothed_nll_loss(h, w, None, target, 0.0, PAD,
                                         budget_mb=budget(32, vocab, h.dtype))
    for x, y in zip(torch.autograd.grad(got[0] * scale, (h, w)), want_grads, strict=True):
        assert x.dtype == torch.float16 and _relative(x, y) < 5e-3


# --- every output layer: the parameters' gradients through (W_out, b, ĥ) --------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("output_layer", list(output_layers.OUTPUT_LAYERS))
def test_every_output_layer_equals_the_eager_path(interpreted, output_layer, dtype):
    """W (a zero padding row), the output bias b₂ and fixnorm's gain g: the gradients of the
    parameters, through each layer's (W_out, b) and ĥ, equal the eager path's."""
    g = torch.Generator().manual_seed(1)
    vocab, dim = 1200, 16
    # row norms 0.5 to 2 times √D's (1/‖w‖² within fp16's range), the padding row zero
    weight = torch.randn(vocab, dim, generator=g) * (0.5 + 1.5 * torch.rand(vocab, 1, generator=g))
    weight[PAD] = 0
    params = [p.to(dtype).requires_grad_() for p in (
        weight, torch.randn(20, dim, generator=g), torch.randn(vocab, generator=g),
        torch.tensor(4.0))]
    target = torch.randint(0, vocab, (20,), generator=g)
    target[::6] = PAD

    def loss():
        weight, h, b2, gain = params
        layer = output_layers.get(output_layer)
        learned = {"gain": gain, "sz": learned_values(vocab, dim)["sz"].to(dtype)}
        w_out, bias = layer.output_matrix_and_bias(weight, b2, **learned)
        hidden = layer.scored_hidden(h, **learned)
        out = linear_label_smoothed_nll_loss(hidden, w_out, bias, target, 0.1, PAD,
                                             budget_mb=budget(8, vocab, dtype), accuracy=True)
        grads = torch.autograd.grad(out[0], params, allow_unused=True)
        return (*out, grads, (hidden.detach(), w_out.detach(), bias.detach()))

    (*got, got_grads, affine), (*eager, eager_grads, _) = _both(interpreted, loss)
    exact = _exact(*affine, target, 0.1)
    loss_bound, grad_bound = _bounds(dtype)
    assert _relative(got[0], exact[0]) < loss_bound and _relative(got[0], eager[0]) < loss_bound
    assert _relative(got[1], eager[1]) < loss_bound and got[2] == eager[2] == exact[2]
    assert (eager_grads[3] is None) == (output_layer != "fixnorm")  # only fixnorm has a g
    for x, y in zip(got_grads, eager_grads, strict=True):
        assert (x is None) == (y is None)
        if y is not None:
            assert x.dtype == dtype and _relative(x, y) < grad_bound


# --- through fairseq's criterions and models -------------------------------------------------

TRANSLATION = ["--criterion", "label_smoothed_cross_entropy_pr", "--label-smoothing", "0.1"]
ALL_FLAGS = ["--tied-projection", "--output-bias", "--ignore-prefix-size", "1", "--sentence-avg",
             "--report-accuracy"]
LM = ["--task", "language_modeling", "--sample-break-mode", "eos", "--criterion",
      "cross_entropy_tying"]


def _setup(data, arch: str, *flags: str, model_flags=TINY_MODEL, dtype=torch.float32):
    import fairseq_tying  # noqa: F401  (registers the plugin with fairseq: --user-dir does too)

    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(data), "--user-dir", PLUGIN_DIR, "--arch", arch, *model_flags, *flags])
    task = tasks.setup_task(args)
    task.load_dataset("train")
    model, criterion = task.build_model(args).to(dtype), task.build_criterion(args)
    if model.decoder.scorer.bias is not None:
        with torch.no_grad():  # b₂ starts at zero; make it count
            model.decoder.scorer.bias.normal_()
    data = task.dataset("train")
    sample = data.collater([data[i] for i in range(6)])  # a real batch, padded
    assert sample["target"].eq(task.target_dictionary.pad()).any()
    return model.train(), criterion, sample


def _run(model, criterion, sample, chunked_loss: bool):
    """(loss, sample size, logging output, every parameter's gradient) of one step."""
    criterion.chunked_loss = chunked_loss
    vocab = len(criterion.task.target_dictionary)
    criterion.chunked_loss_mb = budget(7, vocab, next(model.parameters()).dtype)
    model.zero_grad()
    torch.manual_seed(0)  # the same dropout masks
    loss, sample_size, log = criterion(model, sample)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), sample_size, log, grads


def assert_same_as_fairseqs(model, criterion, sample, loss_bound=RTOL, grad_bound=RTOL):
    """The fused loss against fairseq's own criterion on the full scores."""
    want, want_size, want_log, want_grads = _run(model, criterion, sample, chunked_loss=False)
    got, got_size, got_log, got_grads = _run(model, criterion, sample, chunked_loss=True)
    assert got.dtype == torch.float32 and got_size == want_size and set(got_log) == set(want_log)
    assert _relative(got, want) < loss_bound
    for key in ("nll_loss", "n_correct", "total"):
        if key in want_log:
            assert abs(got_log[key] - want_log[key]) <= loss_bound * abs(want_log[key]), key
    assert set(got_grads) == set(want_grads)
    for name, g in want_grads.items():
        if not name.endswith("k_proj.bias"):  # attention's softmax ignores it: noise
            assert got_grads[name].dtype == g.dtype and _relative(got_grads[name], g) < grad_bound


@pytest.mark.parametrize("output_layer", list(output_layers.OUTPUT_LAYERS))
def test_every_output_layer_with_every_flag(joined_bin, output_layer):
    model, criterion, sample = _setup(joined_bin, "transformer_twwt", "--tying", "three_way",
                                      "--output-layer", output_layer, *TRANSLATION, *ALL_FLAGS)
    assert criterion.ignore_prefix_size == 1 and criterion.sentence_avg
    assert_same_as_fairseqs(model, criterion, sample)


@pytest.mark.parametrize("tying", ["none", "decoder"])
def test_the_other_tying_modes(joined_bin, tying):
    model, criterion, sample = _setup(joined_bin, "transformer_twwt", "--tying", tying,
                                      "--output-layer", "sqnorm", *TRANSLATION)
    assert_same_as_fairseqs(model, criterion, sample)


@pytest.mark.parametrize("output_layer", ["cosine", "fixnorm"])
def test_language_model(lm_bin, output_layer):
    model, criterion, sample = _setup(lm_bin, "transformer_lm_tied", *LM, "--output-layer",
                                      output_layer, "--tied-embed-dim", "8", "--tied-projection",
                                      "--output-bias", model_flags=TINY_LM)
    assert_same_as_fairseqs(model, criterion, sample)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("output_layer", ["l2norm", "distance"])
def test_half_model(joined_bin, output_layer, dtype):
    """A half model, as fairseq's trainer makes it under --fp16: loss and gradients close to
    fairseq's (its scores rounded alike, its log-softmax in fp32)."""
    model, criterion, sample = _setup(joined_bin, "transformer_twwt", "--output-layer",
                                      output_layer, *TRANSLATION, "--output-bias", dtype=dtype)
    assert_same_as_fairseqs(model, criterion, sample, RTOL, 2 * HALF_BOUNDS[dtype])


# --- choosing the path -----------------------------------------------------------------------


def test_without_triton_the_eager_path_runs_after_one_warning(interpreted):
    h, w, b, target = _inputs(20, 40, 4, torch.float32, True)
    want = _exact(h, w, b, target, 0.1)[0]
    interpreted.setattr(fused, "triton", None)  # as after a failed import
    interpreted.setattr(fused, "TRITON_ERROR", "ModuleNotFoundError: No module named 'triton'")
    interpreted.setattr(fused, "_warned", [])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            got = linear_label_smoothed_nll_loss(h, w, b, target, 0.1, PAD)[0]
            assert _relative(got, want) < RTOL
    assert [str(w.message).count("\n") for w in caught] == [0]
    assert "eager path: Triton cannot be imported" in str(caught[0].message)


def test_the_switch(interpreted):
    cpu = torch.empty(3, 4)
    assert fused.wanted(cpu)
    interpreted.setenv(fused.ENV, "0")
    assert not fused.wanted(cpu)
    interpreted.delenv(fused.ENV)
    assert not fused.wanted(cpu)  # unset: CUDA tensors only
    interpreted.setenv(fused.ENV, "1")
    interpreted.delenv("TRITON_INTERPRET")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):  # chunked.py's call site
        linear_label_smoothed_nll_loss(cpu, torch.ones(5, 4), None, torch.zeros(3).long(), 0, 1)
    assert fused.HALF_SCALE == chunked.HALF_SCALE


@pytest.mark.parametrize(("output_layer", "z_loss", "kernel"), [
    ("dot", 0.0, True), ("ngpt", 0.0, True),  # ngpt: affine in ĥ = h/‖h‖, no t
    ("softcap", 0.0, False), ("dot", 0.01, False), ("ngpt", 0.01, False), ("softcap", 0.01, False),
])
def test_a_transform_or_the_z_loss_takes_the_eager_path(interpreted, joined_bin, output_layer,
                                                        z_loss, kernel):
    """The kernel computes affine scores without z-loss: with FAIRSEQ_TYING_FUSED_LOSS=1, a
    layer with a transform t (softcap) and --z-loss > 0 are declined, and the criterion's loss
    is then fairseq's (a cap of 0.5: t far from the identity, which the kernel would skip)."""
    model, criterion, sample = _setup(joined_bin, "transformer_twwt", "--output-layer",
                                      output_layer, "--softcap", "0.5", "--z-loss", str(z_loss),
                                      *TRANSLATION)
    transform = criterion.transform(model.decoder.scorer)
    assert chunked.fused_computes(transform, criterion.z_loss) == kernel
    # No GPU can exist here: Triton's interpreter (TRITON_INTERPRET=1) makes fused.wanted take
    # CPU tensors as it takes CUDA ones, so what declines is the layer or the z-loss alone.
    features = torch.empty(3, 16)
    assert fused.wanted(features)
    assert chunked._fused(features, transform, criterion.z_loss) == kernel
    assert_same_as_fairseqs(model, criterion, sample)


def test_chunk_rows_follow_a_budget_of_half_scores():
    """The fused path keeps only the scores, in the model's dtype: 64 MiB are 1024 rows of fp16
    scores at V = 32k, the eager path's 341 (fp32 scores and the half G); a row holds V rounded
    up to a multiple of 16."""
    assert fused.rows_per_chunk(32768, torch.float16, 64, 512) == 1024
    assert fused.rows_per_chunk(32768, torch.float32, 64, 512) == 512
    assert chunked.rows_per_chunk(32768, torch.float16, 64) == 341
    assert fused.rows_per_chunk(10**6, torch.bfloat16, 0.5, 512) == 1
    assert [fused.padded_width(v) for v in (16, 17, 32000, 32003)] == [16, 32, 32000, 32016]
    assert fused.rows_per_chunk(32003, torch.float16, 1, 8) == 2**20 // (32016 * 2)


def test_the_chunks_floor(interpreted):
    """At least max(1024, 2·D) rows, whatever the budget: at V = 250k in fp16 64 MiB of scores
    are 134 rows, and chunks of 134 rows would read W_out and ∂/∂W_out again every 134 rows. A
    budget above the floor still sets the rows."""
    interpreted.setattr(fused, "MIN_ROWS", FLOOR[0])
    interpreted.setattr(fused, "MIN_ROWS_PER_DIM", FLOOR[1])
    assert 2**26 // (fused.padded_width(250000) * 2) == 134
    assert fused.rows_per_chunk(250000, torch.float16, 64, 512) == 1024
    assert fused.rows_per_chunk(250000, torch.float16, 64, 1024) == 2048
    assert fused.rows_per_chunk(32000, torch.float16, 256, 512) == 2**28 // 64000 == 4194
    assert fused.rows_per_chunk(32000, torch.float32, 0.01, 4) == 1024


# --- V not a multiple of 16: the rows padded ------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_a_vocabulary_not_a_multiple_of_16(interpreted, dtype):
    """V = 32,003 (16 blocks of the kernel, the last one part padding): loss, nll, accuracy and
    gradients equal fairseq's and the eager path's, in chunks of 5 rows (the last one shorter)."""
    vocab = 32003
    h, w, b, target = _inputs(12, vocab, 8, dtype, True)
    inputs = (h, w, b)

    def loss():
        out = linear_label_smoothed_nll_loss(h, w, b, target, 0.1, PAD, accuracy=True,
                                             budget_mb=budget(5, vocab, dtype))
        return (*out, torch.autograd.grad(out[0], inputs))

    (*got, got_grads), (*eager, eager_grads) = _both(interpreted, loss)
    exact = _exact(h, w, b, target, 0.1)
    exact_grads = torch.autograd.grad(exact[0], inputs)
    loss_bound, grad_bound = _bounds(dtype)
    assert _relative(got[0], exact[0]) < loss_bound and _relative(got[1], exact[1]) < loss_bound
    assert got[2] == eager[2] == exact[2] > 0
    for x, e, y in zip(got_grads, eager_grads, exact_grads, strict=True):
        assert _relative(x, y) < grad_bound and _relative(x, e) < grad_bound


def test_the_kernel_ignores_and_zeroes_the_padding_columns(interpreted):
    """The kernel on rows of V = 37 scores padded to 48 entries of NaN: each row's loss, nll and
    count from its 37 scores, G over them, 0 in the 11 padding entries."""
    g = torch.Generator().manual_seed(3)
    vocab, rows = 37, 6
    scores = torch.randn(rows, vocab, generator=g) * 3
    target = torch.randint(0, vocab, (rows,), generator=g)
    target[2] = PAD
    target[4] = scores[4].argmax()
    buffer = torch.full((rows, fused.padded_width(vocab)), float("nan"))
    s = buffer[:, :vocab]
    s.copy_(scores)
    out = [torch.empty(rows) for _ in range(2)] + [torch.empty(rows, dtype=torch.int32)]
    fused._launch(s, target, *out, 0.1, PAD, 1.0, True)
    lprobs = F.log_softmax(scores.double(), -1)
    want_loss, want_nll = label_smoothed_nll_loss(lprobs, target, 0.1, PAD, reduce=False)
    torch.testing.assert_close(out[0].double(), want_loss.squeeze(-1), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out[1].double(), want_nll.squeeze(-1), rtol=1e-6, atol=1e-6)
    assert out[2].tolist() == [int(i == 4) for i in range(rows)]
    on_target, eps_i = 0.9 - 0.1 / 36, 0.1 / 36
    want_g = lprobs.exp() - eps_i - on_target * F.one_hot(target, vocab)
    want_g[2] = 0
    torch.testing.assert_close(buffer[:, :vocab].double(), want_g, rtol=1e-5, atol=1e-6)
    assert buffer[:, vocab:].eq(0).all()


# --- the half products: probed once ---------------------------------------------------------


def test_the_probe_chooses_the_first_right_product_and_keeps_it(interpreted):
    """This CPU's torch has neither fp32-output half product (addmm.dtype_out, mm.dtype): the
    probe records both refusals and takes fp32 copies; a product that raises or computes a wrong
    result is refused too. The choice is made once: a recorded path that fails later raises its
    error (an out-of-memory would), no other path is tried."""
    cpu = torch.device("cpu")
    found = fused._probe(cpu, torch.float16)
    assert found["path"] == "fp32 operands"
    assert [r.split(": ")[:2] for r in found["refused"]] == [
        ["addmm out_dtype", "NotImplementedError"], ["mm out_dtype, added", "NotImplementedError"]]

    def raises(*_):
        raise RuntimeError("no such operator\nsecond line")

    interpreted.setattr(fused, "PRODUCTS", {"zeros": lambda out, *_: out.zero_(),
                                            "raises": raises, **fused.PRODUCTS})
    found = fused._probe(cpu, torch.bfloat16)
    assert found["path"] == "fp32 operands"
    assert found["refused"][:2] == ["zeros: a wrong result",
                                    "raises: RuntimeError: no such operator"]
    interpreted.setattr(fused, "PRODUCTS", {"zeros": lambda out, *_: out.zero_()})
    with pytest.raises(RuntimeError, match="no half product with fp32 sums is right on cpu"):
        fused._probe(cpu, torch.float16)


def test_the_probed_path_is_recorded_and_taken(interpreted):
    interpreted.setattr(fused, "_probed", {})
    h, w, b, target = _inputs(20, 40, 4, torch.float16, True)
    linear_label_smoothed_nll_loss(h, w, b, target, 0.1, PAD)[0].backward()
    assert fused.probes() == {"cpu float16": fused._probe(torch.device("cpu"), torch.float16)}
    assert fused.product_path(torch.device("cpu"), torch.float16) == "fp32 operands"
    # the mixed product recorded for this CPU, which lacks it: its error, not another path
    interpreted.setitem(fused._probed, ("cpu", torch.float16), {"path": "addmm out_dtype"})
    with pytest.raises(NotImplementedError, match="addmm.dtype_out"):
        linear_label_smoothed_nll_loss(h, w, b, target, 0.1, PAD)[0].backward()


# --- autocast ---------------------------------------------------------------------------------


def test_autocast_products_run_in_its_dtype(interpreted):
    """fp32 parameters under bf16 autocast: the scores are rounded to bf16 as F.linear's under
    autocast are (the loss equals fairseq's on those scores, not on the fp32 ones), the
    gradients come back in fp32, close to the eager path's."""
    h, w, b, target = _inputs(24, 300, 16, torch.float32, True)

    def loss():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = linear_label_smoothed_nll_loss(h, w, b, target, 0.1, PAD,
                                                 budget_mb=budget(10, 300, torch.bfloat16))
        return out[0], torch.autograd.grad(out[0], (h, w, b))

    (got, got_grads), (eager, eager_grads) = _both(interpreted, loss)
    rounded = _exact(h.bfloat16(), w.bfloat16(), b.bfloat16(), target, 0.1)[0]
    wide = _exact(h, w, b, target, 0.1)[0]
    assert _relative(got, rounded) < RTOL < _relative(got, wide)
    assert _relative(got, eager) < RTOL
    for x, e in zip(got_grads, eager_grads, strict=True):
        assert x.dtype == torch.float32 and _relative(x, e) < HALF_BOUNDS[torch.bfloat16]
