"""How one run is evaluated: the options of ``python -m fairseq_tying.evaluation evaluate`` and
``evaluate-lm`` without RUN_DIR, the flags that give them (:func:`evaluate_options`: what a
sweep's ``evaluation.args`` become when the sweep is read, passed to the evaluation job as they
are) and the beam search presets ``--preset`` names. Here, not in ``evaluation``, so that
reading a sweep file loads no evaluation code."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from fairseq_tying.common import LM_TASK


@dataclass(frozen=True)
class EvalOptions:
    """How one run is evaluated (the flags but RUN_DIR): ``data`` and the keyword arguments
    of the evaluation function; what every evaluation of a run takes."""

    data: str | None = None  # None: the data_dir in RUN_DIR/run.json
    subset: str = "test"
    checkpoint: str | None = None
    average_last: int | None = None
    cpu: bool = False
    user_dir: str | None = None
    tag: str | None = None

    def keywords(self) -> dict[str, Any]:
        """The keyword arguments of the evaluation function (all but ``data``)."""
        return {k: v for k, v in asdict(self).items() if k != "data"}


@dataclass(frozen=True)
class TranslationEvalOptions(EvalOptions):
    """``evaluate``'s options: those of ``evaluate_run``."""

    preset: str = "auto"
    beam: int | None = None
    lenpen: float | None = None
    batch_size: int | None = 64
    max_tokens: int | None = None


@dataclass(frozen=True)
class LMEvalOptions(EvalOptions):
    """``evaluate-lm``'s options: those of ``evaluate_lm_run``."""

    max_tokens: int = 4096


# ---- the beam search presets of the normalization paper, picked by architecture name


@dataclass(frozen=True)
class Preset:
    name: str
    beam: int
    lenpen: float


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("transformer_wmt", beam=4, lenpen=0.6),
        Preset("transformer_iwslt", beam=5, lenpen=1.0),
        Preset("dynamicconv_wmt", beam=5, lenpen=0.5),
        Preset("dynamicconv_iwslt", beam=4, lenpen=1.0),
    )
}
PRESET_CHOICES = ("auto", *PRESETS)


def preset_for_arch(arch: str) -> Preset:
    """``wmt``/``big`` in the name: WMT preset, else IWSLT; dynamicconv/lightconv: DynamicConv."""
    name = arch.lower()
    family = "dynamicconv" if ("dynamicconv" in name or "lightconv" in name) else "transformer"
    setting = "wmt" if ("wmt" in name or "big" in name) else "iwslt"
    return PRESETS[f"{family}_{setting}"]


def resolve_preset(preset: str, arch: str | None) -> Preset:
    if preset != "auto":
        if preset not in PRESETS:
            raise ValueError(f"--preset {preset!r} is unknown; choose one of {PRESET_CHOICES}")
        return PRESETS[preset]
    if not arch:
        raise ValueError("--preset auto needs the checkpoint's arch name; pass --preset explicitly")
    return preset_for_arch(arch)


# ---- the flags that give the options: the evaluation's, a sweep's evaluation.args


def _add_run_arguments(parser: argparse.ArgumentParser, data_help: str) -> None:
    """The flags every evaluation of one run has: which run, data, subset and checkpoint."""
    parser.add_argument("run_dir", metavar="RUN_DIR", help="folder with the run's checkpoints")
    parser.add_argument("--data", help=f"{data_help}; default: the data_dir in RUN_DIR/run.json")
    parser.add_argument("--subset", default="test", help="subset to evaluate (default: test)")
    parser.add_argument("--checkpoint", help="checkpoint file (default: checkpoint_best.pt, "
                        "else checkpoint_last.pt)")
    parser.add_argument("--average-last", type=int, metavar="N",
                        help="evaluate the average of the last N epoch/update checkpoints")
    parser.add_argument("--cpu", action="store_true", help="evaluate on the CPU")
    parser.add_argument("--user-dir", help="fairseq plugin dir (default: this package)")
    parser.add_argument("--tag", type=_tag, help="name of this evaluation: writes eval.TAG.json "
                        "beside the untagged one (e.g. --tag best)")


def add_evaluate_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``evaluate`` (also what a translation sweep's ``evaluation.args`` may hold)."""
    _add_run_arguments(parser, "prepared data dir (raw/, bin/, prep.json)")
    parser.add_argument("--preset", default="auto", choices=PRESET_CHOICES,
                        help="beam/lenpen preset; auto picks it from the checkpoint's arch")
    parser.add_argument("--beam", type=int, help="override the preset's beam size")
    parser.add_argument("--lenpen", type=float, help="override the preset's length penalty")
    parser.add_argument("--batch-size", type=int, default=TranslationEvalOptions.batch_size,
                        help="sentences per batch")
    parser.add_argument("--max-tokens", type=int, help="tokens per batch (instead of sentences)")


def add_evaluate_lm_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``evaluate-lm`` (also what a language-model sweep's ``evaluation.args``
    may hold)."""
    _add_run_arguments(parser, "data dir made by `prepare --lm` (or its bin/)")
    parser.add_argument("--max-tokens", type=int, default=LMEvalOptions.max_tokens,
                        help=f"tokens per batch (default {LMEvalOptions.max_tokens})")


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str):  # a ValueError for the caller instead of sys.exit
        raise ValueError(f"{self.prog}: {message}")


def options(args: argparse.Namespace) -> tuple[str, EvalOptions]:
    """RUN_DIR and the options of a parsed ``evaluate`` or ``evaluate-lm`` command line."""
    given = {k: v for k, v in vars(args).items() if k not in ("command", "run_dir")}
    lm = getattr(args, "command", None) == "evaluate-lm" or "preset" not in given
    return args.run_dir, (LMEvalOptions if lm else TranslationEvalOptions)(**given)


def evaluate_options(args: Sequence[str], task: str = "translation") -> EvalOptions:
    """The options of a translation run's evaluation (for ``task`` language_modeling: a
    language model's) from its flags without RUN_DIR, e.g. a sweep's ``evaluation.args`` such
    as ``["--average-last", "5"]``; a ValueError names a flag it does not take."""
    parser = _RaisingParser(prog="evaluation.args", add_help=False)
    if task == LM_TASK:
        add_evaluate_lm_arguments(parser)
    else:
        add_evaluate_arguments(parser)
    return options(parser.parse_args(["RUN_DIR", *args]))[1]


def _tag(value: str) -> str:
    if not re.fullmatch(r"[a-z][a-z0-9_]*", value):
        raise argparse.ArgumentTypeError(f"{value!r}: use lower-case letters, digits and _")
    return value
