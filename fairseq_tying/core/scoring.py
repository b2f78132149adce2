"""The row arithmetic the output layers are written in (``output_layers.py``): row norms,
rows scaled by a power of their norm and squared norms, with closed-form gradients.

Norms are computed in fp32, so ‖w‖² cannot overflow in half precision. A row with
‖w‖ < ``EPS`` (fairseq's all-zero padding row) is scaled by 0, not by 1/EPS: it scores 0
and gets no gradient, instead of NaN or a huge one.
"""

from __future__ import annotations

import torch
from torch import Tensor

EPS = 1e-6
Affine = tuple[Tensor, Tensor | None]  # (W_out, b): the scores are ĥ·W_outᵀ + b


def _wide(x: Tensor) -> Tensor:
    """``x`` in fp32 at least: half precision widened, fp64 kept."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def row_norms(weight: Tensor) -> Tensor:
    """‖w_i‖ for every row (last dimension), in fp32 (fp64 for fp64 rows)."""
    return torch.linalg.vector_norm(_wide(weight), dim=-1)


def _inverse(norms: Tensor, power: int) -> Tensor:
    """1/‖w_i‖^power from the row norms, and 0 for rows with ‖w_i‖ < EPS."""
    return torch.where(norms < EPS, 0.0, norms.clamp_min(EPS).pow(-power))


def unit_rows(weight: Tensor) -> Tensor:
    """w_i / ‖w_i‖ along the last dimension, in the input's dtype."""
    return scaled_rows(weight, 1)


def scaled_rows(weight: Tensor, power: int) -> Tensor:
    """w_i / ‖w_i‖^power along the last dimension (0 where ‖w_i‖ < EPS), in the input's dtype."""
    return _ScaledRows.apply(weight, power)


class _ScaledRows(torch.autograd.Function):
    """u_i = s_i·w_i with s_i = 1/‖w_i‖^p, and its gradient in closed form,

        ∂L/∂w_i = s_i·g_i − p·s_i·(g_i·w_i)/‖w_i‖² · w_i        (g_i = ∂L/∂u_i),

    which costs three passes over the V×D matrix instead of autograd's six (through norm,
    where, pow and mul). Rows with s_i = 0 get no gradient."""

    @staticmethod
    def forward(ctx, weight: Tensor, power: int) -> Tensor:
        norms = row_norms(weight)
        scale = _inverse(norms, power)
        ctx.save_for_backward(weight, norms, scale)
        ctx.power = power
        return (_wide(weight) * scale.unsqueeze(-1)).to(weight.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        weight, norms, scale = ctx.saved_tensors
        w, g = _wide(weight), _wide(grad)
        coef = torch.einsum("...d,...d->...", g, w) * scale * ctx.power
        coef = coef / norms.clamp_min(EPS).square()
        grad_w = (g * scale.unsqueeze(-1)).addcmul_(w, coef.unsqueeze(-1), value=-1)
        return grad_w.to(weight.dtype), None


def squared_norms(weight: Tensor) -> Tensor:
    """‖w_i‖² for every row, in fp32; its gradient 2·g_i·w_i takes one pass over the matrix."""
    return _SquaredNorms.apply(weight)


class _SquaredNorms(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight: Tensor) -> Tensor:
        ctx.save_for_backward(weight)
        return row_norms(weight).square()

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (weight,) = ctx.saved_tensors
        return (_wide(weight) * (2 * grad).unsqueeze(-1)).to(weight.dtype)


def add_output_bias(bias: Tensor | None, output_bias: Tensor | None) -> Tensor | None:
    """b + b₂, where either may be absent."""
    if output_bias is None:
        return bias
    return output_bias if bias is None else bias + output_bias.to(bias.dtype)

