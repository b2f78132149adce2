"""``python -m fairseq_tying.launch slurm/SWEEP.yaml [--dry-run | --local [--workers N]
[--no-start-after MIN]] [--only PATTERN] [--skip-recorded DIR]``: one sweep file."""

from __future__ import annotations

import argparse
import fnmatch
import os
import sys
from pathlib import Path

from fairseq_tying.common.reproducible import pinned_env
from fairseq_tying.launch.config import Run, SweepError, load_sweep
from fairseq_tying.launch.continuation import check_sources
from fairseq_tying.launch.job import RunBusy
from fairseq_tying.launch.submit import Stopped, dry_run, record, run_local, submit_slurm
from fairseq_tying.studies.record import Record


def recorded_stops(records: Path, runs: list[Run]) -> list[int]:
    """The stop epochs (``train.stop.epoch``) in the study records of these runs."""
    stops = []
    for run in runs:
        path = records / f"{run.name}.json"
        if path.is_file():
            train = Record.load(path, hypotheses=False).train
            if train is not None and train.stop is not None:
                stops.append(train.stop.epoch)
    return stops


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="python -m fairseq_tying.launch",
                                     description="Launch a sweep of fairseq runs with submitit.")
    parser.add_argument("sweep", type=Path,
                        help="sweep file (YAML), e.g. slurm/iwslt_transformer.yaml")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true",
                      help="print the sbatch parameters and commands, submit nothing")
    mode.add_argument("--local", action="store_true",
                      help="run the jobs on this machine without SLURM")
    parser.add_argument("--only", metavar="PATTERN", action="append",
                        help="only runs whose name matches this glob (repeatable)")
    parser.add_argument("--output-dir", type=Path, help="override the sweep's output_dir")
    parser.add_argument("--workers", type=int, default=1,
                        help="with --local: runs side by side (default 1)")
    parser.add_argument("--skip-recorded", type=Path, metavar="DIR",
                        help="skip runs that have a study record DIR/NAME.json (finished and "
                        "exported, e.g. on another machine)")
    parser.add_argument("--no-start-after", type=float, metavar="MIN",
                        help="with --local: start or resume no run after MIN minutes (those "
                        "left are trained by the next call), e.g. on a machine that is yours "
                        "for a limited time")
    args = parser.parse_args(argv)
    os.environ.update(pinned_env())  # inherited by local jobs and by sbatch (--export=ALL)
    if args.workers < 1 or (args.workers > 1 and not args.local):
        parser.error("--workers: a positive number, and only with --local")
    if args.no_start_after is not None and (args.no_start_after < 0 or not args.local):
        parser.error("--no-start-after: minutes (>= 0), and only with --local")
    try:
        sweep = load_sweep(args.sweep, args.output_dir, check_data=not args.dry_run)
        runs = sweep.runs
        if args.only:
            runs = [r for r in runs if any(fnmatch.fnmatch(r.name, p) for p in args.only)]
            if not runs:
                raise SweepError(f"--only {args.only}: no run matches; runs are: "
                                 + ", ".join(r.name for r in sweep.runs))
        stops: list[int] = []
        if args.skip_recorded:
            stops = recorded_stops(args.skip_recorded, runs)
            runs = [r for r in runs if not (args.skip_recorded / f"{r.name}.json").is_file()]
        check_sources(sweep, runs)  # a refused continue_from stops the sweep before it starts
        if args.dry_run:
            dry_run(sweep, runs)
            return 0
        sub = (run_local(sweep, runs, args.workers, stops, args.no_start_after) if args.local
               else submit_slurm(sweep, runs))
        record(sweep, sub)
    except Stopped as err:
        print(f"{args.sweep}: {err}", file=sys.stderr)
        return 130
    except (SweepError, RunBusy) as err:
        print(f"error: {args.sweep}: {err}", file=sys.stderr)
        return 2
    return 0

