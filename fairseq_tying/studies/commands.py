"""``python -m fairseq_tying.studies {answer,collect,study}``: compare evaluated runs. ``answer``
gives "Does it help?" for a sweep's runs (``studies.answer``); ``collect`` lists the scores of
the run folders under a folder, comparing none; ``study`` rebuilds a report from a folder of
records (a study of slurm/studies.yaml by name: ``python -m fairseq_tying.launch study
NAME``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fairseq_tying.studies",
        description="Compare evaluated fairseq_tying runs: tables, paired bootstrap, verdicts "
        "and plots (evaluate one run: python -m fairseq_tying.evaluation).",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    an = sub.add_parser("answer", help="\"Does it help?\" for a sweep's runs: the verdicts, the "
                        "claims and the tables of the README's answer, for your own data")
    an.add_argument("sweep", type=Path, metavar="SWEEP", help="the sweep file the runs came from")
    an.add_argument("--runs", type=Path, help="the run folders (default: the sweep's output_dir)")
    an.add_argument("--out", type=Path, help="where the answer goes (default: answers/NAME)")
    an.add_argument("--references", type=Path, help="the test references the runs were scored "
                    "on (default: the data dir's raw/test.TGT)")
    an.add_argument("--bootstrap-samples", type=int, metavar="B",
                    help="resamples of the paired bootstrap (default: enough for the Holm "
                    "family of the sweep's claims, verdicts.resamples)")
    an.add_argument("--records-only", action="store_true", help="read no run folder: the "
                    "answer of the records already in OUT/records (e.g. committed ones)")
    an.add_argument("--report", type=Path, help="also write the answer into this Markdown "
                    "file's <!-- BLOCK:begin --> ... <!-- BLOCK:end --> block")
    an.add_argument("--block", default="answer", help="the --report block (default: answer)")
    an.add_argument("--beside", nargs=2, action="append", default=[],
                    metavar=("SUMMARY", "NAME"), help="another study's summary.json and its "
                    "name (repeatable): each comparison both make, its Δ and finding there and "
                    "here and the change (e.g. with more data, at another learning rate)")

    co = sub.add_parser("collect", help="the scores of the evaluated runs under a folder "
                        "(mean ± CI per method, each run, a plot); no Δ or p: a sweep's "
                        "comparisons are its answer's")
    co.add_argument("runs_root", metavar="RUNS_ROOT", help="searched recursively for eval.json")
    co.add_argument("--out", required=True, help="output folder")

    st = sub.add_parser("study", help="a study's report from a folder of records: tables, "
                        "plots (a study of slurm/studies.yaml: python -m fairseq_tying.launch "
                        "study NAME)")
    st.add_argument("--runs", help="export records of newly evaluated runs under RUNS first")
    st.add_argument("--records", required=True, help="folder of the study's JSON records")
    st.add_argument("--report", required=True, help="Markdown report; the tables replace its "
                    "<!-- BLOCK:begin --> ... <!-- BLOCK:end --> block (see --block)")
    st.add_argument("--plots", required=True, help="folder for the PNGs and summary.json")
    st.add_argument("--references", help="reference file (default: the embedded Bible test.en)")
    st.add_argument("--bootstrap-samples", type=int, metavar="B",
                    help="paired bootstrap resamples (default: enough for the study's family "
                    "of tests, at least 20·m/α)")
    st.add_argument("--block", default="study", help="name of the report's marked block: "
                    "<!-- BLOCK:begin --> ... <!-- BLOCK:end --> (default: study)")
    st.add_argument("--view", default="auto", help="how the records are reported: "
                    "translation, equal, lm or does_it_help (default auto: lm for language-model "
                    "records, else translation)")
    st.add_argument("--expected-runs", type=int, metavar="N", help="the number of runs of the "
                    "study's sweep: the block starts with how many of them are recorded, and "
                    "may have no record yet")
    st.add_argument("--without-row-norms", action="store_true",
                    help="with --runs: export runs whose evaluated checkpoint is not on this "
                    "machine (e.g. trained on a GPU machine and brought back without "
                    "checkpoints); their records hold output_row_norms: null, and no norm "
                    "histogram shows them")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # imported once a command runs: their plots import matplotlib (1 s), kept off --help
    from fairseq_tying.studies.collect import collect
    from fairseq_tying.studies.views.report import Target, build, references

    if args.command == "answer":
        from fairseq_tying.studies.answer import answer

        try:
            return answer(args.sweep, args.runs, args.out, args.references,
                          args.bootstrap_samples, args.records_only, args.report, args.block,
                          [(Path(summary), name) for summary, name in args.beside])
        except (FileNotFoundError, ValueError, KeyError, RuntimeError) as e:
            print(f"error: answer: {e}", file=sys.stderr)
            return 2
    try:
        if args.command == "collect":
            done = collect(args.runs_root, args.out)
            print(done["markdown"])
            print(f"wrote {args.out}/results.md, results.json, bleu.png")
        elif args.command == "study":
            done = build(args.records, [Target(args.report, args.block, args.view)],
                         args.plots, references(args.references), args.runs,
                         args.bootstrap_samples, args.expected_runs, not args.without_row_norms)
            print(done["markdown"])
            print(f"{len(done['exported'])} new record(s), {done['records']} in all; wrote "
                  + ", ".join(done["written"]))
    except (FileNotFoundError, ValueError, KeyError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
