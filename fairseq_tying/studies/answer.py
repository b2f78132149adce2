"""``python -m fairseq_tying.studies answer SWEEP.yaml``: "Does it help?" for any sweep's runs.

The same engine, claims and verdict rule as the README's block (the ``does_it_help`` and
``equal`` views of ``report.Renderer``), the family of claims being this sweep's. Every run of the
sweep is checked before any record is written; a run that cannot be compared is named with the
reason and left out, never mixed in:

- *unfinished*: no ``eval.json`` yet (not trained, still training, or not evaluated);
- *another budget*: under an equal-training sweep (``stopping.plateau: false``) a run that did
  not stop for its budget at the sweep's ``max_epoch``;
- *other references*: scored on a file whose sha256 differs from ``--references`` (default:
  the test references of the sweep's data dir, ``D/raw/test.TGT``); the file it was scored on
  is named;
- *no JSON log*: trained with another ``--log-format`` than json, so its parameter count and
  validations cannot be read.

``OUT`` (default ``answers/NAME``) receives ``records/`` (one record per compared run, those of
runs no longer compared removed), ``answer.md`` (the answer, the claims and the tables),
``summary.json`` and the plots; ``--report FILE`` also puts the answer into a marked block of
a report, and ``--records-only`` rebuilds it from ``OUT/records`` alone (a clone's committed
records). A cell with fewer seeds than the verdict rule needs says so.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fairseq_tying.common import EVAL_JSON, TRAIN_DONE
from fairseq_tying.common.atomic import write_text
from fairseq_tying.common.blocks import replace_block
from fairseq_tying.common.run_spec import flag_value
from fairseq_tying.evaluation.result import TranslationResult, read_result
from fairseq_tying.studies.records import records
from fairseq_tying.studies.statistics import across
from fairseq_tying.studies.statistics.cells import summary_of
from fairseq_tying.studies.views.formatting import scope
from fairseq_tying.studies.views.report import Renderer, documents, references, view_of
from fairseq_tying.sweeps.config import Run, Sweep, load_sweep

ANSWER = "answer.md"
TITLE = "# Does it help?\n"


@dataclass(frozen=True)
class LeftOut:
    run: str
    why: str


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def default_references(sweep: Sweep) -> Path:
    """The target side of the test set in the sweep's data dir (``D/raw/test.TGT``)."""
    dirs = sorted({r.data_dir for r in sweep.runs})
    if len(dirs) != 1:
        raise ValueError(f"{sweep.path}: {len(dirs)} datasets; give --references (the test "
                         "set the runs were scored on)")
    tgt = flag_value(sweep.runs[0].identity.train_args, "--target-lang")
    path = dirs[0] / "raw" / f"test.{tgt}"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the test references of the sweep's data dir are not "
                                "here; give --references FILE (the file the runs were scored on)")
    return path



def budget(sweep: Sweep) -> int | None:
    """The epoch budget every run trains (None: not an equal-training sweep)."""
    stopping = sweep.runs[0].stopping if sweep.runs else None
    if not stopping or stopping.get("plateau", True):
        return None
    return int(stopping["max_epoch"])


def why_left_out(run: Run, refs: Path, digest: str, epochs: int | None) -> str | None:
    """Why ``run`` cannot be compared, or None."""
    ev_path = run.run_dir / EVAL_JSON
    if not ev_path.is_file():
        return f"unfinished (no {EVAL_JSON} in {run.run_dir})"
    ev = read_result(ev_path)
    if not isinstance(ev, TranslationResult):
        return f"not a translation model's evaluation ({ev_path})"
    if ev.references_sha256 != digest:
        return (f"scored on other references: {ev.references} (sha256 "
                f"{ev.references_sha256[:12]}…), not {refs} ({digest[:12]}…)")
    if epochs is not None:
        done = run.run_dir / TRAIN_DONE
        stop = json.loads(done.read_text()).get("stop") if done.is_file() else None
        if not stop or stop.get("reason") != "budget" or stop.get("epoch") != epochs:
            got = f"epoch {stop['epoch']} ({stop['reason']})" if stop else "no stop record"
            return f"trained with another budget: {got}, the sweep's is {epochs} epochs"
    try:
        records.train_facts(run.run_dir)
    except (ValueError, FileNotFoundError) as err:
        return f"no JSON training log: {err}"
    return None


def check_runs(sweep: Sweep, refs: Path) -> tuple[list[Run], list[LeftOut]]:
    """The runs that can be compared, and those left out with the reason."""
    digest, epochs = file_sha256(refs), budget(sweep)
    kept, left = [], []
    for run in sweep.runs:
        why = why_left_out(run, refs, digest, epochs)
        (left.append(LeftOut(run.name, why)) if why else kept.append(run))
    return kept, left


def write_records(runs: list[Run], out: Path) -> list[str]:
    """One record per compared run in ``out`` (rebuilt from its folder); records of runs no
    longer compared are removed. Returns the names removed."""
    out.mkdir(parents=True, exist_ok=True)
    names = {r.name for r in runs}
    for run in runs:
        records.build_record(run.run_dir).save(out / f"{run.name}.json")
    removed = []
    for path in sorted(out.glob("*.json")):
        if path.stem not in names:
            path.unlink()
            (out / f"{path.stem}.hyp.gz").unlink(missing_ok=True)
            removed.append(path.stem)
    return removed


class Unanswered(ValueError):
    """None of a sweep's runs can be compared yet (each is named, with the reason, in
    ``left``)."""

    def __init__(self, message: str, left: list[LeftOut]) -> None:
        super().__init__(message)
        self.left = left


@dataclass(frozen=True)
class Answered:
    """What ``make`` wrote: the answer's text (``OUT/answer.md``, its ``head`` then its
    ``body``), the runs left out and the other files (``summary.json``, the plots)."""

    sweep: Sweep
    out: Path
    left: list[LeftOut]
    head: str
    body: str
    written: list[str]

    @property
    def compared(self) -> int:
        return len(self.sweep.runs) - len(self.left)


def make(sweep: Sweep, sweep_file: Path, out: Path, refs: Path | None = None,
         n_samples: int | None = None, records_only: bool = False,
         beside: Sequence[tuple[Path, str]] = (), command: str | None = None) -> Answered:
    """Check the sweep's runs, record those that can be compared in ``OUT/records`` and write
    the answer (``OUT/answer.md``, ``summary.json``, the plots); with ``records_only``, the
    answer of the records already in ``OUT/records`` alone; with ``beside`` (summary.json,
    name), each comparison this study shares with one of those and its change from there;
    ``command``: the command its head names (default ``studies answer SWEEP``).
    :class:`Unanswered` when no run can be compared."""
    refs = refs or default_references(sweep)
    if records_only:
        have = {p.stem for p in (out / "records").glob("*.json")}
        left = [LeftOut(r.name, f"no record in {out / 'records'}") for r in sweep.runs
                if r.name not in have]
    else:
        kept, left = check_runs(sweep, refs)
        if not kept:
            raise Unanswered(f"none of the {len(sweep.runs)} runs of {sweep_file} can be "
                             "compared yet", left)
        write_records(kept, out / "records")
    body, written = render(out, references(refs), n_samples, len(sweep.runs), beside,
                           documents(refs))
    first = head(sweep_file, sweep, left, command)
    write_text(out / ANSWER, first + body + "\n")
    return Answered(sweep, out, left, first, body, written)


def answer(sweep_file: Path, runs: Path | None = None, out: Path | None = None,
           refs: Path | None = None, n_samples: int | None = None, records_only: bool = False,
           report: Path | None = None, block: str = "answer",
           beside: Sequence[tuple[Path, str]] = ()) -> int:
    """``studies answer``: the answer of the sweep's runs (``make``) in ``OUT`` (default
    ``answers/NAME``), printed; with ``report``, also into its marked ``block``."""
    sweep = load_sweep(sweep_file, runs, check_data=False)
    out = out or Path("answers") / sweep.name
    try:
        done = make(sweep, sweep_file, out, refs, n_samples, records_only, beside)
    except Unanswered as err:
        for lo in err.left:
            print(f"left out {lo.run}: {lo.why}", file=sys.stderr)
        print(f"error: answer: {err} (see above)", file=sys.stderr)
        return 2
    if not records_only:
        for lo in done.left:
            print(f"left out {lo.run}: {lo.why}", file=sys.stderr)
    written = done.written
    if report is not None:
        replace_block(report, block, done.body)
        written.append(str(report))
    print((out / ANSWER).read_text())
    print(f"{done.compared} of {len(sweep.runs)} runs compared; wrote "
          + ", ".join([str(out / ANSWER), *written]))
    return 0


def render(out: Path, refs: list[str], n_samples: int | None, expected: int,
           beside: Sequence[tuple[Path, str]] = (), docs: list[str] | None = None
           ) -> tuple[str, list[str]]:
    """The answer's text from ``OUT/records`` (the verdicts, the tables, the changes from
    the study ``beside``), and ``summary.json`` and the plots written beside them."""
    renderer = Renderer(records.load(out / "records"), refs, n_samples, expected, docs)
    tables, summary = renderer.block("equal")
    verdicts, _ = renderer.block("does_it_help", count=False)
    # the verdicts' legend states the scope the tables' first line repeats
    tables = tables.replace(scope(renderer.sections(view_of("equal"))).rstrip() + "\n\n", "", 1)
    plots = renderer.plots("equal", out, summary)
    parts = [verdicts.strip(), tables.strip()]
    others = [({model: summary_of(cells) for model, cells in json.loads(path.read_text()).items()},
               name) for path, name in beside]
    parts.append(across.render(summary, others))
    return "\n\n".join(p for p in parts if p), [str(p) for p in plots]


def head(sweep_file: Path, sweep: Sweep, left: list[LeftOut], command: str | None = None
         ) -> str:
    """What the answer answers (the runs of the sweep, compared by ``command``), and the runs
    left out."""
    command = command or f"python -m fairseq_tying.studies answer {sweep_file}"
    lines = [TITLE, f"The runs of `{sweep_file}` ({sweep.name}), compared by `{command}`.\n"]
    if left:
        lines += ["Left out:\n", *(f"- `{lo.run}`: {lo.why}" for lo in left), ""]
    return "\n".join(lines) + "\n"
