"""The modules that apply a scoring rule: a tied embedding and the decoder's output scorer."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from fairseq_tying import scoring

# Bumped after every optimizer step (torch's global hook): a cached output matrix keyed on it can
# never outlive a weight update, even one written through ``param.data`` (fp16 master copies).
_optimizer_steps = [0]


def _count_step(*_args, **_kwargs) -> None:
    _optimizer_steps[0] += 1


register_optimizer_step_post_hook(_count_step)


class TiedEmbedding(nn.Embedding):
    """fairseq's token embedding (N(0, d^-1/2) init, zero padding row) whose lookups can use
    the row-normalized matrix w_i/‖w_i‖ (the ``l2norm`` rule). fairseq's √d scaling stays
    in the encoder/decoder, applied after the lookup."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int):
        super().__init__(num_embeddings, embedding_dim, padding_idx=padding_idx)
        nn.init.normal_(self.weight, mean=0, std=embedding_dim**-0.5)
        nn.init.constant_(self.weight[padding_idx], 0)
        self.normalize_rows = False

    def forward(self, tokens: Tensor) -> Tensor:
        vectors = super().forward(tokens)
        return scoring.unit_rows(vectors) if self.normalize_rows else vectors


class OutputScorer(nn.Module):
    """Scores h ↦ rule(L·h, W) over the (possibly shared) matrix ``weight``.

    ``projection`` is the optional learned map L from the decoder output (size H) to the
    embedding size D. In eval mode without autograd the rule's (W_out, b) is cached and reused
    across decoding steps; it is dropped on ``train()``, ``load_state_dict`` and whenever the
    weight's version, storage, dtype or the optimizer step count changes.
    """

    def __init__(self, weight: nn.Parameter, rule: str, projection: nn.Linear | None = None):
        super().__init__()
        if rule not in scoring.RULES:
            raise ValueError(f"unknown output layer {rule!r}; choose from {scoring.RULES}")
        self.weight = weight
        self.rule = rule
        self.projection = projection
        self._cache: tuple[tuple, scoring.Affine] | None = None

    def forward(self, features: Tensor) -> Tensor:
        if self.projection is not None:
            features = self.projection(features)
        w_out, bias = self.output_matrix_and_bias()
        return F.linear(features, w_out, bias)

    def output_matrix_and_bias(self) -> scoring.Affine:
        if self.rule == "dot":
            return self.weight, None
        if self.training or torch.is_grad_enabled():
            self._cache = None  # gradients must flow through the normalization
            return scoring.output_matrix_and_bias(self.rule, self.weight)
        w = self.weight
        key = (w.data_ptr(), w._version, w.dtype, w.device, _optimizer_steps[0])
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, scoring.output_matrix_and_bias(self.rule, w))
        return self._cache[1]

    def train(self, mode: bool = True) -> OutputScorer:
        self._cache = None
        return super().train(mode)

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        self._cache = None
        super()._load_from_state_dict(*args, **kwargs)

    def extra_repr(self) -> str:
        return f"rule={self.rule}, vocab={self.weight.shape[0]}, dim={self.weight.shape[1]}"
