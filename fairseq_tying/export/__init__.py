"""Export a plugin checkpoint for serving.

``python -m fairseq_tying.export CKPT OUT [--format {fairseq,ctranslate2}]``:

- ``fairseq`` (default): a stock fairseq checkpoint (``transformer`` or ``lightconv`` for the
  translation models, ``transformer_lm{,_big,_gpt}`` for the language models) with the output
  layer baked in; stock ``fairseq-generate`` / ``fairseq-eval-lm`` load it without
  ``--user-dir`` (``fairseq_tying.export.stock``);
- ``ctranslate2`` (Transformer translation models and language models): a CTranslate2 model
  directory with the vocabularies, the subword model and every output layer, ``distance`` and
  ``--output-bias`` included (the bias becomes CTranslate2's output bias);
  ``python -m fairseq_tying.translate --model OUT`` translates raw text with a translation
  model, and ``ctranslate2.Generator(OUT)`` scores or continues text with a language model
  (``fairseq_tying.export.ct2``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fairseq_tying.common import LM_TASK
from fairseq_tying.common.extras import MissingExtra
from fairseq_tying.core.checkpoint_compat import UnreadableCheckpoint
from fairseq_tying.export.ct2 import QUANTIZATIONS, Subword, export_ct2, subword_from_file
from fairseq_tying.export.stock import (
    CONFIG_FORMATS,
    ExportError,
    _check,
    bake,
    export,
    stock_arch,
    stock_cfg,
)

FORMATS = ("fairseq", "ctranslate2")

__all__ = ["CONFIG_FORMATS", "FORMATS", "ExportError", "_check", "bake", "export", "main",
           "stock_arch", "stock_cfg"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fairseq_tying.export",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("ckpt", type=Path, help="checkpoint of a transformer_{dwt,twwt}*, "
                   "dynamicconv_{dwt,twwt}* or transformer_lm_tied* model")
    p.add_argument("out", type=Path, help="the stock fairseq checkpoint (file) or the "
                                          "CTranslate2 model (directory) to write")
    p.add_argument("--format", choices=FORMATS, default="fairseq",
                   help="fairseq: stock fairseq checkpoint (every model; not the distance "
                        "output layer nor --output-bias); ctranslate2: Transformer translation "
                        "and language models, every output layer")
    p.add_argument("--config-format", choices=CONFIG_FORMATS, default="dict",
                   help="fairseq format: the model config as a plain dict (loads in stock "
                        "fairseq with no allowlist) or as fairseq-train's argparse.Namespace "
                        "(what ct2-fairseq-converter reads)")
    p.add_argument("--quantization", choices=QUANTIZATIONS, default="none",
                   help="ctranslate2 format: weight type of the saved model")
    p.add_argument("--data", type=Path, help="ctranslate2 format: the fairseq-preprocess folder "
                   "with the dictionaries (default: the one the model was trained on)")
    p.add_argument("--subword-model", type=Path, help="ctranslate2 format: the sentencepiece "
                   "model or subword-nmt codes to carry (default: found beside --data, as "
                   "python -m fairseq_tying.data.prepare leaves it)")
    p.add_argument("--no-subword", action="store_true",
                   help="ctranslate2 format: the model reads already tokenized text")
    return p


def _fairseq_only(opts: argparse.Namespace) -> None:
    for flag, given in (("--quantization", opts.quantization != "none"),
                        ("--data", opts.data is not None),
                        ("--subword-model", opts.subword_model is not None),
                        ("--no-subword", opts.no_subword)):
        if given:
            raise ExportError(f"{flag} applies to --format ctranslate2 only")


def run(opts: argparse.Namespace) -> str:
    """Export as ``opts`` says; returns the summary line."""
    if opts.format == "fairseq":
        _fairseq_only(opts)
        info = export(opts.ckpt, opts.out, opts.config_format)
        flags = ", ".join(f"{k}={v}" for k, v in info.items() if k != "arch")
        load = ("load it without --user-dir" if opts.config_format == "dict" else
                "load it with --user-dir fairseq_tying (which allowlists argparse.Namespace)")
        return f"wrote {opts.out} (arch {info['arch']}; {flags}); {load}"

    if opts.config_format != "dict":
        raise ExportError("--config-format applies to --format fairseq only")
    if opts.no_subword and opts.subword_model is not None:
        raise ExportError("--no-subword and --subword-model exclude each other")
    subword = Subword("none") if opts.no_subword else (
        subword_from_file(opts.subword_model) if opts.subword_model else None)
    meta = export_ct2(opts.ckpt, opts.out, opts.data, opts.quantization, subword)
    use = (f"score or generate with ctranslate2.Generator('{opts.out}')"
           if meta["task"] == LM_TASK else
           f"translate with python -m fairseq_tying.translate --model {opts.out}")
    return (f"wrote CTranslate2 model {opts.out} (output layer {meta['output_layer']}, "
            f"output bias {meta['output_bias']}, quantization {meta['quantization']}, "
            f"subword {meta['subword']}); {use}")


def main(argv: list[str] | None = None) -> int:
    opts = parser().parse_args(argv)
    try:
        print(run(opts))
    except (ExportError, UnreadableCheckpoint, MissingExtra) as e:
        print(f"error: cannot export {opts.ckpt}: {e}", file=sys.stderr)
        return 2
    return 0
