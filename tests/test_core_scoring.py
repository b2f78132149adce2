"""Each output layer against an independent computation of its formula, the closed-form
gradients of scoring.py's row scaling and squared norms against autograd's, and the
normalization paper's properties (identity, normality, unbiasedness)."""

from __future__ import annotations

import pytest
import torch

from fairseq_tying.core import output_layers, scoring
from tests.helpers import GAIN, learned_values, reference_scores


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("output_layer", output_layers.names())
def test_scores_match_formula(output_layer, dtype, tol):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(50, 8, generator=g) * torch.rand(50, 1, generator=g) * 3
    h = torch.randn(6, 8, generator=g)
    learned = learned_values(50, 8)
    got = output_layers.scores(output_layer, h.to(dtype), w.to(dtype), **learned)
    assert got.dtype == dtype
    want = reference_scores(output_layer, h.to(dtype), w.to(dtype), **learned)
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * want.abs().max().item())


@pytest.mark.parametrize("output_layer", output_layers.names())
def test_zero_padding_row_scores_zero_without_nan_or_huge_gradient(output_layer):
    w = torch.randn(10, 4)
    w[1] = 0
    w.requires_grad_(True)
    s = output_layers.scores(output_layer, torch.randn(3, 4), w, **learned_values(10, 4))
    assert torch.isfinite(s).all() and (s[:, 1] == 0).all()
    s.sum().backward()
    assert torch.isfinite(w.grad).all()
    assert w.grad[1].abs().max() < 10  # 1/EPS scaling would give ~1e6 or 1e12 here


def test_norms_in_fp32_keep_half_precision_finite():
    w = torch.randn(20, 16) * 120  # ‖w‖ ≈ 480, ‖w‖² ≈ 2.3e5 > fp16 max (65504)
    h = torch.randn(4, 16) * 100
    for output_layer in ("sqnorm", "l2norm", "cosine", "fixnorm"):  # fixnorm: ‖h‖² ≈ 1.6e5 too
        s = output_layers.scores(output_layer, h.half(), w.half(), gain=GAIN)
        assert torch.isfinite(s).all(), output_layer
        want = reference_scores(output_layer, h.half(), w.half(), GAIN)
        torch.testing.assert_close(s.double(), want, rtol=2e-2, atol=0.5)


def test_unit_rows():
    x = torch.randn(3, 5, 7)
    torch.testing.assert_close(scoring.unit_rows(x).norm(dim=-1), torch.ones(3, 5))


# --- the closed-form gradients of the row scaling and the squared norms ---------------------

def _scaled_reference(weight: torch.Tensor, power: int) -> torch.Tensor:
    """w_i/‖w_i‖^power through autograd's own operations (0 below EPS)."""
    norms = weight.float().norm(dim=-1, keepdim=True)
    scale = torch.where(norms < scoring.EPS, 0.0, norms.clamp_min(scoring.EPS).pow(-power))
    return (weight.float() * scale).to(weight.dtype)


@pytest.mark.parametrize("shape", [(50, 8), (3, 7, 8)])
@pytest.mark.parametrize("power", [1, 2])  # l2norm's and cosine's unit rows, sqnorm's w/‖w‖²
def test_scaled_rows_value_and_gradient_match_autograd_through_the_formula(power, shape):
    g = torch.Generator().manual_seed(power)
    base = torch.randn(*shape, generator=g) * torch.rand(*shape[:-1], 1, generator=g) * 3
    base[..., 0, :] = 0  # a padding row
    base[..., 1, :] = 1e-8  # below EPS: scaled by 0 as well
    upstream = torch.randn(*shape, generator=g)
    grads = []
    for fn in (scoring.scaled_rows, _scaled_reference):
        w = base.clone().requires_grad_()
        out = fn(w, power)
        (out * upstream).sum().backward()
        grads.append((out.detach(), w.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=1e-5, atol=1e-6)
    assert grads[0][1][..., :2, :].abs().sum() == 0  # rows scaled by 0 get no gradient


def test_sqnorm_gradient_matches_autograd_through_its_formula():
    """The sqnorm layer's scores h·w_i/‖w_i‖², differentiated in closed form (scaled_rows,
    power 2), against autograd through the formula, for W and h."""
    g = torch.Generator().manual_seed(3)
    base_w = torch.randn(40, 8, generator=g) * torch.rand(40, 1, generator=g) * 3
    base_h, upstream = torch.randn(5, 8, generator=g), torch.randn(5, 40, generator=g)
    grads = []
    for formula in (lambda h, w: output_layers.scores("sqnorm", h, w),
                    lambda h, w: h @ (w / w.norm(dim=-1, keepdim=True).square()).T):
        w, h = base_w.clone().requires_grad_(), base_h.clone().requires_grad_()
        (formula(h, w) * upstream).sum().backward()
        grads.append((w.grad, h.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=1e-5, atol=1e-6)


def test_squared_norms_gradient_matches_autograd():
    base = torch.randn(30, 8) * 2
    base[0] = 0
    upstream = torch.randn(30)
    grads = []
    for fn in (scoring.squared_norms, lambda w: w.pow(2).sum(-1)):
        w = base.clone().requires_grad_()
        out = fn(w)
        (out * upstream).sum().backward()
        grads.append((out.detach(), w.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    torch.testing.assert_close(grads[0][1], grads[1][1])


def test_half_precision_weight_keeps_its_dtype_and_finite_gradient():
    w = (torch.randn(20, 8) * 300).half().requires_grad_()  # ‖w‖² overflows fp16
    out = scoring.scaled_rows(w, 2)
    out.float().sum().backward()
    assert out.dtype == torch.float16 and w.grad.dtype == torch.float16
    assert torch.isfinite(out).all() and torch.isfinite(w.grad).all()


# --- identity: h = w_k  =>  argmax_i s_i = k -------------------------------------------------

def _varied_rows(seed: int, n: int = 200, d: int = 16) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g) * (0.2 + 3 * torch.rand(n, 1, generator=g))


@pytest.mark.parametrize("output_layer", ["l2norm", "cosine", "distance", "fixnorm"])
def test_identity_holds_for_any_row_norms(output_layer):
    w = _varied_rows(1)
    # l2norm and fixnorm: inputs are normalized too
    h = scoring.unit_rows(w) if output_layers.get(output_layer).unit_inputs else w
    scores = output_layers.scores(output_layer, h, w, gain=GAIN)
    assert torch.equal(scores.argmax(-1), torch.arange(len(w)))


def test_identity_for_sqnorm_holds_on_rows_of_equal_norm_and_can_fail_otherwise():
    """s_i = ‖w_k‖cosθ/‖w_i‖ ≤ 1 = s_k needs ‖w_i‖ ≥ ‖w_k‖cosθ: true for equal norms (the
    regime normalization drives towards), false for a much shorter parallel row."""
    w = scoring.unit_rows(_varied_rows(2)) * 2.5
    assert torch.equal(output_layers.scores("sqnorm", w, w).argmax(-1), torch.arange(len(w)))
    w = torch.tensor([[4.0, 0.0], [1.0, 0.0]])
    assert output_layers.scores("sqnorm", w[:1], w).argmax().item() == 1


def test_identity_can_fail_for_dot():
    w = torch.tensor([[1.0, 0.0], [3.0, 1.0]])  # a longer row wins against h = w_0
    assert output_layers.scores("dot", w[:1], w).argmax().item() == 1
    assert output_layers.scores("l2norm", scoring.unit_rows(w[:1]), w).argmax().item() == 0


# --- normality: h a convex combination of unit rows => every l2norm score ≤ 1 -----------------

def test_normality_of_l2norm():
    g = torch.Generator().manual_seed(3)
    w = _varied_rows(3)
    mix = torch.distributions.Dirichlet(torch.ones(len(w))).sample((64,))
    h = mix @ scoring.unit_rows(w)
    assert output_layers.scores("l2norm", h, w).max() <= 1 + 1e-6
    h_dot = torch.softmax(torch.randn(64, len(w), generator=g) * 5, -1) @ w
    assert output_layers.scores("dot", h_dot, w).max() > 1  # dot has no such bound


# --- unbiasedness: with random unit h, no token wins more often because of its norm ----------

def _argmax_counts(output_layer: str, seed: int = 4, n_rows: int = 20, trials: int = 20000):
    """Rows with norms 0.3 … 3 and fresh random directions each trial; h a random unit vector.
    An unbiased rule picks every row equally often, whatever its norm."""
    g = torch.Generator().manual_seed(seed)
    norms = torch.linspace(0.3, 3.0, n_rows).view(1, n_rows, 1)
    w = scoring.unit_rows(torch.randn(trials, n_rows, 8, generator=g)) * norms
    h = scoring.unit_rows(torch.randn(trials, 1, 8, generator=g))
    w_out, bias = output_layers.output_matrix_and_bias(output_layer, w)
    s = (h * w_out).sum(-1) + (0 if bias is None else bias)
    return torch.bincount(s.argmax(-1), minlength=n_rows).double()


def _chi_square(counts: torch.Tensor) -> float:
    expected = counts.sum() / len(counts)
    return float(((counts - expected) ** 2 / expected).sum())


def test_unbiasedness_of_l2norm():
    # 19 degrees of freedom: the 99.9% quantile of chi-square is 43.8.
    assert _chi_square(_argmax_counts("l2norm")) < 43.8
    counts = _argmax_counts("dot")
    assert _chi_square(counts) > 1000  # dot favours long rows
    assert counts[-5:].sum() > 3 * counts[:5].sum()
