"""``python -m fairseq_tying.evaluation {evaluate,evaluate-lm,norms,average}``: one run (or its
checkpoints) at a time; runs are compared by ``python -m fairseq_tying.studies``."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence

from fairseq_tying.common.eval_options import (
    add_evaluate_arguments,
    add_evaluate_lm_arguments,
    options,
)
from fairseq_tying.evaluation.average import average_checkpoints
from fairseq_tying.evaluation.norms import norms_report


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
