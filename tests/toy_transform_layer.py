"""A toy non-affine output layer, s_i = softplus(h·w_i) = log(1 + exp(h·w_i)), registered from
outside the package: an affine map (``dot``'s) followed by an element-wise transform t with its
derivative t′(a) = sigmoid(a), the one class a new layer of this kind takes. The CLI processes
of the tests load it through ``FAIRSEQ_TYING_LAYERS=tests/toy_transform_layer.py``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from fairseq_tying.core.output_layers import Affine, OutputLayer, register_output_layer


@register_output_layer("softplus_dot")
class SoftplusDot(OutputLayer):
    """s_i = softplus(h·w_i): W_out = W, no bias, t = softplus, t′ = sigmoid."""

    citation = "tests/toy_transform_layer.py"

    def affine(self, weight: Tensor, **_: Tensor | float | None) -> Affine:
        return weight, None

    def transform(self, scores: Tensor, **_: float) -> Tensor:
        return F.softplus(scores)

    def derivative(self, scores: Tensor, **_: float) -> Tensor:
        return torch.sigmoid(scores)
