"""The modules that apply a scoring rule: a tied embedding and the decoder's output scorer."""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from fairseq_tying.core import scoring

# Bumped after every optimizer step (torch's global hook): a cached output matrix keyed on it can
# never outlive a weight update, even one written through ``param.data`` (fp16 master copies).
_optimizer_steps = [0]


def _count_step(*_args, **_kwargs) -> None:
    _optimizer_steps[0] += 1


register_optimizer_step_post_hook(_count_step)

# The rule's (W_out, b) per (weight, rule), shared by every module holding the weight: an
# ``l2norm`` decoder looks its input rows up in the very matrix it scores with, so inference
# keeps one extra V×D buffer. An entry pins its weight's storage (``src``), so the storage's
# address cannot be reused by another tensor while the entry compares that address.
_Entry = tuple[Tensor, tuple, scoring.Affine]  # (src, key, (W_out, b))
_entries: dict[tuple[int, str], _Entry] = {}
_watched: set[int] = set()


def _key(weight: Tensor) -> tuple:
    return (weight.data_ptr(), weight._version, weight.dtype, weight.device, _optimizer_steps[0])


def cached_output_matrix_and_bias(output_layer: str, weight: Tensor) -> scoring.Affine:
    """``scoring.output_matrix_and_bias(rule, weight)``, computed once until the weight changes
    (storage, in-place version, dtype, device, or any optimizer step). Inference only."""
    output_layer = scoring.matrix_rule(output_layer)
    entry = _entries.get((id(weight), output_layer))
    key = _key(weight)
    if entry is None or entry[1] != key or entry[0].data_ptr() != key[0]:
        w_out, bias = scoring.output_matrix_and_bias(output_layer, weight)
        # detached: a value that is the weight itself (distance) must not keep it alive
        value = (w_out.detach(), None if bias is None else bias.detach())
        entry = (weight.detach(), key, value)
        _entries[(id(weight), output_layer)] = entry
        if id(weight) not in _watched:
            _watched.add(id(weight))
            weakref.finalize(weight, evict, id(weight))
    return entry[2]


def evict(weight_id: int) -> None:
    """Drop the cached matrices of the weight with this ``id``."""
    for output_layer in scoring.OUTPUT_LAYERS:
        _entries.pop((weight_id, output_layer), None)
    _watched.discard(weight_id)


class _Evicting(nn.Module):
    """Drops its weight's cached matrices when the weights may change: ``train()``,
    ``load_state_dict`` and ``_apply`` (``.to()``, ``.half()``, ``.cuda()``...)."""

    weight: nn.Parameter

    def _evict(self) -> None:
        evict(id(self.weight))

    def train(self, mode: bool = True):
        self._evict()
        return super().train(mode)

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        self._evict()
        super()._load_from_state_dict(*args, **kwargs)

    def _apply(self, fn, *args, **kwargs):
        self._evict()
        return super()._apply(fn, *args, **kwargs)


def _inference() -> bool:
    return not torch.is_grad_enabled()


class TiedEmbedding(_Evicting, nn.Embedding):
    """fairseq's token embedding (N(0, d^-1/2) init, zero padding row) whose lookups can use
    the row-normalized matrix w_i/‖w_i‖ (the ``l2norm`` output layer). fairseq's √d scaling stays
    in the encoder/decoder, applied after the lookup. In eval mode without autograd the
    normalized matrix is cached (shared with an ``l2norm`` scorer over the same weight)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int):
        super().__init__(num_embeddings, embedding_dim, padding_idx=padding_idx)
        nn.init.normal_(self.weight, mean=0, std=embedding_dim**-0.5)
        nn.init.constant_(self.weight[padding_idx], 0)
        self.normalize_rows = False

    def forward(self, tokens: Tensor) -> Tensor:
        if not self.normalize_rows:
            return super().forward(tokens)
        if self.training or not _inference():
            return scoring.unit_rows(super().forward(tokens))
        unit, _ = cached_output_matrix_and_bias("l2norm", self.weight)
        return F.embedding(tokens, unit, self.padding_idx)


class OutputScorer(_Evicting):
    """Scores h ↦ rule(L·h, W) + b₂ over the (possibly shared) matrix ``weight``.

    ``projection`` is the optional learned map L from the decoder output (size H) to the
    embedding size D; ``bias`` the optional per-token output bias b₂; ``gain`` fixnorm's learned
    scalar g (``scoring.initial_gain``), None under the other layers. In eval mode without
    autograd the rule's (W_out, b) is cached and reused across decoding steps
    (``cached_output_matrix_and_bias``); it is dropped on ``train()``, ``load_state_dict``,
    ``.to()``/``.half()``, and whenever the weight's storage, version, dtype, device or the
    optimizer step count changes. b₂ is added to the cached b at each call (V additions).
    """

    def __init__(self, weight: nn.Parameter, output_layer: str, projection: nn.Linear | None = None,
                 output_bias: bool = False):
        super().__init__()
        if output_layer not in scoring.OUTPUT_LAYERS:
            raise ValueError(f"unknown output layer {output_layer!r}; "
                             f"choose from {scoring.OUTPUT_LAYERS}")
        self.weight = weight
        self.output_layer = output_layer
        self.projection = projection
        # b₂: a learned score offset per token (zero at the start), added to the rule's bias
        self.bias = nn.Parameter(weight.new_zeros(weight.shape[0])) if output_bias else None
        self.gain = None
        if output_layer in scoring.NORMALIZED_HIDDEN_LAYERS:
            self.gain = nn.Parameter(weight.new_tensor(scoring.initial_gain(weight.shape[1])))

    def forward(self, features: Tensor) -> Tensor:
        features = self.project(features)
        w_out, bias = self.output_matrix_and_bias()
        # One matrix product over all positions. Given a non-contiguous (B, T, D) input (the
        # decoder's transposed output) and a weight without grad (the cached W_out), torch's
        # matmul would take a batched path that reads all of W_out once per sentence.
        scores = F.linear(features.reshape(-1, features.shape[-1]), w_out, bias)
        return scores.view(*features.shape[:-1], scores.shape[-1])

    def project(self, features: Tensor) -> Tensor:
        """ĥ, the vectors that the output layer's affine map scores: L·h (h without a
        projection), normalized to length g under fixnorm (``scoring.scored_hidden``)."""
        hidden = features if self.projection is None else self.projection(features)
        return scoring.scored_hidden(self.output_layer, hidden, self.gain)

    def output_matrix_and_bias(self) -> scoring.Affine:
        """(W_out, b) of the scores s = (L·h)·W_outᵀ + b; b includes the output bias b₂."""
        if self.output_layer == "dot":
            return self.weight, self.bias
        if self.training or not _inference():
            # gradients must flow through the normalization
            return scoring.output_matrix_and_bias(self.output_layer, self.weight, self.bias)
        w_out, bias = cached_output_matrix_and_bias(self.output_layer, self.weight)
        return w_out, scoring.add_output_bias(bias, self.bias)

    def extra_repr(self) -> str:
        return (
            f"output_layer={self.output_layer}, vocab={self.weight.shape[0]}, "
            f"dim={self.weight.shape[1]}, "
            f"output_bias={self.bias is not None}"
            + ("" if self.gain is None else f", gain={self.gain.item():.3f}")
        )
