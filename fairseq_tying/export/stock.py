"""Bake a plugin checkpoint into a plain fairseq checkpoint: ``transformer_{dwt,twwt}*`` into
fairseq's ``transformer``, ``dynamicconv_{dwt,twwt}*`` into fairseq's ``lightconv``.

``python -m fairseq_tying.export CKPT OUT`` writes the output layer into the matrices of
fairseq's stock model, so that ``fairseq-generate`` loads OUT without ``--user-dir`` and
produces the same hypotheses (both stock decoders score with ``output_projection``):

- every output layer is the affine map ``s = h·W_outᵀ + b`` (``scoring.output_matrix_and_bias``);
  ``W_out`` (times the ``--tied-projection`` matrix L, giving a V×H matrix) becomes
  ``decoder.output_projection.weight``. An output layer with a bias (``distance``: −½‖w_i‖²) or a
  learned output bias (``--output-bias``) has no stock equivalent: the export stops with an
  error and writes nothing;
- ``l2norm`` input lookups use w_i/‖w_i‖: the normalized rows are written into the embeddings;
- where the decoder's input and output rows now differ (cosine, sqnorm, any projection) the
  output matrix is untied (``share_decoder_input_output_embed=False``, and
  ``share_all_embeddings=False`` with the encoder keeping its own copy of the input rows).

The checkpoint holds only plain Python values besides tensors (the model config as a dict, no
``argparse.Namespace``, no numpy, no optimizer state), so torch >= 2.6 loads it with
``weights_only=True`` and no allowlist. ``--config-format namespace`` stores the model config
as fairseq-train does (an ``argparse.Namespace``), the layout CTranslate2's converter reads.
It is an inference checkpoint: to train from it, pass
``--reset-optimizer``.
"""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

import torch
from torch import Tensor

from fairseq_tying.common import checkpoints
from fairseq_tying.common.atomic import atomic_write
from fairseq_tying.core import scoring

PLUGIN_MODEL_KEYS = ("tying", "output_layer", "tied_projection", "tied_embed_dim", "output_bias",
                     "freeze_embeddings")
PLUGIN_CRITERIA = {"label_smoothed_cross_entropy_pr": "label_smoothed_cross_entropy"}
PLUGIN_CRITERION_KEYS = ("projection_reg",)
STOCK_FAMILIES = {"transformer": "transformer", "lightconv": "dynamicconv"}  # stock: plugin
CONFIG_FORMATS = ("dict", "namespace")


class ExportError(ValueError):
    """The checkpoint cannot be expressed as a stock fairseq transformer."""


def _model_args(state: dict) -> Namespace:
    args = checkpoints.model_args(state)
    if not isinstance(args, Namespace):
        raise ExportError("the checkpoint has no model configuration (cfg['model']); is it a "
                          "fairseq checkpoint written by fairseq-train?")
    return args


def stock_arch(args: Namespace, formats: tuple[str, ...] = ("transformer", "lightconv"),
               allow_bias: bool = False) -> str:
    """The stock fairseq model (``transformer`` or ``lightconv``) the checkpoint maps to.

    Refuses, naming the flag, what the target cannot express: another family, a bias in the
    scores (``distance``, ``--output-bias``) unless ``allow_bias`` (CTranslate2 has an output
    bias, fairseq's models have none), and a tied matrix narrower than the decoder."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    from fairseq_tying.core.models.dynamicconv_tying import DynamicConvModel
    from fairseq_tying.core.models.transformer_tying import TiedTransformerModel

    arch = getattr(args, "arch", None)
    family = {TiedTransformerModel: "transformer", DynamicConvModel: "lightconv"}.get(
        ARCH_MODEL_REGISTRY.get(arch))
    if family not in formats:
        plugin = " or ".join(f"{STOCK_FAMILIES[f]}_{{dwt,twwt}}*" for f in formats)
        raise ExportError(f"--arch {arch} is not one of the plugin's {plugin} architectures: "
                          f"only those are exported to {' / '.join(formats)}")
    output_layer = args.output_layer
    if output_layer == "distance" and not allow_bias:
        raise ExportError(f"--output-layer distance adds a per-token bias −½‖w_i‖² to the "
                          f"scores, which fairseq's {family} (a bias-free output projection) "
                          "cannot express; keep using this checkpoint with --user-dir "
                          "fairseq_tying"
                          + (", or export with --format ctranslate2"
                             if family == "transformer" else ""))
    if getattr(args, "output_bias", False) and not allow_bias:
        raise ExportError("--output-bias adds a learned per-token bias b₂ to the scores, which "
                          "fairseq's stock models (a bias-free output projection) cannot "
                          "express; export with --format ctranslate2, or keep using this "
                          "checkpoint with --user-dir fairseq_tying")
    tied_dim = getattr(args, "tied_embed_dim", None)
    if tied_dim and tied_dim != args.decoder_embed_dim:
        raise ExportError(f"--tied-embed-dim {tied_dim} differs from --decoder-embed-dim "
                          f"{args.decoder_embed_dim}: the exported {family} has no decoder "
                          "input projection for a narrower embedding")
    return family


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


def bake(model: dict[str, Tensor], args: Namespace) -> tuple[dict[str, Tensor], dict]:
    """The stock state dict and the sharing flags for a plugin transformer's state dict."""
    output_layer, tying = args.output_layer, args.tying
    weight = model["decoder.scorer.weight"]
    projection = model.get("decoder.scorer.projection.weight")
    w_out, bias = scoring.output_matrix_and_bias(output_layer, weight)
    assert bias is None, output_layer  # layers with a bias were refused by stock_arch
    if projection is not None:  # s = (L h)·W_outᵀ = h·(W_out L)ᵀ
        w_out = (w_out.float() @ projection.float()).to(weight.dtype)
    normalize_inputs = tying != "none" and output_layer in scoring.NORMALIZED_INPUT_LAYERS
    decoder_in = model["decoder.embed_tokens.weight"]
    if normalize_inputs:
        decoder_in = scoring.unit_rows(decoder_in)
    encoder_in = decoder_in if tying == "three_way" else model["encoder.embed_tokens.weight"]
    tied_output = tying != "none" and projection is None and output_layer in ("dot", "l2norm")
    new = {k: v for k, v in model.items() if not k.startswith("decoder.scorer.")}
    new["encoder.embed_tokens.weight"] = encoder_in.clone()
    new["decoder.embed_tokens.weight"] = decoder_in.clone()
    new["decoder.output_projection.weight"] = (decoder_in if tied_output else w_out).clone()
    flags = {"share_all_embeddings": tying == "three_way" and tied_output,
             "share_decoder_input_output_embed": tied_output}
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


def export(ckpt: Path, out: Path, config_format: str = "dict") -> dict:
    """Write the stock checkpoint for ``ckpt`` to ``out`` (atomically); returns its flags.

    ``config_format`` ``dict`` (default) loads in stock fairseq under torch's
    ``weights_only=True`` with no allowlist; ``namespace`` is fairseq-train's own layout, which
    CTranslate2's ``ct2-fairseq-converter`` needs (it loads with ``--user_dir`` pointing at this
    plugin, whose import allowlists ``argparse.Namespace``)."""
    import fairseq_tying  # noqa: F401  (registers the archs; allowlists fairseq checkpoints)

    if not ckpt.is_file():
        raise ExportError(f"checkpoint {ckpt} does not exist")
    state = checkpoints.load(ckpt)
    args = _model_args(state)
    arch = stock_arch(args)
    if arch == "lightconv" and config_format == "dict":
        _check_kernel_lists(args)
    model, flags = bake(state["model"], args)
    history = (state.get("optimizer_history") or [{}])[-1]
    plain = {
        "args": None,
        "cfg": stock_cfg(state["cfg"] if isinstance(state.get("cfg"), dict) else {}, args, flags,
                         arch, config_format),
        "model": model,
        "criterion": None,
        "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion",
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


def _epoch(state: dict) -> int:
    iterator = (state.get("extra_state") or {}).get("train_iterator") or {}
    return int(iterator.get("epoch", 1))
