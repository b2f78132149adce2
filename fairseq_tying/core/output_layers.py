"""The output layers, one class each: the score s_i of token i for the decoder output h over a
tied embedding matrix W (row w_i per token),

    dot       s_i = h·w_i
    l2norm    s_i = h·w_i / ‖w_i‖        and every input lookup uses w_i / ‖w_i‖ too
    cosine    s_i = h·w_i / ‖w_i‖        input lookups use the raw w_i
    sqnorm    s_i = h·w_i / ‖w_i‖²
    distance  s_i = h·w_i − ½‖w_i‖²      (= −½‖h − w_i‖² up to a term constant in i)
    fixnorm   s_i = g·(h/‖h‖)·(w_i/‖w_i‖) = g·cos(h, w_i), and input lookups use w_i / ‖w_i‖
    softcap   s_i = c·tanh(h·w_i / c)     (Gemma 2's final logit soft-capping, c = 30)
    ngpt      s_i = s_z,i·cos(h, w_i)     (nGPT's learned per-token scale, a vector of V values)

The first five are the normalization paper's (Liu et al. 2020); ``fixnorm`` is FixNorm with
ScaleNorm at the output (Nguyen & Chiang 2018; Nguyen & Salazar 2019), g one learned scalar.

Every layer keeps one contract, s = t(ĥ·W_outᵀ + b), which every consumer computes
(``layer_contract.py``: what a class may override, and the check ``register_output_layer`` runs).
The class also holds what the rest of the package asks of a layer: its input lookups, its
learned parameters, the matrix decoding caches, what the exports can make of it, and the
papers' figures the studies print beside ours.

``OUTPUT_LAYERS`` maps each name (``--output-layer NAME``) to its layer, in the order they were
registered. ``register_output_layer`` adds a layer, as fairseq's ``register_model`` adds a
model; ``FAIRSEQ_TYING_LAYERS`` names the files or modules that register more (read when the
plugin is imported, so fairseq-train, fairseq-generate and every tool see them).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from fairseq_tying.core.layer_contract import (  # noqa: F401  (re-exported: a layer's imports)
    OVERRIDABLE,
    OutputLayer,
    PaperDelta,
    Setting,
    check_contract,
)
from fairseq_tying.core.scoring import (
    Affine,
    scaled_rows,
    squared_norms,
    unit_rows,
)

PLUGINS_ENV = "FAIRSEQ_TYING_LAYERS"
LIU = "Liu et al. (2020)"
NGUYEN_SALAZAR = "Nguyen & Salazar (2019)"  # FixNorm with ScaleNorm at the output
GEMMA2 = "Gemma Team (2024)"  # Gemma 2, final logit soft-capping
NGPT = "Loshchilov et al. (2025)"  # nGPT, the normalized Transformer
# what the papers' Δs measure (``OutputLayer.paper_figures``); the full references, with their
# tables, are in docs/results.md (References)
LIU_FIGURES = (f"{LIU}: each normalization's BLEU minus that of their unnormalized model "
               "(`dot`), a Transformer on IWSLT'14 Es→En and DynamicConv on IWSLT'14 De→En and "
               "WMT'16 En→De (the paper's results tables)")
NGUYEN_SALAZAR_FIGURES = (
    f"{NGUYEN_SALAZAR}: +1.1 is PreNorm + ScaleNorm + FixNorm together against the bilingual "
    "baselines they compare with, the mean over five low-resource TED Talks pairs (the paper's "
    "low-resource results table), while `fixnorm` is FixNorm with one learned scale at the "
    "output of a post-norm model")


OUTPUT_LAYERS: dict[str, OutputLayer] = {}


def register_output_layer(name: str) -> Callable[[type[OutputLayer]], type[OutputLayer]]:
    """Class decorator: ``@register_output_layer("name")`` makes the class the layer of
    ``--output-layer name``."""

    def register(cls: type[OutputLayer]) -> type[OutputLayer]:
        if name in OUTPUT_LAYERS:
            raise ValueError(f"cannot register output layer {name!r} twice")
        if not isinstance(cls, type) or not issubclass(cls, OutputLayer):
            raise ValueError(f"output layer {name!r} ({cls.__name__}) must extend OutputLayer")
        check_contract(name, cls)
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
    """Every learned parameter any registered layer has (a scorer holds None for the others)."""
    return tuple(dict.fromkeys(p for layer in OUTPUT_LAYERS.values() for p in layer.parameters))


def all_settings() -> tuple[Setting, ...]:
    """Every setting any registered layer has, once by name (a flag each)."""
    return tuple({s.name: s for layer in OUTPUT_LAYERS.values() for s in layer.settings}.values())


# ---- the layers ------------------------------------------------------------------------------


@register_output_layer("dot")
class Dot(OutputLayer):
    """s_i = h·w_i: fairseq's own output projection over the tied matrix."""

    scores_input_rows = True
    citation = LIU

    def affine(self, weight: Tensor, **_: Tensor | float | None) -> Affine:
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
    # the Transformer's Δ is the difference of two BLEU scores of the paper's (34.65 − 34.24)
    paper_deltas = {"transformer": (PaperDelta(0.41, "IWSLT'14 Es→En"),),
                    "dynamicconv": (PaperDelta(0.34, "IWSLT'14 De→En"),
                                    PaperDelta(0.5, "WMT'16 En→De"))}
    paper_figures = LIU_FIGURES

    def affine(self, weight: Tensor, **_: Tensor | float | None) -> Affine:
        return unit_rows(weight), None


@register_output_layer("sqnorm")
class SqNorm(OutputLayer):
    """s_i = h·w_i / ‖w_i‖² (Liu et al. 2020)."""

    citation = LIU
    paper_deltas = {"transformer": (PaperDelta(0.73, "IWSLT'14 Es→En"),),  # 34.97 − 34.24
                    "dynamicconv": (PaperDelta(0.22, "IWSLT'14 De→En"),
                                    PaperDelta(0.3, "WMT'16 En→De"))}
    paper_figures = LIU_FIGURES

    def affine(self, weight: Tensor, **_: Tensor | float | None) -> Affine:
        return scaled_rows(weight, power=2), None


@register_output_layer("distance")
class Distance(OutputLayer):
    """s_i = h·w_i − ½‖w_i‖² = −½‖h − w_i‖² + ½‖h‖², the negative squared distance up to a term
    constant in i (Liu et al. 2020): W_out = W, b_i = −½‖w_i‖²."""

    bias_formula = "−½‖w_i‖²"
    citation = LIU
    paper_deltas = {"transformer": (PaperDelta(0.30, "IWSLT'14 Es→En"),),  # 34.54 − 34.24
                    "dynamicconv": (PaperDelta(0.36, "IWSLT'14 De→En"),
                                    PaperDelta(0.1, "WMT'16 En→De"))}
    paper_figures = LIU_FIGURES

    def affine(self, weight: Tensor, **_: Tensor | float | None) -> Affine:
        return weight, (-0.5 * squared_norms(weight)).to(weight.dtype)


@register_output_layer("cosine")
class Cosine(OutputLayer):
    """s_i = h·w_i / ‖w_i‖, input lookups use the raw w_i (Liu et al. 2020)."""

    citation = LIU
    paper_deltas = {"transformer": (PaperDelta(0.57, "IWSLT'14 Es→En"),),  # 34.81 − 34.24
                    "dynamicconv": (PaperDelta(0.41, "IWSLT'14 De→En"),
                                    PaperDelta(0.2, "WMT'16 En→De"))}
    paper_figures = LIU_FIGURES

    def affine(self, weight: Tensor, **_: Tensor | float | None) -> Affine:
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
    # not this layer's Δ: PreNorm + ScaleNorm + FixNorm over their baseline, the mean of five
    # low-resource pairs (Transformer)
    paper_deltas = {"*": (PaperDelta(1.1, "PreNorm + ScaleNorm + FixNorm, mean of 5 "
                                          "low-resource pairs", digits=1),)}
    paper_figures = NGUYEN_SALAZAR_FIGURES

    def affine(self, weight: Tensor, **_: Tensor | float | None) -> Affine:
        return unit_rows(weight), None

    def scored_hidden(self, hidden: Tensor, gain: Tensor | float | None = None,
                      **_: Tensor | float | None) -> Tensor:
        if gain is None:
            raise ValueError(f"--output-layer {self.name} scores g·cos(h, w_i): pass its gain g")
        unit = unit_rows(hidden)
        return unit * (gain.to(unit.dtype) if isinstance(gain, Tensor) else gain)

    def initial_values(self, vocab: int, embed_dim: int) -> dict[str, Tensor | float]:
        return {"gain": initial_gain(embed_dim)}

    def cache_key(self) -> str | None:
        return UNIT_ROWS


SOFTCAP = 30.0  # Gemma 2's final_logit_softcapping


@register_output_layer("softcap")
class SoftCap(OutputLayer):
    """s_i = c·tanh(h·w_i / c): ``dot``'s scores soft-capped to (−c, c), Gemma 2's final logit
    soft-capping (Gemma Team 2024, arXiv:2408.00118 §2; c = 30.0, ``final_logit_softcapping``
    of transformers' ``Gemma2Config``) over the tied matrix. W_out = W, no bias;
    t(s) = c·tanh(s/c), t′(s) = 1 − tanh²(s/c); c is ``--softcap`` (default 30.0)."""

    scores_input_rows = True
    settings = (Setting("softcap", SOFTCAP, "--output-layer softcap: the cap c of "
                        f"s_i = c·tanh(h·w_i / c) (default {SOFTCAP:g}, Gemma 2's)"),)
    ct2_transform = "final_logit_softcapping"  # CTranslate2's Gemma 2 decoders apply it
    citation = GEMMA2

    def affine(self, weight: Tensor, **_: Tensor | float | None) -> Affine:
        return weight, None

    def transform(self, scores: Tensor, softcap: float = SOFTCAP, **_: float) -> Tensor:
        return softcap * torch.tanh(scores / softcap)

    def derivative(self, scores: Tensor, softcap: float = SOFTCAP, **_: float) -> Tensor:
        return 1 - torch.tanh(scores / softcap).square()

    def cache_key(self) -> str | None:
        return None


SZ_INIT_VALUE = 1.0  # nGPT's sz_init_value


def sz_init_scaling(embed_dim: int) -> float:
    """nGPT's sz_init_scaling, its base_scale 1/√n_embd (n_embd: here D, the scored size)."""
    return 1 / math.sqrt(embed_dim)


@register_output_layer("ngpt")
class NGPT(OutputLayer):
    """s_i = s_z,i·cos(h, w_i) = s_z,i·(h/‖h‖)·(w_i/‖w_i‖), input lookups w_i/‖w_i‖: nGPT's
    output logits (Loshchilov et al., arXiv:2410.01131 §2.6) over the tied matrix, s_z a learned
    vector of V values. As nGPT's code parameterizes it (NVIDIA/ngpt ed19eb2, model.py: the
    parameter ``sz = sz_init_scaling·ones(V)``, lines 239–241; used as
    ``sz·(sz_init_value/sz_init_scaling)``, lines 284–285), the stored ``sz`` starts at
    1/√D and s_z = sz·√D at 1 (sz_init_value). ĥ = h/‖h‖ and W_out = diag(s_z)·(w_i/‖w_i‖):
    affine in ĥ, so the loss reaches sz through W_out."""

    unit_inputs = True
    parameters = ("sz",)
    export_refusal = (
        "scores s_z,i·cos(h, w_i): it normalizes the decoder output h before the output "
        "projection, which {target} decoder cannot express (its layer norms subtract the mean "
        "and scale each feature, an L2 normalization does neither)")
    citation = NGPT

    def affine(self, weight: Tensor, sz: Tensor | None = None,
               **_: Tensor | float | None) -> Affine:
        if sz is None:
            raise ValueError(f"--output-layer {self.name} scores s_z,i·cos(h, w_i): pass its sz")
        scale = sz * (SZ_INIT_VALUE / sz_init_scaling(weight.shape[1]))
        return unit_rows(weight) * scale.to(weight.dtype).unsqueeze(-1), None

    def scored_hidden(self, hidden: Tensor, **_: Tensor | float | None) -> Tensor:
        return unit_rows(hidden)

    def initial_values(self, vocab: int, embed_dim: int) -> dict[str, Tensor | float]:
        return {"sz": torch.full((vocab,), sz_init_scaling(embed_dim))}


# Liu et al.'s layers, the grid of the normalization paper's studies
PAPER_LAYERS = tuple(n for n, layer in OUTPUT_LAYERS.items() if layer.citation == LIU)
# fairseq's own output layer: the default of --output-layer, and the layer every other one is
# compared with in the studies
BASELINE = Dot.name


# ---- by name ---------------------------------------------------------------------------------


def output_matrix_and_bias(name: str, weight: Tensor, output_bias: Tensor | None = None,
                           **parameters: Tensor | float | None) -> Affine:
    """(W_out, b) of the layer called ``name`` (``OutputLayer.output_matrix_and_bias``)."""
    return get(name).output_matrix_and_bias(weight, output_bias, **parameters)


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
