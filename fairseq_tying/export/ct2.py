"""Export a plugin Transformer checkpoint to a CTranslate2 model directory: a translation
model for ``ctranslate2.Translator``, a language model for ``ctranslate2.Generator``.

The plugin model is built by fairseq from the checkpoint and its dictionaries, then turned into
fairseq's stock module layout in memory, which CTranslate2's own fairseq converter functions
read (``ctranslate2.converters.fairseq``):

- the input embeddings become the rows the model actually looks up (w_i/‖w_i‖ for ``l2norm``);
- the output layer becomes one linear map: its affine map ``s = h·W_outᵀ + b`` taken from
  the decoder's own scorer (``OutputScorer.output_matrix_and_bias``), with the
  ``--tied-projection`` matrix L folded in (W_out·L). A non-zero b (``distance``: −½‖w_i‖²,
  and any learned output bias) becomes the bias of CTranslate2's output projection;
- an element-wise transform of the scores that CTranslate2's decoder applies
  (``OutputLayer.ct2_transform``: ``softcap``'s c·tanh(s/c), its ``final_logit_softcapping``)
  is set on the decoder spec; ``stock_arch`` refuses the others;
- a language model's ``project_in_dim`` and ``project_out_dim`` (``--decoder-input-dim``,
  ``--decoder-output-dim``) are one switch in CTranslate2, both or neither: a lone
  ``project_out_dim`` is folded into the output matrix, and next to a lone ``project_in_dim``
  the output side gets the identity.

The directory also holds the vocabularies, the subword model (``spm.model`` or ``bpe.codes``)
and ``fairseq_tying.json``, which ``python -m fairseq_tying.translate`` reads.
"""

from __future__ import annotations

import json
import shutil
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch
from fairseq import checkpoint_utils, tasks
from torch import Tensor, nn

from fairseq_tying.common.atomic import building_dir
from fairseq_tying.common.extras import require
from fairseq_tying.core import checkpoint_compat
from fairseq_tying.export.stock import ExportError, stock_arch

QUANTIZATIONS = ("none", "int8", "int8_float16", "float16")
FAMILIES = ("transformer", "transformer_lm")  # stock families CTranslate2 reads
META_FILE = "fairseq_tying.json"
SUBWORD_FILES = {"sentencepiece": "spm.model", "subword_nmt": "bpe.codes"}


FOR_WHAT = "python -m fairseq_tying.export --format ctranslate2"


def converters():
    """CTranslate2's fairseq converter functions (the ``serve`` extra)."""
    return require("ctranslate2.converters.fairseq", extra="serve", for_what=FOR_WHAT)


@dataclass(frozen=True)
class Subword:
    """How raw text becomes the model's tokens: ``kind`` in SUBWORD_FILES or ``none``."""

    kind: str
    model: Path | None = None
    detokenizer: str | None = None  # "moses" after subword-nmt (the corpus was Moses-tokenized)


def subword_from_file(path: Path) -> Subword:
    """A sentencepiece model or subword-nmt codes, told apart by whether sentencepiece loads it."""
    if not path.is_file():
        raise ExportError(f"--subword-model {path} does not exist")
    try:
        spm.SentencePieceProcessor(model_file=str(path))
        return Subword("sentencepiece", path)
    except (RuntimeError, OSError):
        return Subword("subword_nmt", path, "moses")


def find_subword(data: Path) -> Subword:
    """The subword model that ``python -m fairseq_tying.data.prepare`` left beside ``data``."""
    prep = data.parent / "prep.json"
    if prep.is_file():
        record = json.loads(prep.read_text())
        kind = record.get("subword")
        model = data.parent / SUBWORD_FILES.get(kind, "")
        if kind in SUBWORD_FILES and model.is_file():
            return Subword(kind, model, record.get("detokenizer"))
        if kind == "word":  # a word-level language-model set reads whitespace-split text
            return Subword("none")
    raise ExportError(f"found no subword model for {data} (no prep.json with spm.model or "
                      "bpe.codes beside it): pass --subword-model FILE (a sentencepiece model or "
                      "subword-nmt codes), or --no-subword if the text is already tokenized")


def load_model(ckpt: Path, data: Path | None):
    """The plugin model (eval mode, no grad), its task and its config."""
    if not ckpt.is_file():
        raise ExportError(f"checkpoint {ckpt} does not exist")
    overrides = {"data": str(data)} if data is not None else None
    with checkpoint_compat.reading(ckpt):
        state = checkpoint_utils.load_checkpoint_to_cpu(str(ckpt), overrides)
    cfg = state["cfg"]
    stock_arch(cfg.model, formats=FAMILIES, allow_bias=True)
    try:
        task = tasks.setup_task(cfg.task)
    except (FileNotFoundError, OSError, ValueError) as e:
        raise ExportError(f"cannot read the dictionaries in {cfg.task.data} ({e}): pass --data "
                          "DIR, the fairseq-preprocess folder the model was trained on") from e
    model = task.build_model(cfg.model)
    model.load_state_dict(state["model"], strict=True, model_cfg=cfg.model)
    model.eval().requires_grad_(False)
    return model, task, cfg


@torch.no_grad()
def output_affine(decoder: nn.Module) -> tuple[Tensor, Tensor | None]:
    """(W, b) with scores = h·Wᵀ + b for the decoder output h (projection folded in);
    b is None when the output layer has no bias or it is zero."""
    scorer = decoder.scorer
    w_out, bias = scorer.output_matrix_and_bias()
    if scorer.projection is not None:  # s = (L h)·W_outᵀ = h·(W_out L)ᵀ
        w_out = w_out.float() @ scorer.projection.weight.float()
    if bias is not None and not bool(bias.any()):
        bias = None
    return w_out.float(), None if bias is None else bias.float()


@torch.no_grad()
def _lookup_table(embedding: nn.Module) -> nn.Embedding:
    """The rows the embedding module returns for every token id, as a plain embedding."""
    rows = embedding(torch.arange(embedding.num_embeddings))
    return nn.Embedding.from_pretrained(rows.float().clone(), padding_idx=embedding.padding_idx)


def to_stock_layout(model: nn.Module) -> bool:
    """Replace the plugin's lookups and scorer with fairseq's stock modules, in place;
    returns whether the output projection has a bias."""
    decoder = model.decoder
    w_out, bias = output_affine(decoder)
    if getattr(model, "encoder", None) is not None:
        model.encoder.embed_tokens = _lookup_table(model.encoder.embed_tokens)
    decoder.embed_tokens = _lookup_table(decoder.embed_tokens)
    if decoder.project_in_dim is None and decoder.project_out_dim is not None:
        w_out = w_out @ decoder.project_out_dim.weight.float()  # s = (W P_out) x
        decoder.project_out_dim = None
    elif decoder.project_in_dim is not None and decoder.project_out_dim is None:
        width = decoder.project_in_dim.weight.shape[0]
        decoder.project_out_dim = _linear(torch.eye(width), None)
    decoder.output_projection = _linear(w_out, bias)
    del decoder.scorer
    return bias is not None


def _linear(weight: Tensor, bias: Tensor | None) -> nn.Linear:
    """A frozen ``nn.Linear`` computing x·weightᵀ (+ bias)."""
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    linear.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        linear.bias = nn.Parameter(bias, requires_grad=False)
    return linear


def build_spec(model: nn.Module, task, cfg):
    """The CTranslate2 model spec, filled by CTranslate2's fairseq converter functions."""
    args = cfg.model
    if stock_arch(args, formats=FAMILIES, allow_bias=True) == "transformer_lm":
        return _lm_spec(model, task, cfg)
    ct2_fairseq = converters()
    spec = ct2_fairseq._get_model_spec(Namespace(**{**vars(args), "arch": "transformer"}))
    ct2_fairseq.set_transformer_encoder(spec.encoder, model.encoder)
    ct2_fairseq.set_transformer_decoder(spec.decoder, model.decoder)
    spec.register_source_vocabulary(ct2_fairseq._get_vocab(task.source_dictionary))
    spec.register_target_vocabulary(ct2_fairseq._get_vocab(task.target_dictionary))
    # fairseq starts decoding from </s> and appends </s> to every source sentence.
    spec.config.decoder_start_token = spec.config.eos_token
    spec.config.add_source_eos = True
    return spec


def _lm_spec(model: nn.Module, task, cfg):
    """A decoder-only spec, as CTranslate2's converter builds it for fairseq's transformer_lm."""
    decoder = model.decoder
    args = Namespace(**{**vars(cfg.model), "arch": "transformer_lm",
                        "decoder_input_dim": decoder.embed_tokens.embedding_dim,
                        "decoder_embed_dim": decoder.embed_dim})
    ct2_fairseq = converters()
    spec = ct2_fairseq._get_model_spec(args)
    ct2_fairseq.set_transformer_decoder(spec.decoder, decoder, with_encoder_attention=False)
    spec.register_vocabulary(ct2_fairseq._get_vocab(task.dictionary))
    if not getattr(cfg.task, "add_bos_token", False):  # fairseq's LM starts from </s>
        spec.config.bos_token = spec.config.eos_token
    return spec


def ct2_transform(scorer: nn.Module) -> dict[str, float]:
    """The decoder-spec attribute that applies the layer's transform t, and its value (its one
    setting: softcap's final_logit_softcapping = c); empty for an affine layer."""
    layer = scorer.layer
    if not layer.transforms:
        return {}
    (value,) = scorer.settings.values()
    return {layer.ct2_transform: value}


def export_ct2(ckpt: Path, out: Path, data: Path | None = None, quantization: str = "none",
               subword: Subword | None = None) -> dict:
    """Write the CTranslate2 model directory for ``ckpt`` to ``out`` (replaced atomically);
    ``subword`` None: found beside the data (``find_subword``)."""
    if quantization not in QUANTIZATIONS:
        raise ExportError(f"--quantization {quantization}: choose from {QUANTIZATIONS}")
    # before the model loads: a missing extra fails fast
    converter = require("ctranslate2.converters.converter", "serve", FOR_WHAT).Converter
    model, task, cfg = load_model(ckpt, data)
    subword = subword if subword is not None else find_subword(Path(cfg.task.data))
    args = cfg.model
    transform = ct2_transform(model.decoder.scorer)
    has_bias = to_stock_layout(model)
    spec = build_spec(model, task, cfg)
    for name, value in transform.items():
        setattr(spec.decoder, name, np.float32(value))

    class _SpecConverter(converter):
        def _load(self):
            return spec

    meta = {"task": cfg.task._name, "source_lang": cfg.task.get("source_lang"),
            "target_lang": cfg.task.get("target_lang"),
            "subword": subword.kind,
            "subword_model": SUBWORD_FILES.get(subword.kind),
            "detokenizer": subword.detokenizer, "arch": args.arch, "tying": args.tying,
            "output_layer": args.output_layer, "tied_projection": bool(args.tied_projection),
            "output_bias": has_bias, "quantization": quantization,
            "checkpoint": str(ckpt.resolve())}
    with building_dir(out) as target:
        # force: the converter refuses an existing folder, even the empty one it is given
        _SpecConverter().convert(str(target), force=True,
                                 quantization=None if quantization == "none" else quantization)
        if subword.model is not None:
            shutil.copyfile(subword.model, target / SUBWORD_FILES[subword.kind])
        (target / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return meta
