"""The closed-form gradients of the row scaling and the squared norms (speed-ups) equal
autograd's through the plain formulas, including the all-zero padding row and leading
dimensions."""

from __future__ import annotations

import pytest
import torch

from fairseq_tying.core import scoring


def _reference(weight: torch.Tensor, power: int) -> torch.Tensor:
    norms = weight.float().norm(dim=-1, keepdim=True)
    scale = torch.where(norms < scoring.EPS, 0.0, norms.clamp_min(scoring.EPS).pow(-power))
    return (weight.float() * scale).to(weight.dtype)


@pytest.mark.parametrize("shape", [(50, 8), (3, 7, 8)])
@pytest.mark.parametrize("power", [1, 2])
def test_value_and_gradient_match_autograd_through_the_formula(power, shape):
    g = torch.Generator().manual_seed(power)
    base = torch.randn(*shape, generator=g) * torch.rand(*shape[:-1], 1, generator=g) * 3
    base[..., 0, :] = 0  # a padding row
    base[..., 1, :] = 1e-8  # below EPS: scaled by 0 as well
    upstream = torch.randn(*shape, generator=g)
    grads = []
    for fn in (scoring.scaled_rows, _reference):
        w = base.clone().requires_grad_()
        out = fn(w, power)
        (out * upstream).sum().backward()
        grads.append((out.detach(), w.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=1e-5, atol=1e-6)
    assert grads[0][1][..., :2, :].abs().sum() == 0  # rows scaled by 0 get no gradient


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
