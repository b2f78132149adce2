"""The output layers, one class each: the score s_i of token i for the decoder output h over a
tied embedding matrix W (row w_i per token),

    dot       s_i = h·w_i
    l2norm    s_i = h·w_i / ‖w_i‖        and every input lookup uses w_i / ‖w_i‖ too
    cosine    s_i = h·w_i / ‖w_i‖        input lookups use the raw w_i
    sqnorm    s_i = h·w_i / ‖w_i‖²
    distance  s_i = h·w_i − ½‖w_i‖²      (= −½‖h − w_i‖² up to a term constant in i)
    fixnorm   s_i = g·(h/‖h‖)·(w_i/‖w_i‖) = g·cos(h, w_i), and input lookups use w_i / ‖w_i‖

The first five are the normalization paper's (Liu et al. 2020); ``fixnorm`` is FixNorm with
ScaleNorm at the output (Nguyen & Chiang 2018; Nguyen & Salazar 2019), g one learned scalar.

Each output layer is an affine map ``s = ĥ·W_outᵀ + b`` of the scored vector ĥ: its class
says how (W_out, b) follow from W (``affine``) and ĥ from h (``scored_hidden``: h itself, except
under ``fixnorm`` where ĥ = g·h/‖h‖), so scoring is one ``F.linear`` whatever the output layer.
A learned per-token output bias b₂ (``--output-bias``; s = V·P·h + b₂ in Press & Wolf's
notation) is added to b. The class also holds what the rest of the package asks of a layer: its
input lookups, its learned scalars, the matrix decoding caches, what the exports can make of it,
and the papers' figures the studies print beside ours.

``OUTPUT_LAYERS`` maps each name (``--output-layer NAME``) to its layer, in the order they were
registered. ``register_output_layer`` adds a layer, as fairseq's ``register_model`` adds a
model; ``FAIRSEQ_TYING_LAYERS`` names the files or modules that register more (read when the
plugin is imported, so fairseq-train, fairseq-generate and every tool see them).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch.nn.functional as F
from torch import Tensor

from fairseq_tying.core.scoring import (
    Affine,
    add_output_bias,
    scaled_rows,
    squared_norms,
    unit_rows,
)

PLUGINS_ENV = "FAIRSEQ_TYING_LAYERS"
LIU = "Liu et al. (2020)"
NGUYEN_SALAZAR = "Nguyen & Salazar (2019)"  # FixNorm with ScaleNorm at the output


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


class OutputLayer:
    """An output layer: s = ĥ·W_outᵀ + b. A subclass states its equation in its docstring,
    implements ``affine`` and overrides what differs from these defaults; registered with
    ``register_output_layer``, it is a choice of ``--output-layer`` for every model,
    criterion and tool."""

    name: ClassVar[str]  # set by register_output_layer
    # with a tied matrix, the input lookups use w_i/‖w_i‖ instead of w_i
    unit_inputs: ClassVar[bool] = False
    # W_out is the matrix the input lookups read (W, or its unit rows with unit_inputs): a
    # stock export keeps one tensor for both roles
    scores_input_rows: ClassVar[bool] = False
    # learned scalars besides W, parameters of the scorer under these names
    parameters: ClassVar[tuple[str, ...]] = ()
    # b written out, for a layer whose scores have a per-token bias (stock fairseq has none)
    bias_formula: ClassVar[str | None] = None
    # why no export (stock fairseq, CTranslate2) can compute these scores; {target} names the
    # decoder it would go into
    export_refusal: ClassVar[str | None] = None
    citation: ClassVar[str] = ""
    # BLEU in Liu et al.'s Transformer on IWSLT'14 Es→En, the table that has every paper layer
    paper_bleu: ClassVar[float | None] = None
    # Δ BLEU over dot reported for a model family ("dynamicconv"; "*": any family)
    paper_deltas: ClassVar[Mapping[str, tuple[PaperDelta, ...]]] = {}

    def affine(self, weight: Tensor) -> Affine:
        """(W_out, b) from the tied matrix W."""
        raise NotImplementedError

    def scored_hidden(self, hidden: Tensor, **parameters: Tensor | float | None) -> Tensor:
        """ĥ, the vector the layer scores: h itself unless the layer says otherwise."""
        return hidden

    def initial_values(self, embed_dim: int) -> dict[str, float]:
        """Each of ``parameters`` at the start of training, for D = ``embed_dim``."""
        return {}

    def cache_key(self) -> str | None:
        """The name under which decoding caches (W_out, b), computed by that layer's ``affine``
        and shared by every layer that gives the same key; None: W_out is W itself, nothing to
        compute."""
        return self.name

    def output_matrix_and_bias(self, weight: Tensor, output_bias: Tensor | None = None) -> Affine:
        """(W_out, b) such that the scores are ``ĥ @ W_out.T + b``; ``output_bias`` (b₂, one
        value per token) is added to the layer's own b."""
        w_out, bias = self.affine(weight)
        return w_out, add_output_bias(bias, output_bias)

    def scores(self, hidden: Tensor, weight: Tensor, output_bias: Tensor | None = None,
               **parameters: Tensor | float | None) -> Tensor:
        """The scores of every token for decoder outputs ``hidden`` (…, D); ``parameters``:
        the layer's learned scalars by name (others are ignored)."""
        w_out, bias = self.output_matrix_and_bias(weight, output_bias)
        return F.linear(self.scored_hidden(hidden, **parameters), w_out, bias)


OUTPUT_LAYERS: dict[str, OutputLayer] = {}


def register_output_layer(name: str) -> Callable[[type[OutputLayer]], type[OutputLayer]]:
    """Class decorator: ``@register_output_layer("name")`` makes the class the layer of
    ``--output-layer name``."""

    def register(cls: type[OutputLayer]) -> type[OutputLayer]:
        if name in OUTPUT_LAYERS:
            raise ValueError(f"cannot register output layer {name!r} twice")
        if not issubclass(cls, OutputLayer):
            raise ValueError(f"output layer {name!r} ({cls.__name__}) must extend OutputLayer")
        cls.name = name
        OUTPUT_LAYERS[name] = cls()
        return cls

    return register


def get(name: str) -> OutputLayer:
    """The registered layer called ``name``."""
    if name not in OUTPUT_LAYERS:
        raise ValueError(f"unknown output layer {name!r}; choose from {tuple(OUTPUT_LAYERS)}")
    return OUTPUT_LAYERS[name]


def names() -> tuple[str, ...]:
    """The registered layers' names, in registration order."""
    return tuple(OUTPUT_LAYERS)


def parameter_names() -> tuple[str, ...]:
    """Every learned scalar any registered layer has (a scorer holds None for the others)."""
    return tuple(dict.fromkeys(p for layer in OUTPUT_LAYERS.values() for p in layer.parameters))


# ---- the layers ------------------------------------------------------------------------------


@register_output_layer("dot")
class Dot(OutputLayer):
    """s_i = h·w_i: fairseq's own output projection over the tied matrix."""

    scores_input_rows = True
    citation = LIU
    paper_bleu = 34.24

    def affine(self, weight: Tensor) -> Affine:
        return weight, None

    def cache_key(self) -> str | None:
        return None


@register_output_layer("l2norm")
class L2Norm(OutputLayer):
    """s_i = h·w_i / ‖w_i‖, and every input lookup uses w_i / ‖w_i‖ too (Liu et al. 2020):
    the tied matrix's rows have one length in every role."""

    unit_inputs = True
    scores_input_rows = True
    citation = LIU
    paper_bleu = 34.65
    paper_deltas = {"dynamicconv": (PaperDelta(0.34, "IWSLT'14 De→En"),
                                    PaperDelta(0.5, "WMT'16 En→De"))}

    def affine(self, weight: Tensor) -> Affine:
        return unit_rows(weight), None


@register_output_layer("sqnorm")
class SqNorm(OutputLayer):
    """s_i = h·w_i / ‖w_i‖² (Liu et al. 2020)."""

    citation = LIU
    paper_bleu = 34.97
    paper_deltas = {"dynamicconv": (PaperDelta(0.22, "IWSLT'14 De→En"),
                                    PaperDelta(0.3, "WMT'16 En→De"))}

    def affine(self, weight: Tensor) -> Affine:
        return scaled_rows(weight, power=2), None


@register_output_layer("distance")
class Distance(OutputLayer):
    """s_i = h·w_i − ½‖w_i‖² = −½‖h − w_i‖² + ½‖h‖², the negative squared distance up to a term
    constant in i (Liu et al. 2020): W_out = W, b_i = −½‖w_i‖²."""

    bias_formula = "−½‖w_i‖²"
    citation = LIU
    paper_bleu = 34.54
    paper_deltas = {"dynamicconv": (PaperDelta(0.36, "IWSLT'14 De→En"),
                                    PaperDelta(0.1, "WMT'16 En→De"))}

    def affine(self, weight: Tensor) -> Affine:
        return weight, (-0.5 * squared_norms(weight)).to(weight.dtype)


@register_output_layer("cosine")
class Cosine(OutputLayer):
    """s_i = h·w_i / ‖w_i‖, input lookups use the raw w_i (Liu et al. 2020)."""

    citation = LIU
    paper_bleu = 34.81
    paper_deltas = {"dynamicconv": (PaperDelta(0.41, "IWSLT'14 De→En"),
                                    PaperDelta(0.2, "WMT'16 En→De"))}

    def affine(self, weight: Tensor) -> Affine:
        return unit_rows(weight), None


# the layer whose W_out is the unit rows w_i/‖w_i‖: while decoding, the input lookups of a
# layer with unit_inputs read its cached matrix, so one V×D matrix serves both roles
UNIT_ROWS = L2Norm.name


def initial_gain(embed_dim: int) -> float:
    """fixnorm's g at the start: √D, ScaleNorm's initial scale (Nguyen & Salazar 2019). Cosines
    lie in [−1, 1], so g bounds every score gap; √D (11.3 at D = 128) lets the softmax put most
    of its mass on one of thousands of tokens from the first step (log 4000 ≈ 8.3)."""
    return float(embed_dim) ** 0.5


@register_output_layer("fixnorm")
class FixNorm(OutputLayer):
    """s_i = g·(h/‖h‖)·(w_i/‖w_i‖) = g·cos(h, w_i), and input lookups use w_i / ‖w_i‖: FixNorm
    with ScaleNorm at the output (Nguyen & Chiang 2018; Nguyen & Salazar 2019), g one learned
    scalar (``initial_gain``). ĥ = g·h/‖h‖ (the norm in fp32, 0 for ‖h‖ < EPS) and W_out is
    l2norm's unit rows, so one cached V×D matrix serves its input lookups and its scores."""

    unit_inputs = True
    scores_input_rows = True
    parameters = ("gain",)
    export_refusal = (
        "scores g·cos(h, w_i): it scales the decoder output h to the learned length g before "
        "the output projection, which {target} decoder cannot express (its last output goes to "
        "the projection as it is; its layer norms subtract the mean and scale each feature, an "
        "L2 normalization does neither)")
    citation = NGUYEN_SALAZAR
    # FixNorm + ScaleNorm over their baseline, mean of five low-resource pairs (Transformer)
    paper_deltas = {"*": (PaperDelta(1.1, "5 low-resource pairs", digits=1),)}

    def affine(self, weight: Tensor) -> Affine:
        return unit_rows(weight), None

    def scored_hidden(self, hidden: Tensor, gain: Tensor | float | None = None,
                      **_: Tensor | float | None) -> Tensor:
        if gain is None:
            raise ValueError(f"--output-layer {self.name} scores g·cos(h, w_i): pass its gain g")
        unit = unit_rows(hidden)
        return unit * (gain.to(unit.dtype) if isinstance(gain, Tensor) else gain)

    def initial_values(self, embed_dim: int) -> dict[str, float]:
        return {"gain": initial_gain(embed_dim)}

    def cache_key(self) -> str | None:
        return UNIT_ROWS


# Liu et al.'s layers, the grid of the normalization paper's studies
PAPER_LAYERS = tuple(n for n, layer in OUTPUT_LAYERS.items() if layer.citation == LIU)
# fairseq's own output layer: the default of --output-layer, and the layer every other one is
# compared with in the studies
BASELINE = Dot.name


# ---- by name ---------------------------------------------------------------------------------


def output_matrix_and_bias(name: str, weight: Tensor, output_bias: Tensor | None = None) -> Affine:
    """(W_out, b) of the layer called ``name`` (``OutputLayer.output_matrix_and_bias``)."""
    return get(name).output_matrix_and_bias(weight, output_bias)


def scores(name: str, hidden: Tensor, weight: Tensor, output_bias: Tensor | None = None,
           **parameters: Tensor | float | None) -> Tensor:
    """The scores of the layer called ``name`` (``OutputLayer.scores``)."""
    return get(name).scores(hidden, weight, output_bias, **parameters)


# ---- more layers from elsewhere ---------------------------------------------------------------


def load_plugins(spec: str | None = None) -> None:
    """Import each file (``*.py``) or module named in ``spec`` (``os.pathsep``-separated;
    default: the ``FAIRSEQ_TYING_LAYERS`` environment variable); each registers its layers
    when imported. One already imported is not imported again."""
    spec = os.environ.get(PLUGINS_ENV, "") if spec is None else spec
    for item in filter(None, spec.split(os.pathsep)):
        if item.endswith(".py"):
            _import_file(Path(item))
        else:
            importlib.import_module(item)


def _import_file(path: Path) -> None:
    module_name = f"fairseq_tying_layers_{path.stem}"
    if module_name in sys.modules:
        return
    if not path.is_file():
        raise FileNotFoundError(f"{PLUGINS_ENV}: no file {path}")
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickle look classes up here
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
