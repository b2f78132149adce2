"""``python -m fairseq_tying.launch study NAME``: a study of the manifest (slurm/studies.yaml)
by name: prepare its data, train and evaluate its sweep's runs on this machine (resumable; runs
with a record are never trained again), export the records of the new runs, and rebuild its
report blocks, ``summary.json`` and plots from its records alone.

    python -m fairseq_tying.launch study converged --workers 2
    python -m fairseq_tying.launch study converged --report-only   # from the committed records

Paths in the manifest are relative to the working directory (the repository's root), as in the
sweep files. A study's run folders are its sweep's ``output_dir`` (``--runs`` for another), its
data the sweep's dataset folder, which ``prepare`` (the arguments of ``python -m
fairseq_tying.data.prepare`` but ``--out``) fills. A study without a sweep has frozen records:
only its report is rebuilt. ``summaries`` are blocks rendered from the first of several studies
whose records answer them (README's short answer: every cell of it with all seeds), else from
the first with records.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fairseq_tying.data.prepare import main as prepare_main
from fairseq_tying.launch.config import load_sweep
from fairseq_tying.launch.sweeps import main as sweeps_main
from fairseq_tying.studies import report
from fairseq_tying.studies.report import VIEWS, StudyReport, Summary, Target

MANIFEST = Path("slurm/studies.yaml")
STUDY_KEYS = {"prepare", "sweep", "runs", "records", "plots", "reports", "references"}
TARGET_KEYS = {"file", "block", "view"}


class ManifestError(ValueError):
    """The manifest or a study name is wrong; the message names the key and the fix."""


@dataclass(frozen=True)
class Study(StudyReport):
    """A study of the manifest: its report (``StudyReport``) and how its runs are made."""

    sweep: Path | None = None  # None: frozen records, a report only
    prepare: tuple[str, ...] = ()
    runs: Path | None = None  # None: the sweep's output_dir


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


def _mapping(raw: Any, allowed: set[str], where: str) -> dict:
    if not isinstance(raw, dict):
        raise ManifestError(f"{where}: expected a mapping, got {raw!r}")
    if unknown := sorted(set(raw) - allowed):
        raise ManifestError(f"{where}.{unknown[0]}: unknown key (allowed: "
                            f"{', '.join(sorted(allowed))})")
    return raw


def _path(raw: dict, key: str, where: str, required: bool = True) -> Path | None:
    value = raw.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise ManifestError(f"{where}.{key}: expected a path, got {value!r}")
    return Path(value)


def _target(raw: Any, where: str) -> Target:
    raw = _mapping(raw, TARGET_KEYS | ({"from"} if where.startswith("summaries") else set()),
                   where)
    block, view = raw.get("block"), raw.get("view")
    if not isinstance(block, str) or not block.replace("_", "").isalnum():
        raise ManifestError(f"{where}.block: expected a block name (letters, digits, _), got "
                            f"{block!r}")
    if view not in VIEWS:
        raise ManifestError(f"{where}.view: {view!r} is not a view; views: {', '.join(VIEWS)}")
    return Target(_path(raw, "file", where), block, view)


def _study(name: str, raw: Any) -> Study:
    where = f"studies.{name}"
    raw = _mapping(raw, STUDY_KEYS, where)
    reports = raw.get("reports")
    if not isinstance(reports, list) or not reports:
        raise ManifestError(f"{where}.reports: expected a list of {{file, block, view}}")
    prepare = raw.get("prepare") or []
    if not isinstance(prepare, list) or "--out" in prepare:
        raise ManifestError(f"{where}.prepare: expected the arguments of python -m "
                            "fairseq_tying.data.prepare as a list, without --out (the data goes "
                            "to the sweep's dataset folder)")
    sweep = _path(raw, "sweep", where, required=False)
    if prepare and sweep is None:
        raise ManifestError(f"{where}.prepare: a study without a sweep trains nothing")
    return Study(name, _path(raw, "records", where), _path(raw, "plots", where),
                 tuple(_target(t, f"{where}.reports[{i}]") for i, t in enumerate(reports)),
                 _path(raw, "references", where, False), sweep=sweep,
                 prepare=tuple(str(a) for a in prepare), runs=_path(raw, "runs", where, False))


def load_manifest(path: str | Path = MANIFEST) -> Manifest:
    """Read and check the manifest (the sweeps themselves are read when a study runs)."""
    path = Path(path)
    if not path.is_file():
        raise ManifestError(f"--manifest {path}: no such file")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ManifestError(f"{path}: not valid YAML: {err}") from err
    raw = _mapping(raw, {"studies", "summaries"}, str(path))
    studies = _mapping(raw.get("studies"), set(raw.get("studies") or {}), "studies")
    out = {str(name): _study(str(name), s) for name, s in studies.items()}
    summaries = []
    for i, s in enumerate(raw.get("summaries") or []):
        target, sources = _target(s, f"summaries[{i}]"), s.get("from")
        if not isinstance(sources, list) or not sources or any(n not in out for n in sources):
            raise ManifestError(f"summaries[{i}].from: expected a list of the manifest's "
                                f"studies ({', '.join(out)}), got {sources!r}")
        summaries.append(Summary(target, tuple(out[n] for n in sources)))
    return Manifest(path, out, tuple(summaries))


def expected_runs(study: Study) -> int:
    """How many runs the study has: its sweep's; its records' when they are frozen."""
    if study.sweep is None:
        return len(list(study.records.glob("*.json")))
    return len(load_sweep(study.sweep, check_data=False).runs)


def prepare_data(study: Study, data_dirs: set[Path]) -> None:
    """``python -m fairseq_tying.data.prepare`` with the study's arguments into the sweep's
    dataset folder (a folder already prepared with them is kept)."""
    if not study.prepare:
        return
    if len(data_dirs) != 1:
        raise ManifestError(f"studies.{study.name}.prepare: the sweep has {len(data_dirs)} "
                            "datasets; give a study one dataset to prepare")
    argv = [*study.prepare, "--out", str(next(iter(data_dirs)))]
    try:
        rc = prepare_main(argv)
    except SystemExit as e:  # argparse's error: the manifest's arguments are wrong
        rc = e.code
    if rc:
        raise ManifestError(f"studies.{study.name}.prepare: python -m fairseq_tying.data.prepare "
                            f"{' '.join(argv)} failed ({rc}); see its message above")


def sweep_of(study: Study, runs: Path | None):
    """The study's sweep (``launch.config.Sweep``), its runs in ``runs``, else in the
    manifest's ``runs``, else in the sweep's output_dir."""
    if study.sweep is None:
        raise ManifestError(f"study {study.name} has no sweep (its records are frozen); "
                            "rebuild its report with --report-only")
    return load_sweep(study.sweep, runs or study.runs, check_data=False)


def train(study: Study, args: argparse.Namespace) -> tuple[int, Path]:
    """Prepare the data, then train and evaluate the runs without a record (the launcher);
    its exit status and the run folders."""
    sweep = sweep_of(study, args.runs)
    if args.dry_run:
        if study.prepare:
            print(f"# python -m fairseq_tying.data.prepare {' '.join(study.prepare)} --out "
                  f"{' '.join(sorted({str(r.data_dir) for r in sweep.runs}))}")
    else:
        prepare_data(study, {r.data_dir for r in sweep.runs})
    argv = [str(study.sweep), "--output-dir", str(sweep.output_dir),
            "--skip-recorded", str(study.records),
            *(["--dry-run"] if args.dry_run else ["--local", "--workers", str(args.workers)]),
            *(["--no-start-after", str(args.no_start_after)]
              if args.no_start_after is not None else []),
            *(a for pattern in args.only or [] for a in ("--only", pattern))]
    return sweeps_main(argv), sweep.output_dir


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
    parser.add_argument("--bootstrap-samples", type=int, default=1000)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        manifest = load_manifest(args.manifest)
        study = manifest.study(args.name)
        if args.report_only and (args.only or args.runs or args.dry_run or args.no_train):
            raise ManifestError("--report-only exports and trains nothing: leave out --only, "
                                "--runs, --dry-run and --no-train")
        if args.no_train and (args.only or args.dry_run):
            raise ManifestError("--no-train trains nothing: leave out --only and --dry-run")
        runs = None
        if args.no_train:
            runs = sweep_of(study, args.runs).output_dir
        elif not args.report_only:
            rc, runs = train(study, args)
            if rc or args.dry_run:
                return rc
        done = report.rebuild(study, expected_runs(study), manifest.summaries, runs,
                              not args.without_row_norms, args.bootstrap_samples, args.out)
    except (FileNotFoundError, ValueError, KeyError, RuntimeError) as err:
        print(f"error: study {args.name}: {err}", file=sys.stderr)
        return 2
    print(f"study {args.name}: {len(done['exported'])} new record(s), {done['records']} of "
          f"{done['expected']} runs recorded; wrote {', '.join(done['written'])}")
    return 0
