"""The output layers: scores over a tied embedding matrix W (row w_i per token).

With h the decoder output, the score of token i is

    dot       s_i = h·w_i
    l2norm    s_i = h·w_i / ‖w_i‖        and every input lookup uses w_i / ‖w_i‖ too
    cosine    s_i = h·w_i / ‖w_i‖        input lookups use the raw w_i
    sqnorm    s_i = h·w_i / ‖w_i‖²
    distance  s_i = h·w_i − ½‖w_i‖²      (= −½‖h − w_i‖² up to a term constant in i)
    fixnorm   s_i = g·(h/‖h‖)·(w_i/‖w_i‖) = g·cos(h, w_i), and input lookups use w_i / ‖w_i‖

The first five are the normalization paper's (Liu et al. 2020); ``fixnorm`` is FixNorm with
ScaleNorm at the output (Nguyen & Chiang 2018; Nguyen & Salazar 2019), g one learned scalar.

Each output layer is an affine map ``s = ĥ·W_outᵀ + b`` of the scored vector ĥ: ĥ = h, except
under ``fixnorm`` where ĥ = g·h/‖h‖ (``scored_hidden``) and W_out holds l2norm's unit rows.
``output_matrix_and_bias`` returns (W_out, b), so scoring is one ``F.linear`` whatever the output
layer. A learned per-token
output bias b₂ (``--output-bias``; s = V·P·h + b₂ in Press & Wolf's notation) is added to b.
Norms are computed in fp32, so ‖w‖² cannot overflow in half precision. A row with
‖w‖ < ``EPS`` (fairseq's all-zero padding row) is scaled by 0, not by 1/EPS: it scores 0
and gets no gradient, instead of NaN or a huge one.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

EPS = 1e-6
PAPER_LAYERS = ("dot", "l2norm", "sqnorm", "distance", "cosine")  # Liu et al. (2020)
OUTPUT_LAYERS = (*PAPER_LAYERS, "fixnorm")
NORMALIZED_INPUT_LAYERS = frozenset({"l2norm", "fixnorm"})
NORMALIZED_HIDDEN_LAYERS = frozenset({"fixnorm"})  # these score ĥ = g·h/‖h‖, not h


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


Affine = tuple[Tensor, Tensor | None]

_AFFINE_MAPS: dict[str, Callable[[Tensor], Affine]] = {
    "dot": lambda w: (w, None),
    "l2norm": lambda w: (unit_rows(w), None),
    "cosine": lambda w: (unit_rows(w), None),
    "sqnorm": lambda w: (scaled_rows(w, power=2), None),
    "distance": lambda w: (w, (-0.5 * squared_norms(w)).to(w.dtype)),
}


def matrix_rule(output_layer: str) -> str:
    """The layer whose (W_out, b) ``output_layer`` scores with: fixnorm's is l2norm's unit rows,
    so one cached V×D matrix serves its input lookups and its scores."""
    return "l2norm" if output_layer == "fixnorm" else output_layer


def initial_gain(embed_dim: int) -> float:
    """fixnorm's g at the start: √D, ScaleNorm's initial scale (Nguyen & Salazar 2019). Cosines
    lie in [−1, 1], so g bounds every score gap; √D (11.3 at D = 128) lets the softmax put most
    of its mass on one of thousands of tokens from the first step (log 4000 ≈ 8.3)."""
    return float(embed_dim) ** 0.5


def scored_hidden(output_layer: str, hidden: Tensor, gain: Tensor | float | None = None) -> Tensor:
    """ĥ, the vector the output layer scores: g·h/‖h‖ under ``fixnorm`` (the norm in fp32, 0 for
    ‖h‖ < EPS), h itself under the other layers."""
    if output_layer not in NORMALIZED_HIDDEN_LAYERS:
        return hidden
    if gain is None:
        raise ValueError(f"--output-layer {output_layer} scores g·cos(h, w_i): pass its gain g")
    unit = unit_rows(hidden)
    return unit * (gain.to(unit.dtype) if isinstance(gain, Tensor) else gain)


def output_matrix_and_bias(
    output_layer: str, weight: Tensor, output_bias: Tensor | None = None
) -> Affine:
    """(W_out, b) such that the scores of ``output_layer`` are ``h @ W_out.T + b``; ``output_bias``
    (b₂, one value per token) is added to the layer's own bias."""
    w_out, bias = _AFFINE_MAPS[matrix_rule(output_layer)](weight)
    return w_out, add_output_bias(bias, output_bias)


def add_output_bias(bias: Tensor | None, output_bias: Tensor | None) -> Tensor | None:
    """b + b₂, where either may be absent."""
    if output_bias is None:
        return bias
    return output_bias if bias is None else bias + output_bias.to(bias.dtype)


def scores(
    output_layer: str, hidden: Tensor, weight: Tensor, output_bias: Tensor | None = None,
    gain: Tensor | float | None = None,
) -> Tensor:
    """Scores of every token for decoder outputs ``hidden`` (…, D) under ``output_layer``
    (``gain``: fixnorm's g, unused by the other layers)."""
    w_out, bias = output_matrix_and_bias(output_layer, weight, output_bias)
    return torch.nn.functional.linear(scored_hidden(output_layer, hidden, gain), w_out, bias)
