"""``python -m fairseq_tying.launch slurm/SWEEP.yaml [--dry-run | --local [--workers N]
[--no-start-after MIN]] [--only PATTERN] [--skip-recorded DIR] [--restart-changed]``: one
sweep file, planned (``plan.py``), then carried out.

A program (a study, ``launch.studies``) calls :func:`launch` with the loaded sweep and a
:class:`Launch`; the command line is a parser over it."""

from __future__ import annotations

import argparse
import fnmatch
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fairseq_tying.common.reproducible import pinned_environ
from fairseq_tying.launch.job import RunBusy
from fairseq_tying.launch.local import Signalled, Stopped, run_local, stoppable
from fairseq_tying.launch.plan import make_plan
from fairseq_tying.launch.submit import dry_run, record, submit_slurm
from fairseq_tying.studies.records.record import Record
from fairseq_tying.sweeps.config import Run, Sweep, SweepError, check_data, load_sweep

MODES = ("slurm", "local", "dry_run")


@dataclass(frozen=True)
class Launch:
    """How a sweep's runs are launched: ``mode`` (SLURM arrays, ``local`` jobs on this machine,
    or a ``dry_run`` that prints them), ``only`` the runs whose names match one of these globs,
    ``workers`` local runs side by side, none started after ``no_start_after`` minutes (local),
    those with a study record in ``skip_recorded`` left out, and the runs trained with other
    settings than the sweep's started afresh with ``restart_changed`` (else refused)."""

    mode: str = "slurm"
    only: tuple[str, ...] = ()
    workers: int = 1
    skip_recorded: Path | None = None
    no_start_after: float | None = None
    restart_changed: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise SweepError(f"mode {self.mode!r}: expected one of {', '.join(MODES)}")
        if self.workers < 1 or (self.workers > 1 and self.mode != "local"):
            raise SweepError("--workers: a positive number, and only with --local")
        if self.no_start_after is not None and (self.no_start_after < 0
                                                or self.mode != "local"):
            raise SweepError("--no-start-after: minutes (>= 0), and only with --local")


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


def selected(sweep: Sweep, only: Sequence[str]) -> list[Run]:
    """The runs whose name matches one of the globs ``only`` (all without one)."""
    if not only:
        return list(sweep.runs)
    runs = [r for r in sweep.runs if any(fnmatch.fnmatch(r.name, p) for p in only)]
    if not runs:
        raise SweepError(f"--only {list(only)}: no run matches; runs are: "
                         + ", ".join(r.name for r in sweep.runs))
    return runs


def launch(sweep: Sweep, how: Launch) -> int:
    """Launch the sweep's runs as ``how`` says; 0, 2 after an error (printed, naming the sweep
    file), 130 when the local launcher was stopped."""
    with pinned_environ():  # inherited by local jobs and by sbatch (--export=ALL)
        return _launch(sweep, how)


def _launch(sweep: Sweep, how: Launch) -> int:
    """Two stages: the plan, from the sweep and the run folders alone (printed by a dry run;
    a refused run refuses the launch before anything starts), then its execution."""
    try:
        with stoppable():
            if how.mode != "dry_run":
                check_data(sweep)
            runs = selected(sweep, how.only)
            plan = make_plan(sweep, runs, how.restart_changed, how.skip_recorded)
            if how.mode == "dry_run":
                dry_run(plan)
                plan.check()
                return 0
            plan.check()
            print(plan.show(), file=sys.stderr)
            stops = recorded_stops(how.skip_recorded, runs) if how.skip_recorded else []
            sub = (run_local(plan, how.workers, stops, how.no_start_after)
                   if how.mode == "local" else submit_slurm(plan))
            record(sweep, sub)
    except Stopped as err:
        print(f"{sweep.path}: {err}", file=sys.stderr)
        return 130
    except (KeyboardInterrupt, Signalled) as stop:  # before or between the jobs: nothing runs
        why = "Ctrl-C" if isinstance(stop, KeyboardInterrupt) else str(stop)
        print(f"{sweep.path}: stopped by {why}; the same command goes on from the run folders",
              file=sys.stderr)
        return 130
    except (SweepError, RunBusy) as err:
        print(f"error: {sweep.path}: {err}", file=sys.stderr)
        return 2
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fairseq_tying.launch",
                                     description="Launch a sweep of fairseq runs with submitit.")
    parser.add_argument("sweep", type=Path,
                        help="sweep file (YAML), e.g. slurm/iwslt_transformer.yaml")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true",
                      help="print the plan (what the launch does to each run: train, resume, "
                      "continue, evaluate, skip, refuse) and the sbatch parameters and "
                      "commands; submit nothing")
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
    parser.add_argument("--restart-changed", action="store_true",
                        help="start afresh the runs whose folder was trained with other "
                        "settings than the sweep's (training arguments, budget, data), which "
                        "are refused without it: each such folder is moved whole to "
                        "OUTPUT.replaced/NAME.TIME beside the output folder, never deleted")
    return parser


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The parsed command line: load the sweep file, launch it."""
    try:
        how = Launch("dry_run" if args.dry_run else "local" if args.local else "slurm",
                     tuple(args.only or ()), args.workers, args.skip_recorded,
                     args.no_start_after, args.restart_changed)
    except SweepError as err:
        parser.error(str(err))
    try:
        sweep = load_sweep(args.sweep, args.output_dir, check_data=False)
    except SweepError as err:
        print(f"error: {args.sweep}: {err}", file=sys.stderr)
        return 2
    return launch(sweep, how)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    return run(parser.parse_args(argv), parser)
