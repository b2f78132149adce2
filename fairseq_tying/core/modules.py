"""The modules that apply an output layer (``output_layers.py``): a tied embedding and the
decoder's output scorer."""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from fairseq_tying.core import output_layers, scoring
from fairseq_tying.core.output_layers import OutputLayer

# Bumped after every optimizer step (torch's global hook): a cached output matrix keyed on it can
# never outlive a weight update, even one written through ``param.data`` (fp16 master copies).
_optimizer_steps = [0]


def _count_step(*_args, **_kwargs) -> None:
    _optimizer_steps[0] += 1


register_optimizer_step_post_hook(_count_step)

# A layer's (W_out, b) per (weight, the layer's cache key), shared by every module holding the
# weight: an ``l2norm`` decoder looks its input rows up in the very matrix it scores with, so
# inference keeps one extra V×D buffer. An entry pins its weight's storage (``src``), so the
# storage's address cannot be reused by another tensor while the entry compares that address.
_Entry = tuple[Tensor, tuple, scoring.Affine]  # (src, key, (W_out, b))
_entries: dict[tuple[int, str], _Entry] = {}
_watched: set[int] = set()


def _key(weight: Tensor, parameters: dict[str, Tensor]) -> tuple:
    # a learned parameter of W_out (ngpt's sz) is part of the key as the weight is
    return (weight.data_ptr(), weight._version, weight.dtype, weight.device, _optimizer_steps[0],
            *((p.data_ptr(), p._version) for p in parameters.values() if p is not None))


def cached_output_matrix_and_bias(output_layer: str, weight: Tensor,
                                  **parameters: Tensor) -> scoring.Affine:
    """The (W_out, b) of ``output_layer`` over ``weight`` and its learned ``parameters``,
    computed once until they change (storage, in-place version, dtype, device, or any optimizer
    step) and shared by the layers with the same ``cache_key``. Inference only."""
    layer = output_layers.get(output_layer)
    cache_key = layer.cache_key()
    if cache_key is None:  # W_out is W itself
        return layer.affine(weight, **parameters)
    entry = _entries.get((id(weight), cache_key))
    key = _key(weight, parameters)
    if entry is None or entry[1] != key or entry[0].data_ptr() != key[0]:
        w_out, bias = output_layers.get(cache_key).affine(weight, **parameters)
        # detached: a value that is the weight itself (distance) must not keep it alive
        value = (w_out.detach(), None if bias is None else bias.detach())
        entry = (weight.detach(), key, value)
        _entries[(id(weight), cache_key)] = entry
        if id(weight) not in _watched:
            _watched.add(id(weight))
            weakref.finalize(weight, evict, id(weight))
    return entry[2]


def evict(weight_id: int) -> None:
    """Drop the cached matrices of the weight with this ``id``."""
    for key in [k for k in _entries if k[0] == weight_id]:
        del _entries[key]
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
    the row-normalized matrix w_i/‖w_i‖ (an output layer's ``unit_inputs``, as ``l2norm``'s).
    fairseq's √d scaling stays in the encoder/decoder, applied after the lookup. In eval mode
    without autograd the normalized matrix is cached (shared with a scorer of unit rows over
    the same weight: ``output_layers.UNIT_ROWS``)."""

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
        unit, _ = cached_output_matrix_and_bias(output_layers.UNIT_ROWS, self.weight)
        return F.embedding(tokens, unit, self.padding_idx)


class OutputScorer(_Evicting):
    """Scores h ↦ t(ĥ·W_outᵀ + b + b₂), the layer's contract (``layer_contract.py``), over the
    (possibly shared) matrix ``weight``, with ĥ the layer's scored vector of L·h.

    ``projection`` is the optional learned map L from the decoder output (size H) to the
    embedding size D; ``bias`` the optional per-token output bias b₂. The layer's learned
    parameters (``OutputLayer.parameters``: fixnorm's scalar ``gain`` g, ngpt's vector ``sz``)
    are parameters of the scorer under their names, at the layer's ``initial_values``; one of
    another registered layer reads None. ``settings`` are the layer's constants (softcap's c),
    from the flags. In eval mode without autograd the layer's (W_out, b) is cached and reused
    across decoding steps (``cached_output_matrix_and_bias``); it is dropped on ``train()``,
    ``load_state_dict``, ``.to()``/``.half()``, and whenever the weight's storage, version,
    dtype, device or the optimizer step count changes. b₂ is added to the cached b at each
    call (V additions).
    """

    def __init__(self, weight: nn.Parameter, output_layer: str, projection: nn.Linear | None = None,
                 output_bias: bool = False, settings: dict[str, float] | None = None):
        super().__init__()
        layer = output_layers.get(output_layer)
        self.weight = weight
        self.output_layer = output_layer
        self.settings = layer.setting_values(settings)
        self.projection = projection
        # b₂: a learned score offset per token (zero at the start), added to the layer's bias
        self.bias = nn.Parameter(weight.new_zeros(weight.shape[0])) if output_bias else None
        # every registered layer's scalars are attributes, None unless this layer learns them:
        # a checkpoint's gain is then dropped by name when finetuned into a layer without one
        for name in output_layers.parameter_names():
            setattr(self, name, None)
        for name, value in layer.initial_values(*weight.shape).items():
            setattr(self, name, nn.Parameter(weight.new_tensor(value)))

    @property
    def layer(self) -> OutputLayer:
        return output_layers.get(self.output_layer)

    def layer_parameters(self) -> dict[str, Tensor]:
        """The layer's learned parameters by name."""
        return {name: getattr(self, name) for name in self.layer.parameters}

    def parameter_means(self) -> dict[str, float]:
        """Each learned parameter's value (a vector's mean), by name: what the logs report."""
        return {name: p.detach().float().mean().item()
                for name, p in self.layer_parameters().items()}

    def forward(self, features: Tensor) -> Tensor:
        features = self.project(features)
        w_out, bias = self.output_matrix_and_bias()
        # One matrix product over all positions. Given a non-contiguous (B, T, D) input (the
        # decoder's transposed output) and a weight without grad (the cached W_out), torch's
        # matmul would take a batched path that reads all of W_out once per sentence.
        scores = F.linear(features.reshape(-1, features.shape[-1]), w_out, bias)
        scores = self.transform(scores)
        return scores.view(*features.shape[:-1], scores.shape[-1])

    def transform(self, scores: Tensor) -> Tensor:
        """t of the affine scores (the identity for an affine layer)."""
        layer = self.layer
        return layer.transform(scores, **self.settings) if layer.transforms else scores

    def project(self, features: Tensor) -> Tensor:
        """ĥ, the vectors that the output layer's affine map scores: L·h (h without a
        projection), as the layer scores it (``OutputLayer.scored_hidden``: normalized to
        length g under fixnorm)."""
        hidden = features if self.projection is None else self.projection(features)
        return self.layer.scored_hidden(hidden, **self.layer_parameters())

    def output_matrix_and_bias(self) -> scoring.Affine:
        """(W_out, b) of the scores s = (L·h)·W_outᵀ + b; b includes the output bias b₂."""
        layer = self.layer
        learned = self.layer_parameters()
        if self.training or not _inference() or layer.cache_key() is None:
            # gradients must flow through the normalization (none to cache for W_out = W)
            return layer.output_matrix_and_bias(self.weight, self.bias, **learned)
        w_out, bias = cached_output_matrix_and_bias(self.output_layer, self.weight, **learned)
        return w_out, scoring.add_output_bias(bias, self.bias)

    def extra_repr(self) -> str:
        scalars = "".join(f", {name}={value:.3f}" for name, value in
                          {**self.parameter_means(), **self.settings}.items())
        return (
            f"output_layer={self.output_layer}, vocab={self.weight.shape[0]}, "
            f"dim={self.weight.shape[1]}, "
            f"output_bias={self.bias is not None}"
            + scalars
        )
