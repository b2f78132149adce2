"""The contract of an output layer, which every registered layer keeps and every consumer
computes (the model's forward and incremental decoding, fairseq's ``sequence_scorer`` through
it, the chunked loss, the exports, the analysis):

    s = t(ĥ·W_outᵀ + b)

an affine map of the scored vector ĥ followed by an optional element-wise transform t. A class
says how (W_out, b) follow from W and its learned parameters (``affine``, abstract), ĥ from h
(``scored_hidden``: h itself, except under ``fixnorm`` where ĥ = g·h/‖h‖ and ``ngpt`` where
ĥ = h/‖h‖) and what t is (``transform``, with its ``derivative`` t′ for the chunked loss's
closed-form gradient; the identity by default). t reads the layer's ``settings`` (constants
chosen by a flag: softcap's c), never its learned ``parameters``, which enter through ``affine``
and ``scored_hidden`` only, so autograd carries their gradients wherever the scores are
computed. ``check_contract`` (run by ``register_output_layer``) refuses a class that does not
implement ``affine``, that has a transform without its derivative, or that overrides any other
member of ``OutputLayer`` than the methods of ``OVERRIDABLE`` and the values of ``DECLARED``:
a method (``scores`` included: no consumer calls it, each computes the contract's parts), a
property (``transforms``, by which the consumers decide whether to apply t), a value, a private
member (``_learned``), an instance hook (``__init__``: a layer has no state of its own), in the
class or in any class it inherits before ``OutputLayer``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from fairseq_tying.core.scoring import Affine, add_output_bias

Parameters = Mapping[str, Tensor | float | None]


@dataclass(frozen=True)
class Setting:
    """A positive constant of a layer, chosen by the flag ``--NAME`` (``_`` as ``-``) and not
    learned: softcap's cap c. A model flag: resuming with another value is refused."""

    name: str
    default: float
    help: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class PaperDelta:
    """A Δ BLEU over ``dot`` that a layer's paper reports, written as the paper gives it:
    ``value`` to ``digits`` decimals, ``where`` it was measured (a test set, or what it is a
    mean of)."""

    value: float
    where: str
    digits: int = 2

    def __str__(self) -> str:
        return f"{self.value:+.{self.digits}f} ({self.where})"


class OutputLayer(ABC):
    """An output layer: s = t(ĥ·W_outᵀ + b). A subclass states its equation and its source in
    its docstring, implements ``affine`` and overrides what differs from these defaults (the
    methods of ``OVERRIDABLE`` only); registered with ``register_output_layer``, it is a choice
    of ``--output-layer`` for every model, criterion and tool."""

    name: ClassVar[str]  # set by register_output_layer
    # with a tied matrix, the input lookups use w_i/‖w_i‖ instead of w_i
    unit_inputs: ClassVar[bool] = False
    # W_out is the matrix the input lookups read (W, or its unit rows with unit_inputs): a
    # stock export keeps one tensor for both roles
    scores_input_rows: ClassVar[bool] = False
    # learned tensors besides W (a scalar, or a vector of one value per token), parameters of
    # the scorer under these names
    parameters: ClassVar[tuple[str, ...]] = ()
    # constants set by flags, read by ``transform``
    settings: ClassVar[tuple[Setting, ...]] = ()
    # b written out, for a layer whose scores have a per-token bias (stock fairseq has none)
    bias_formula: ClassVar[str | None] = None
    # why no export (stock fairseq, CTranslate2) can compute these scores; {target} names the
    # decoder it would go into (a layer with a transform and none: the exports' generic refusal)
    export_refusal: ClassVar[str | None] = None
    # the attribute of CTranslate2's decoder spec that applies t, set to the layer's one
    # setting (softcap: final_logit_softcapping = c); None: no CTranslate2 decoder applies t
    ct2_transform: ClassVar[str | None] = None
    citation: ClassVar[str] = ""
    # Δ BLEU over dot that the layer's paper reports, per model family ("transformer",
    # "dynamicconv"; "*": any family): only differences, never the paper's BLEU itself, which
    # was measured on another corpus with another model
    paper_deltas: ClassVar[Mapping[str, tuple[PaperDelta, ...]]] = {}
    # what those Δs measure, in words: the paper, its models, corpora and tables, and how the
    # paper's method differs from this layer (the legends beside the Δs print it)
    paper_figures: ClassVar[str] = ""

    @abstractmethod
    def affine(self, weight: Tensor, **parameters: Tensor | float | None) -> Affine:
        """(W_out, b) from the tied matrix W and the layer's learned ``parameters``."""

    def scored_hidden(self, hidden: Tensor, **parameters: Tensor | float | None) -> Tensor:
        """ĥ, the vector the layer scores: h itself unless the layer says otherwise."""
        return hidden

    def transform(self, scores: Tensor, **settings: float) -> Tensor:
        """t, applied to each affine score; the identity unless the layer says otherwise."""
        return scores

    def derivative(self, scores: Tensor, **settings: float) -> Tensor:
        """t′ at each affine score (``scores``: before t), for the chunked loss's gradient."""
        return torch.ones_like(scores)

    def initial_values(self, vocab: int, embed_dim: int) -> dict[str, Tensor | float]:
        """Each of ``parameters`` at the start of training, for V = ``vocab`` tokens and
        D = ``embed_dim`` (a float for a scalar)."""
        return {}

    def cache_key(self) -> str | None:
        """The name under which decoding caches (W_out, b), computed by that layer's ``affine``
        and shared by every layer that gives the same key; None: W_out is W itself, nothing to
        compute."""
        return self.name

    @property
    def transforms(self) -> bool:
        """Whether the scores go through a transform t other than the identity."""
        return type(self).transform is not OutputLayer.transform

    def setting_values(self, given: Parameters | None = None) -> dict[str, float]:
        """Each setting's value: ``given``'s, or its default."""
        given = given or {}
        return {s.name: float(given.get(s.name) if given.get(s.name) is not None else s.default)
                for s in self.settings}

    def output_matrix_and_bias(self, weight: Tensor, output_bias: Tensor | None = None,
                               **parameters: Tensor | float | None) -> Affine:
        """(W_out, b) such that the affine scores are ``ĥ @ W_out.T + b``; ``output_bias``
        (b₂, one value per token) is added to the layer's own b."""
        w_out, bias = self.affine(weight, **self._learned(parameters))
        return w_out, add_output_bias(bias, output_bias)

    def scores(self, hidden: Tensor, weight: Tensor, output_bias: Tensor | None = None,
               **parameters: Tensor | float | None) -> Tensor:
        """The scores of every token for decoder outputs ``hidden`` (…, D); ``parameters``:
        the layer's learned parameters and settings by name (others are ignored)."""
        w_out, bias = self.output_matrix_and_bias(weight, output_bias, **parameters)
        affine = F.linear(self.scored_hidden(hidden, **self._learned(parameters)), w_out, bias)
        return self.transform(affine, **self.setting_values(parameters))

    def _learned(self, given: Parameters) -> dict[str, Tensor | float | None]:
        return {name: given.get(name) for name in self.parameters}


# what a layer may override: what the consumers call (a layer's own helpers are free)
OVERRIDABLE = ("affine", "scored_hidden", "transform", "derivative", "initial_values",
               "cache_key")
# what a layer may set as a value: the class attributes declared above (``name`` is set by
# register_output_layer)
DECLARED = tuple(OutputLayer.__annotations__)


# what would give a layer's instances a state of their own (an attribute set in __init__ would
# hide `transform` from the consumers, which read the class): a layer has none
INSTANCE_HOOKS = ("__init__", "__new__", "__getattr__", "__getattribute__", "__setattr__")


def base_members() -> frozenset[str]:
    """OutputLayer's own members, private ones included, and the instance hooks; not the other
    dunders and abc's ``_abc_impl``, which Python puts in every class's dict."""
    names = {*vars(OutputLayer), *DECLARED}
    return frozenset({*INSTANCE_HOOKS, *(n for n in names if n != "_abc_impl"
                                          and not (n.startswith("__") and n.endswith("__")))})


def check_contract(name: str, cls: type[OutputLayer]) -> None:
    """Refuse a class whose scores some consumer would not compute."""
    where = f"output layer {name!r} ({cls.__name__})"
    if getattr(cls, "__abstractmethods__", None):
        raise ValueError(f"{where} must implement {', '.join(sorted(cls.__abstractmethods__))}: "
                         "(W_out, b) from the tied matrix W")
    for owner, attr, value in _overrides(cls):
        _check_override(where, attr, f"{type(value).__name__}" + (
            "" if owner is cls else f" of {owner.__name__}"), value)
    if (cls.transform is OutputLayer.transform) != (cls.derivative is OutputLayer.derivative):
        raise ValueError(f"{where} must override transform and derivative together: the chunked "
                         "loss multiplies its gradient by t′")


def _overrides(cls: type) -> list[tuple[type, str, object]]:
    """(class, member, value) of each of OutputLayer's members that a class before OutputLayer
    in ``cls``'s MRO (``cls``, its bases, mixins) sets in its own dict."""
    mro = cls.__mro__
    members = base_members()
    return [(owner, attr, value) for owner in mro[:mro.index(OutputLayer)]
            for attr, value in vars(owner).items() if attr in members]


def _check_override(where: str, attr: str, kind: str, value: object) -> None:
    """Refuse an override of ``attr`` by ``value`` (``kind``: its type, and the class whose dict
    holds it where that is not the layer's own) outside OVERRIDABLE and DECLARED."""
    if attr in DECLARED:
        if hasattr(value, "__get__"):  # a property, a method: computed at each read
            raise ValueError(f"{where} sets {attr} to a {kind}: it declares a constant of the "
                             "layer, which registration and the consumers read as such; "
                             "assign the value itself")
        return
    if attr not in OVERRIDABLE:
        raise ValueError(
            f"{where} overrides {attr} ({kind}), a member of OutputLayer that no layer may "
            "change: the model, the losses and the exports compute t(ĥ·W_outᵀ + b) from its "
            f"parts; write the layer with {', '.join(OVERRIDABLE)} and the class attributes, "
            "and give a helper of its own a name OutputLayer lacks")
