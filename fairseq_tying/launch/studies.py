"""``python -m fairseq_tying.launch study NAME``: a study of the manifest (slurm/studies.yaml)
by name: prepare its data, train and evaluate its sweep's runs on this machine (resumable; runs
with a record are never trained again), export the records of the new runs, and rebuild its
report blocks, ``summary.json`` and plots from its records alone.

    python -m fairseq_tying.launch study converged --workers 2
    python -m fairseq_tying.launch study converged --report-only   # from the committed records
    python -m fairseq_tying.launch study equal --reproduce work/reproduce/equal --only '*.s1'

``--reproduce DIR`` trains recorded runs afresh into DIR and compares each with its committed
record (``studies.records.reproduction``); the records and reports are only read.

Paths in the manifest are relative to the working directory (the repository's root), as in the
sweep files. A study's run folders are its sweep's ``output_dir`` (``--runs`` for another), its
data the sweep's dataset folder, which ``prepare`` (the arguments of ``python -m
fairseq_tying.data.prepare`` but ``--out``, read as its options) fills. The manifest's keys are
the fields of :class:`Study` and :class:`ReportTarget`, checked as the sweep files' are. A
study without a sweep has frozen records: only its report is rebuilt. ``summaries`` are blocks
rendered from the first of several studies whose records answer them (README's short answer:
every cell of it with all seeds), else from the first with records.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from fairseq_tying.data import prepare as data_prepare
from fairseq_tying.launch.sweeps import Launch, launch, selected
from fairseq_tying.studies.records import records, reproduction
from fairseq_tying.studies.views import report
from fairseq_tying.studies.views.report import VIEWS, StudyReport, Summary, Target
from fairseq_tying.sweeps.config import Sweep, check_data, load_sweep
from fairseq_tying.sweeps.sweep import SweepError, section_fields, setting
from fairseq_tying.sweeps.sweepfile import CHECKS, check_keys, read_section

MANIFEST = Path("slurm/studies.yaml")
STUDY, TARGET = "study", "target"  # the manifest's sections: a study, a report target


class ManifestError(ValueError):
    """The manifest or a study name is wrong; the message names the key and the fix."""


@dataclass(frozen=True)
class ReportTarget(Target):
    """A report target of the manifest: ``{file, block, view}``."""

    file: Path = setting(section=TARGET, kind="path")
    block: str = setting(section=TARGET, kind="block")
    view: str = setting(section=TARGET, kind="view")


@dataclass(frozen=True)
class Study(StudyReport):
    """A study of the manifest: its report (``StudyReport``) and how its runs are made; each
    field with a section is a key of its entry."""

    records: Path = setting(section=STUDY, kind="path")
    plots: Path = setting(section=STUDY, kind="path")
    reports: tuple[Target, ...] = setting(section=STUDY, kind="targets")
    references: Path | None = setting(None, section=STUDY, kind="path")
    sweep: Path | None = setting(None, section=STUDY, kind="path")  # None: frozen records
    # the arguments of python -m fairseq_tying.data.prepare but --out, as its options
    prepare: data_prepare.Prepare | None = setting(None, section=STUDY, kind="prepare")
    runs: Path | None = setting(None, section=STUDY, kind="path")  # None: the sweep's output_dir
    # globs of run names: the records the study reads (none: all), e.g. a pre-registered family
    select: tuple[str, ...] = setting((), section=STUDY, kind="globs")


def _block(value: Any, key: str, meta: dict) -> str:
    if not isinstance(value, str) or not value.replace("_", "").isalnum():
        raise SweepError(f"{key}: expected a block name (letters, digits, _), got {value!r}")
    return value


def _view(value: Any, key: str, meta: dict) -> str:
    if value not in VIEWS:
        raise SweepError(f"{key}: {value!r} is not a view; views: {', '.join(VIEWS)}")
    return value


def _targets(value: Any, key: str, meta: dict) -> tuple[Target, ...]:
    if not isinstance(value, list) or not value:
        raise SweepError(f"{key}: expected a list of {{file, block, view}}")
    return tuple(_target(t, f"{key}[{i}]") for i, t in enumerate(value))


def _prepare(value: Any, key: str, meta: dict) -> data_prepare.Prepare:
    if not isinstance(value, list) or "--out" in value:
        raise SweepError(f"{key}: expected the arguments of python -m fairseq_tying.data.prepare "
                         "as a list, without --out (the data goes to the sweep's dataset folder)")
    try:
        return data_prepare.options([str(a) for a in value], out_required=False)
    except ValueError as err:
        raise SweepError(f"{key}: {err}") from None


def _globs(value: Any, key: str, meta: dict) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(g, str) and g
                                                             for g in value):
        raise SweepError(f"{key}: expected a list of run-name globs, e.g. ['*.s1', '*.s2']")
    return tuple(value)


MANIFEST_CHECKS = {**CHECKS, "block": _block, "view": _view, "targets": _targets,
                   "prepare": _prepare, "globs": _globs}


def _target(raw: Any, where: str) -> ReportTarget:
    return ReportTarget(**read_section(raw, ReportTarget, where, TARGET, MANIFEST_CHECKS))


@dataclass(frozen=True)
class Manifest:
    path: Path
    studies: dict[str, Study]
    summaries: tuple[Summary, ...] = ()

    def study(self, name: str) -> Study:
        if name not in self.studies:
            raise ManifestError(f"study {name!r} is not in {self.path}; studies: "
                                + ", ".join(self.studies))
        return self.studies[name]


def _study(name: str, raw: Any) -> Study:
    where = f"studies.{name}"
    study = Study(name, **read_section(raw, Study, where, STUDY, MANIFEST_CHECKS))
    if study.prepare and study.sweep is None:
        raise ManifestError(f"{where}.prepare: a study without a sweep trains nothing")
    if study.select and study.sweep is not None:
        raise ManifestError(f"{where}.select: a study that reads some of the records reads "
                            "those another study's sweep trains; leave out its sweep")
    return study


def _summary(raw: Any, where: str, studies: dict[str, Study]) -> Summary:
    """``{file, block, view, from}``: a block rendered from the first of ``from`` that
    answers it."""
    given = dict(check_keys(raw, {*section_fields(ReportTarget, TARGET), "from"}, where))
    sources = given.pop("from", None)
    if not isinstance(sources, list) or not sources or any(n not in studies for n in sources):
        raise ManifestError(f"{where}.from: expected a list of the manifest's studies "
                            f"({', '.join(studies)}), got {sources!r}")
    return Summary(_target(given, where), tuple(studies[n] for n in sources))


def load_manifest(path: str | Path = MANIFEST) -> Manifest:
    """Read and check the manifest (the sweeps themselves are read when a study runs)."""
    path = Path(path)
    if not path.is_file():
        raise ManifestError(f"--manifest {path}: no such file")
    try:
        raw = check_keys(yaml.safe_load(path.read_text()), {"studies", "summaries"}, str(path))
        studies = check_keys(raw.get("studies"), set(raw.get("studies") or {}), "studies")
        if not studies:
            raise ManifestError(f"{path}: studies: expected a mapping of study names to studies")
        out = {str(name): _study(str(name), s) for name, s in studies.items()}
        summaries = tuple(_summary(s, f"summaries[{i}]", out)
                          for i, s in enumerate(raw.get("summaries") or []))
    except yaml.YAMLError as err:
        raise ManifestError(f"{path}: not valid YAML: {err}") from err
    except SweepError as err:  # the field checks the sweep files share name the key
        raise ManifestError(str(err)) from None
    return Manifest(path, out, summaries)


def expected_runs(study: Study, sweep: Sweep | None = None) -> int:
    """How many runs the study has: its sweep's (``sweep``, loaded if not given); its
    records' when they are frozen."""
    if study.sweep is None:
        return len(records.selected(study.records, study.select))
    return len((sweep or load_sweep(study.sweep, check_data=False)).runs)


def prepare_data(study: Study, sweep: Sweep, dry_run: bool = False) -> None:
    """The study's data preparation (:func:`fairseq_tying.data.prepare.prepare`) into the
    sweep's dataset folder (a folder already prepared with the same options is kept); printed
    as its command with ``dry_run``."""
    if not study.prepare:
        return
    data_dirs = sorted({str(r.data_dir) for r in sweep.runs})
    if len(data_dirs) != 1:
        raise ManifestError(f"studies.{study.name}.prepare: the sweep has {len(data_dirs)} "
                            "datasets; give a study one dataset to prepare")
    command = f"python -m fairseq_tying.data.prepare {' '.join(study.prepare.argv())}"
    if dry_run:
        print(f"# {command} --out {data_dirs[0]}")
    elif rc := data_prepare.prepare(replace(study.prepare, out=data_dirs[0])):
        raise ManifestError(f"studies.{study.name}.prepare: {command} --out {data_dirs[0]} "
                            f"failed ({rc}); see its message above")


def sweep_of(study: Study, runs: Path | None):
    """The study's sweep (``sweeps.config.Sweep``), its runs in ``runs``, else in the
    manifest's ``runs``, else in the sweep's output_dir."""
    if study.sweep is None:
        raise ManifestError(f"study {study.name} has no sweep (its records are frozen); "
                            "rebuild its report with --report-only")
    return load_sweep(study.sweep, runs or study.runs, check_data=False)


def train(study: Study, sweep: Sweep, args: argparse.Namespace) -> int:
    """Prepare the data, then train and evaluate the runs without a record (the launcher);
    its exit status."""
    prepare_data(study, sweep, args.dry_run)
    if not args.dry_run:
        check_data(sweep)
    how = Launch("dry_run" if args.dry_run else "local", tuple(args.only or ()),
                 1 if args.dry_run else args.workers, study.records, args.no_start_after)
    return launch(sweep, how)


def reproduction_dir(path: Path, study: Study) -> Path:
    """``--reproduce DIR``, refused inside docs/ or the study's records or plots: a reproduction
    never writes beside what is committed."""
    out = path.resolve()
    for guarded in (Path("docs"), study.records, study.plots):
        if out == guarded.resolve() or guarded.resolve() in out.parents:
            raise ManifestError(f"--reproduce {path}: inside {guarded}, which holds committed "
                                "records and reports; give a folder outside it, e.g. "
                                "work/reproduce")
    return out


def reproduce(study: Study, sweep: Sweep, args: argparse.Namespace) -> int:
    """Train the recorded runs of ``--only`` (all without it) afresh into DIR/runs (``sweep``:
    its output_dir there), evaluate them as the study does, export their records into
    DIR/records and compare them with the committed ones: DIR/comparison.{json,md}, the table
    printed. The committed records and reports are only read."""
    out = reproduction_dir(args.reproduce, study)
    committed = records.load(study.records)
    recorded = {r.name for r in committed}
    todo = [r.name for r in selected(sweep, args.only or ()) if r.name in recorded]
    if not todo:
        raise ManifestError(f"--only {args.only}: no run with a record in {study.records} "
                            "matches; recorded runs: " + ", ".join(sorted(recorded)))
    prepare_data(study, sweep)
    check_data(sweep)
    rc = launch(sweep, Launch("local", tuple(todo), args.workers, None, args.no_start_after))
    if rc:
        return rc
    records.export(sweep.output_dir, out / "records")
    fresh = [r for r in records.load(out / "records") if r.name in todo]
    if missing := sorted(set(todo) - {r.name for r in fresh}):
        print(f"not reproduced yet (the same command trains them): {', '.join(missing)}",
              file=sys.stderr)
    print(reproduction.write(reproduction.compare(study.name, fresh, committed), out))
    print(f"wrote {out / 'comparison.md'}, {out / 'comparison.json'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fairseq_tying.launch study",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", metavar="NAME", help="a study of the manifest")
    parser.add_argument("--manifest", type=Path, default=MANIFEST,
                        help=f"the studies (default: {MANIFEST})")
    parser.add_argument("--report-only", action="store_true",
                        help="train and export nothing: rebuild the reports and plots from the "
                        "committed records")
    parser.add_argument("--no-train", action="store_true",
                        help="train nothing: export the records of the evaluated runs (e.g. "
                        "trained on SLURM or another machine) and rebuild the reports")
    parser.add_argument("--only", metavar="PATTERN", action="append",
                        help="only runs whose name matches this glob (repeatable)")
    parser.add_argument("--workers", type=int, default=2, help="runs side by side (default 2)")
    parser.add_argument("--no-start-after", type=float, metavar="MIN",
                        help="start or resume no run after MIN minutes (the next call trains "
                        "the rest)")
    parser.add_argument("--runs", type=Path, metavar="DIR",
                        help="the run folders (default: the sweep's output_dir)")
    parser.add_argument("--without-row-norms", action="store_true",
                        help="export runs whose evaluated checkpoint is not on this machine "
                        "(their records hold output_row_norms: null)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the data preparation and the jobs; train and write nothing")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="write the reports and plots under DIR (same relative paths, each "
                        "report a copy of the committed one) instead of in place")
    parser.add_argument("--reproduce", type=Path, metavar="DIR",
                        help="train the recorded runs (of --only) afresh into DIR, evaluate "
                        "them as the study does and compare each with its committed record "
                        "(DIR/comparison.md and .json); the records and reports are only read")
    parser.add_argument("--bootstrap-samples", type=int, metavar="B",
                        help="paired bootstrap resamples (default: enough for the study's "
                        "family of tests, at least 20·m/α)")
    return parser


def run(args: argparse.Namespace) -> int:
    """The parsed command line: train the study's runs as asked, then rebuild its reports."""
    try:
        manifest = load_manifest(args.manifest)
        study = manifest.study(args.name)
        if args.report_only and (args.only or args.runs or args.dry_run or args.no_train):
            raise ManifestError("--report-only exports and trains nothing: leave out --only, "
                                "--runs, --dry-run and --no-train")
        if args.no_train and (args.only or args.dry_run):
            raise ManifestError("--no-train trains nothing: leave out --only and --dry-run")
        if args.reproduce and (args.report_only or args.no_train or args.dry_run or args.runs
                               or args.out):
            raise ManifestError("--reproduce trains into its own folder and writes no report: "
                                "leave out --report-only, --no-train, --dry-run, --runs and "
                                "--out")
        if args.reproduce:
            reproduction_dir(args.reproduce, study)
            return reproduce(study, sweep_of(study, args.reproduce / "runs"), args)
        sweep = None if args.report_only else sweep_of(study, args.runs)
        if sweep is not None and not args.no_train:
            rc = train(study, sweep, args)
            if rc or args.dry_run:
                return rc
        done = report.rebuild(study, expected_runs(study, sweep), manifest.summaries,
                              sweep.output_dir if sweep else None, not args.without_row_norms,
                              args.bootstrap_samples, args.out)
    except (FileNotFoundError, ValueError, KeyError, RuntimeError) as err:
        print(f"error: study {args.name}: {err}", file=sys.stderr)
        return 2
    print(f"study {args.name}: {len(done['exported'])} new record(s), {done['records']} of "
          f"{done['expected']} runs recorded; wrote {', '.join(done['written'])}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))
