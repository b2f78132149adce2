"""A toy output layer, s_i = α·h·w_i with a fixed α (a scaled dot product), registered from outside
the package: what a new layer takes is this one class. The CLI processes of the tests load it
through ``FAIRSEQ_TYING_LAYERS=tests/toy_layer.py``, the test process through
``tests.helpers.toy_layer_registered``."""

from __future__ import annotations

from torch import Tensor

from fairseq_tying.core.output_layers import Affine, OutputLayer, register_output_layer

ALPHA = 0.5


@register_output_layer("scaled_dot")
class ScaledDot(OutputLayer):
    """s_i = α·h·w_i with α = ``ALPHA`` fixed: W_out = α·W, no bias, raw input lookups."""

    export_refusal = "is a test layer (α·h·w_i) that no export writes into {target} decoder"
    citation = "tests/toy_layer.py"

    def affine(self, weight: Tensor) -> Affine:
        return ALPHA * weight, None
