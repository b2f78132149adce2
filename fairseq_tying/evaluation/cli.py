"""``python -m fairseq_tying.evaluation {evaluate,evaluate-lm,norms,average}``: one run (or its
checkpoints) at a time; runs are compared by ``python -m fairseq_tying.studies``."""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections.abc import Sequence

from fairseq_tying.common import LM_TASK
from fairseq_tying.common.eval_options import EvalOptions, LMEvalOptions, TranslationEvalOptions
from fairseq_tying.evaluation.average import average_checkpoints
from fairseq_tying.evaluation.norms import norms_report
from fairseq_tying.evaluation.presets import PRESET_CHOICES


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fairseq_tying.evaluation",
        description="Evaluate a fairseq_tying run: translate and score it with sacrebleu, "
        "or score a language model's perplexity (compare runs: python -m "
        "fairseq_tying.studies).",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    add_evaluate_arguments(sub.add_parser("evaluate", help="generate with fairseq-generate and "
                                          "score one run"))
    add_evaluate_lm_arguments(sub.add_parser("evaluate-lm", help="test perplexity of one "
                                             "language-model run with fairseq-eval-lm"))

    no = sub.add_parser("norms", help="histogram of the tied matrix's row norms")
    no.add_argument("checkpoints", nargs="+", metavar="CKPT")
    no.add_argument("--out", required=True, help="PNG file to write")
    no.add_argument("--labels", nargs="+", help="one legend label per checkpoint")
    no.add_argument("--key", help="state dict key of the matrix (default: output projection)")
    no.add_argument("--keep-special", action="store_true",
                    help="include the rows of <s>, <pad>, </s>, <unk>")
    no.add_argument("--bins", type=int, default=50)

    av = sub.add_parser("average", help="average checkpoints' parameters into one file")
    av.add_argument("checkpoints", nargs="+", metavar="CKPT")
    av.add_argument("--out", required=True)
    return parser


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


COMMANDS = ("evaluate", "evaluate-lm", "norms", "average")
# across runs: python -m fairseq_tying.studies COMMAND
STUDIES_COMMANDS = ("collect", "study")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in STUDIES_COMMANDS:
        print(f"error: {argv[0]} compares runs; run it as: python -m fairseq_tying.studies "
              f"{shlex.join(argv)}", file=sys.stderr)
        return 2
    if argv and argv[0] not in COMMANDS and not argv[0].startswith("-"):
        argv.insert(0, "evaluate")  # `python -m fairseq_tying.evaluation RUN_DIR ...`
    args = build_parser().parse_args(argv)
    try:
        if args.command == "evaluate":
            # imported when it runs: sacremoses (0.7 s) is kept off --help
            from fairseq_tying.evaluation.evaluate import evaluate_run, summary_lines

            run_dir, opts = options(args)
            print("\n".join(summary_lines(evaluate_run(run_dir, opts.data, **opts.keywords()))))
        elif args.command == "evaluate-lm":
            # imported when it runs: sacremoses (0.7 s, through evaluate) is kept off --help
            from fairseq_tying.evaluation.perplexity import evaluate_lm_run, summary_lines

            run_dir, opts = options(args)
            print("\n".join(summary_lines(evaluate_lm_run(run_dir, opts.data,
                                                           **opts.keywords()))))
        elif args.command == "norms":
            print(norms_report(args.checkpoints, args.out, args.labels, args.key,
                               args.keep_special, args.bins))
            print(f"wrote {args.out}")
        elif args.command == "average":
            print(f"wrote {average_checkpoints(args.checkpoints, args.out)}")
    except (FileNotFoundError, ValueError, KeyError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
