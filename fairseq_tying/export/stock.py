"""Bake a plugin checkpoint into a plain fairseq checkpoint: ``transformer_{dwt,twwt}*`` into
fairseq's ``transformer``, ``dynamicconv_{dwt,twwt}*`` into fairseq's ``lightconv``, and the
language models ``transformer_lm_tied{,_big,_gpt}`` into fairseq's ``transformer_lm{,_big,_gpt}``.

``python -m fairseq_tying.export CKPT OUT`` writes the output layer into the matrices of
fairseq's stock model, so that ``fairseq-generate`` / ``fairseq-eval-lm`` load OUT without
``--user-dir`` and compute the same scores (every stock decoder scores with
``output_projection``):

- every output layer is the affine map ``s = h·W_outᵀ + b`` (``OutputLayer.affine``);
  ``W_out`` becomes ``decoder.output_projection.weight``. An output layer with a bias
  (``OutputLayer.bias_formula``; ``distance``: −½‖w_i‖²) or a learned output bias
  (``--output-bias``) has no stock equivalent, nor has a layer that says why no export can
  compute its scores (``OutputLayer.export_refusal``; ``fixnorm``): the export stops with an
  error and writes nothing;
- ``--tied-projection`` (L, s = rule(L·h, W)): the translation decoders fold it into the output
  matrix (``W_out·L``, a V×H matrix). A language model whose matrix has D ≠ its model size
  keeps it as fairseq's own ``project_out_dim`` (``--decoder-output-dim D``, composed with an
  existing ``project_out_dim``), so its output matrix stays V×D; a D = model size LM folds it
  like the translation decoders (stock builds no ``project_out_dim`` then);
- input lookups of w_i/‖w_i‖ (``OutputLayer.unit_inputs``: ``l2norm``): the normalized rows
  are written into the embeddings;
- where the decoder's input and output rows differ (``OutputLayer.scores_input_rows`` false:
  cosine, sqnorm; ``none``; a folded projection) the output matrix is untied
  (``share_decoder_input_output_embed=False``, and ``share_all_embeddings=False`` with the
  encoder keeping its own copy of the input rows);
  where they are equal the checkpoint holds one tensor for both roles.

The checkpoint holds only plain Python values besides tensors (the model config as a dict, no
``argparse.Namespace``, no numpy, no optimizer state), so torch >= 2.6 loads it with
``weights_only=True`` and no allowlist; pretrained vectors (``--encoder-embed-path``,
``--decoder-embed-path``) are in its matrices, and the paths are dropped so that stock fairseq
never reads those files. ``--config-format namespace`` stores the model config as
fairseq-train does (an ``argparse.Namespace``), the layout CTranslate2's converter reads.
It is an inference checkpoint: to train from it, pass ``--reset-optimizer``.
"""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

import torch
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.models.transformer_lm import TransformerLanguageModelConfig
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError
from torch import Tensor

from fairseq_tying.common import checkpoints
from fairseq_tying.common.atomic import atomic_write
from fairseq_tying.core import names, output_layers, scoring
from fairseq_tying.core.models.dynamicconv_tying import DynamicConvModel
from fairseq_tying.core.models.transformer_lm_tying import TiedTransformerLanguageModel
from fairseq_tying.core.models.transformer_tying import TiedTransformerModel
from fairseq_tying.core.models.tying import tying_mode

PLUGIN_MODEL_KEYS = ("tying", "output_layer", "tied_projection", "tied_embed_dim", "output_bias",
                     "freeze_embeddings")
PLUGIN_CRITERIA = {"label_smoothed_cross_entropy_pr": "label_smoothed_cross_entropy",
                   "cross_entropy_tying": "cross_entropy"}
PLUGIN_CRITERION_KEYS = ("projection_reg", "chunked_loss", "no_chunked_loss", "chunked_loss_mb")
PLUGIN_CRITERION_CLASSES = {"LabelSmoothedCrossEntropyPR": "LabelSmoothedCrossEntropyCriterion",
                            "CrossEntropyTying": "CrossEntropyCriterion"}
# stock family: the plugin's architectures baked into it
PLUGIN_ARCHS = {"transformer": "transformer_{dwt,twwt}*", "lightconv": "dynamicconv_{dwt,twwt}*",
                "transformer_lm": "transformer_lm_tied*"}
CONFIG_FORMATS = ("dict", "namespace")


class ExportError(ValueError):
    """The checkpoint cannot be expressed as a stock fairseq model."""


def _model_args(state: dict) -> Namespace:
    args = checkpoints.CheckpointConfig.of(state).model
    if not isinstance(args, Namespace):
        raise ExportError("the checkpoint has no model configuration (cfg['model']); is it a "
                          "fairseq checkpoint written by fairseq-train?")
    return args


def _layer(args: Namespace) -> output_layers.OutputLayer:
    """The checkpoint's output layer, which must be registered here."""
    try:
        return output_layers.get(args.output_layer)
    except ValueError as e:
        raise ExportError(f"{e} (a layer of another file is registered by naming that file in "
                          f"{output_layers.PLUGINS_ENV})") from None


def _family(arch: str | None) -> str | None:
    return {TiedTransformerModel: "transformer", DynamicConvModel: "lightconv",
            TiedTransformerLanguageModel: "transformer_lm"}.get(ARCH_MODEL_REGISTRY.get(arch))


def stock_arch(args: Namespace, formats: tuple[str, ...] = ("transformer", "lightconv"),
               allow_bias: bool = False) -> str:
    """The stock fairseq model family (``transformer``, ``lightconv``, ``transformer_lm``) the
    checkpoint maps to; ``formats``: the families the caller exports to.

    Refuses, naming the flag, what the target cannot express: another family, an output
    layer's own ``export_refusal`` (``fixnorm``'s and ``ngpt``'s decoder output normalized
    before the projection: no stock or CTranslate2 layer computes h/‖h‖ there, so no export
    gives the same scores), a transform of the scores that the target cannot apply
    (``_refusal``: ``softcap``'s c·tanh(s/c) in stock fairseq), a bias in the scores
    (``OutputLayer.bias_formula``, ``--output-bias``) unless ``allow_bias`` (CTranslate2, which
    has an output bias and applies a layer's ``ct2_transform``; fairseq's models have
    neither), and a translation model's tied matrix narrower than its decoder."""
    arch = getattr(args, "arch", None)
    family = _family(arch)
    if family not in formats:
        plugin = " or ".join(PLUGIN_ARCHS[f] for f in formats)
        raise ExportError(f"--arch {arch} is not one of the plugin's {plugin} architectures: "
                          f"only those are exported to {' / '.join(formats)}")
    layer = _layer(args)
    if (refusal := _refusal(layer, ct2=allow_bias)) is not None:
        target = "CTranslate2's" if allow_bias else f"fairseq's {family}"
        raise ExportError(
            f"--output-layer {layer.name} {refusal.format(target=target)}; keep "
            "using this checkpoint with --user-dir fairseq_tying (fairseq-generate, "
            "fairseq-interactive)")
    if not allow_bias:
        _refuse_bias(args, family)
    tied_dim = getattr(args, "tied_embed_dim", None)
    if family != "transformer_lm" and tied_dim and tied_dim != args.decoder_embed_dim:
        raise ExportError(f"--tied-embed-dim {tied_dim} differs from --decoder-embed-dim "
                          f"{args.decoder_embed_dim}: the exported {family} has no decoder "
                          "input projection for a narrower embedding")
    return family


def _refusal(layer: output_layers.OutputLayer, ct2: bool) -> str | None:
    """Why the target (``ct2``: CTranslate2, else stock fairseq) cannot compute the layer's
    scores: the layer's own reason, or a transform t of its scores that the target does not
    apply (stock decoders end in a linear projection; CTranslate2 applies ``ct2_transform``)."""
    if layer.export_refusal is not None or not layer.transforms:
        return layer.export_refusal
    if ct2 and layer.ct2_transform is not None:
        return None
    instead = ", or export with --format ctranslate2" if layer.ct2_transform else ""
    return (f"passes its scores through an element-wise transform ({type(layer).__name__}."
            "transform), which {target} decoder cannot compute (its output projection is "
            f"linear){instead}")


def _refuse_bias(args: Namespace, family: str) -> None:
    """fairseq's output projections have no bias: refuse the scores that need one."""
    ct2 = ", or export with --format ctranslate2" if family != "lightconv" else ""
    layer = _layer(args)
    if layer.bias_formula is not None:
        raise ExportError(f"--output-layer {layer.name} adds a per-token bias "
                          f"{layer.bias_formula} to the scores, which fairseq's {family} (a "
                          "bias-free output projection) cannot express; keep using this "
                          f"checkpoint with --user-dir fairseq_tying{ct2}")
    if getattr(args, "output_bias", False):
        raise ExportError(f"--output-bias adds a learned per-token bias b₂ to the scores, which "
                          f"fairseq's {family} (a bias-free output projection) cannot express; "
                          f"keep using this checkpoint with --user-dir fairseq_tying{ct2}")


def stock_lm_arch(arch: str) -> str:
    """The stock preset a plugin LM architecture mirrors (``transformer_lm_tied_big`` →
    ``transformer_lm_big``); ``transformer_lm`` for any other."""
    preset = arch.replace("transformer_lm_tied", "transformer_lm", 1)
    return preset if preset in ARCH_MODEL_REGISTRY else "transformer_lm"


def _check_kernel_lists(args: Namespace) -> None:
    """fairseq's lightconv repeats a one-entry kernel-size list with ``list * layers``, which
    fails on the OmegaConf list that a dict config becomes (a Namespace keeps a plain list)."""
    for side in ("encoder", "decoder"):
        if len(getattr(args, f"{side}_kernel_size_list", None) or ()) == 1:
            raise ExportError(f"--{side}-kernel-size-list has one entry, which fairseq's "
                              "lightconv cannot read back from a dict config; export with "
                              "--config-format namespace (loads with --user-dir fairseq_tying "
                              "for the allowlist)")


def _check(args: Namespace) -> str:
    return stock_arch(args)


def _decoder_matrices(model: dict[str, Tensor], args: Namespace
                      ) -> tuple[Tensor, Tensor, Tensor | None]:
    """(the decoder's input rows as stock looks them up, the output layer's W_out, the
    ``--tied-projection`` matrix L or None) of a plugin decoder's state dict."""
    layer = _layer(args)
    learned = {name: model[names.SCORER_PREFIX + name] for name in layer.parameters}
    w_out, bias = layer.affine(model[names.SCORER_WEIGHT], **learned)
    assert bias is None, layer.name  # layers with a bias were refused by stock_arch
    decoder_in = model[names.DECODER_EMBED]
    if tying_mode(args.tying).decoder and layer.unit_inputs:
        decoder_in = scoring.unit_rows(decoder_in)
    return decoder_in, w_out, model.get(names.SCORER_PROJECTION)


def _matmul(a: Tensor, b: Tensor) -> Tensor:
    """a·b in fp32, in a's dtype."""
    return (a.float() @ b.float()).to(a.dtype)


def _shares_rows(args: Namespace, folded: bool) -> bool:
    """Whether the stock output matrix is the decoder's input lookup (one tensor): the layer
    scores with the input rows, and no projection L was ``folded`` into the output matrix."""
    return (tying_mode(args.tying).decoder and not folded
            and _layer(args).scores_input_rows)


def _bake_decoder(model: dict[str, Tensor], decoder_in: Tensor, w_out: Tensor,
                  tied: bool) -> dict[str, Tensor]:
    """``model`` without the scorer, with the stock input and output matrices (one tensor
    when ``tied``)."""
    new = {k: v for k, v in model.items() if not k.startswith(names.SCORER_PREFIX)}
    new[names.DECODER_EMBED] = decoder_in.clone()
    new[names.OUTPUT_PROJECTION] = new[names.DECODER_EMBED] if tied else w_out.clone()
    return new


def bake(model: dict[str, Tensor], args: Namespace) -> tuple[dict[str, Tensor], dict]:
    """The stock state dict and the sharing flags for a plugin translation model's state dict."""
    decoder_in, w_out, projection = _decoder_matrices(model, args)
    folded = projection is not None
    if folded:  # s = (L h)·W_outᵀ = h·(W_out L)ᵀ
        w_out = _matmul(w_out, projection)
    tied = _shares_rows(args, folded)
    new = _bake_decoder(model, decoder_in, w_out, tied)
    new[names.ENCODER_EMBED] = (new[names.DECODER_EMBED] if tying_mode(args.tying).encoder
                                else model[names.ENCODER_EMBED].clone())
    flags = tying_mode(args.tying).stock_flags(tied)
    return new, flags


def bake_lm(model: dict[str, Tensor], args: Namespace) -> tuple[dict[str, Tensor], dict]:
    """The stock ``transformer_lm`` state dict and config flags for a plugin LM's state dict.

    The decoder computes x ↦ P_out·x (``project_out_dim``, M → H, when H ≠ M), then the
    scorer L (H → K, K the width of the output matrix). With K ≠ M stock builds
    ``project_out_dim`` (M → K) for ``--decoder-output-dim K``: it becomes L·P_out, and the
    output matrix stays V×K (shared with the input rows where the rule allows). With K = M
    stock has no room for L, and it is folded into the output matrix as for translation."""
    decoder_in, w_out, projection = _decoder_matrices(model, args)
    folded = projection is not None and w_out.shape[1] == args.decoder_embed_dim
    if folded:
        w_out = _matmul(w_out, projection)
    tied = _shares_rows(args, folded)
    new = _bake_decoder(model, decoder_in, w_out, tied)
    if projection is not None and not folded:  # K ≠ M: L·P_out is stock's project_out_dim
        out = model.get(names.PROJECT_OUT_DIM)
        new[names.PROJECT_OUT_DIM] = (projection.clone() if out is None
                                      else _matmul(projection, out))
    flags = {"share_decoder_input_output_embed": tied, "decoder_input_dim": decoder_in.shape[1],
             "decoder_output_dim": new[names.OUTPUT_PROJECTION].shape[1]}
    return new, flags


def _plain(value, where: str):
    """``value`` as plain Python (dict, list, str, numbers, None) for weights_only loading."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Namespace):
        value = vars(value)
    if isinstance(value, dict):
        return {str(k): _plain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # numpy / torch scalars
        return value.item()
    raise ExportError(f"cannot store {where} ({type(value).__name__}) in a plain checkpoint")


def stock_cfg(cfg: dict, args: Namespace, flags: dict, arch: str = "transformer",
              config_format: str = "dict") -> dict:
    """The stock cfg; ``namespace``: the model config as the argparse.Namespace fairseq-train
    writes (what CTranslate2's fairseq converter reads), otherwise a plain dict."""
    model = {k: v for k, v in vars(args).items() if k not in PLUGIN_MODEL_KEYS}
    # the pretrained vectors are in the checkpoint: stock fairseq must not read the files again
    model.update(flags, arch=arch, _name=arch, user_dir=None, encoder_embed_path=None,
                 decoder_embed_path=None)
    model["criterion"] = PLUGIN_CRITERIA.get(model.get("criterion"), model.get("criterion"))
    if arch.startswith("transformer_lm"):
        model = _fit_lm_config(model)
    new = {k: v for k, v in cfg.items() if k != "model"}
    new["model"] = model
    if isinstance(new.get("common"), dict):
        new["common"] = {**new["common"], "user_dir": None}
    criterion = new.get("criterion")
    if isinstance(criterion, dict) and criterion.get("_name") in PLUGIN_CRITERIA:
        new["criterion"] = {k: v for k, v in criterion.items() if k not in PLUGIN_CRITERION_KEYS}
        new["criterion"]["_name"] = PLUGIN_CRITERIA[criterion["_name"]]
    new = _plain(new, "cfg")
    if config_format == "namespace":
        new["model"] = Namespace(**new["model"])
    return new


def _fit_lm_config(model: dict) -> dict:
    """``model`` with the types stock transformer_lm's dataclass config requires on load.

    Stock fairseq merges a saved ``transformer_lm`` config into that dataclass. Checkpoints of
    ``transformer_lm_tied`` trained before it took the dataclass's defaults hold fairseq's
    ``base_lm_architecture`` fallback ``base_shuffle=False``, which the dataclass
    (``Optional[int]``) refuses: a bool becomes the int it means; any other mismatch stops
    the export, naming the key."""
    stock = OmegaConf.structured(TransformerLanguageModelConfig)
    fitted = dict(model)
    for key in stock.keys() & model.keys():
        try:
            OmegaConf.merge(stock, {key: model[key]})
        except ValidationError as e:
            if not isinstance(model[key], bool):
                raise ExportError(f"the model config's {key}={model[key]!r} does not fit "
                                  f"fairseq's transformer_lm ({e.msg})") from None
            fitted[key] = int(model[key])
    return fitted


def export(ckpt: Path, out: Path, config_format: str = "dict") -> dict:
    """Write the stock checkpoint for ``ckpt`` to ``out`` (atomically); returns its flags.

    ``config_format`` ``dict`` (default) loads in stock fairseq under torch's
    ``weights_only=True`` with no allowlist; ``namespace`` is fairseq-train's own layout, which
    CTranslate2's ``ct2-fairseq-converter`` needs (it loads with ``--user_dir`` pointing at this
    plugin, whose import allowlists ``argparse.Namespace``)."""
    if not ckpt.is_file():
        raise ExportError(f"checkpoint {ckpt} does not exist")
    state = checkpoints.load(ckpt)
    args = _model_args(state)
    family = stock_arch(args, formats=tuple(PLUGIN_ARCHS))
    if family == "lightconv" and config_format == "dict":
        _check_kernel_lists(args)
    if family == "transformer_lm":
        arch = stock_lm_arch(args.arch)
        model, flags = bake_lm(state["model"], args)
    else:
        arch = family
        model, flags = bake(state["model"], args)
    history = (state.get("optimizer_history") or [{}])[-1]
    plain = {
        "args": None,
        "cfg": stock_cfg(state["cfg"] if isinstance(state.get("cfg"), dict) else {}, args, flags,
                         arch, config_format),
        "model": model,
        "criterion": None,
        "optimizer_history": [{"criterion_name": _criterion_class(history),
                               "optimizer_name": _plain(history.get("optimizer_name"), "opt"),
                               "lr_scheduler_state": {},
                               "num_updates": int(history.get("num_updates", 0))}],
        "task_state": {},
        "extra_state": {"train_iterator": {"epoch": _epoch(state)}},
    }
    def write(tmp: str) -> None:
        torch.save(plain, tmp)
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(tmp)
        if config_format == "namespace":
            unsafe = [g for g in unsafe if g != "argparse.Namespace"]
        if unsafe:
            raise ExportError(f"internal error: the exported checkpoint still needs {unsafe}")

    atomic_write(out, write)
    return {"arch": arch, "output_layer": args.output_layer, "tying": args.tying,
            "tied_projection": bool(args.tied_projection), **flags}


def _criterion_class(history: dict) -> str:
    """The stock criterion class the checkpoint records (fairseq compares it on resuming)."""
    name = history.get("criterion_name")
    name = name if isinstance(name, str) else "CrossEntropyCriterion"
    return PLUGIN_CRITERION_CLASSES.get(name, name)


def _epoch(state: dict) -> int:
    iterator = (state.get("extra_state") or {}).get("train_iterator") or {}
    return int(iterator.get("epoch", 1))
