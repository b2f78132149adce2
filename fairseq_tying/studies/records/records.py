"""The records of a study: each evaluated run's
:class:`~fairseq_tying.studies.records.record.Record` built from its folder (:func:`build_record`,
the one builder), exported into a study's records folder and read back.

A study's record is small enough to commit, complete enough to recompute every table and plot:
the run's settings, fairseq's parameter count and validations, the scores with their
signatures, the tied matrix's row norms, and the hypotheses (``NAME.hyp.gz`` beside
``NAME.json``). A language model's record holds its test loss and perplexity instead, and has
no hypotheses. ``collect`` builds the same record from a run's ``eval.json`` without its
training facts or norms, and exports nothing.

Everything a record says about a run comes from the run folder: ``run.json`` (``RunFacts``),
fairseq's log, the plateau rule's files and the evaluations.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from collections.abc import Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from fairseq_tying.common import (
    CONTINUED_FROM,
    EVAL_JSON,
    LM_TASK,
    RANKS,
    TRAIN_DONE,
    VALID_HISTORY,
)
from fairseq_tying.common.atomic import read_lines
from fairseq_tying.evaluation import norms
from fairseq_tying.evaluation.result import PerplexityResult, Result, read_result
from fairseq_tying.evaluation.run import RunFacts
from fairseq_tying.studies.records.record import (
    Evaluation,
    Perplexity,
    Record,
    Stop,
    Training,
    Translation,
)

PARAMS = re.compile(r"num\. (?:shared )?model params: ([\d,]+) \(num\. trained: ([\d,]+)\)")
VALID = re.compile(r"\| valid \| (\{.*\})\s*$")
DONE = re.compile(r"done training in ([\d.]+) seconds")
WALL = re.compile(r'"wall": "([\d.]+)"')  # train_inner's seconds since its process started


def training_summary(log: Path) -> Training:
    """Parameter count, validations ([updates, NLL] pairs, the last in full) and training time
    from fairseq's log (json format). A run resumed after a kill, or continued from another
    run's checkpoints, is logged by several processes, each starting with its parameter count,
    and fairseq's "done training in" times the last one only: each earlier process adds its own
    "done training in", or if it was killed the last wall clock it logged (every
    ``--log-interval`` updates, so up to that many short of where it was killed)."""
    params: tuple[int, int] | None = None
    valid: dict[str, float] | None = None
    history: list[list[float]] = []
    seconds: float | None = None
    earlier, wall = 0.0, 0.0
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        if m := WALL.search(line):
            wall = float(m.group(1))
        if m := PARAMS.search(line):  # a new process
            earlier, wall = earlier + wall, 0.0
            params = int(m.group(1).replace(",", "")), int(m.group(2).replace(",", ""))
        elif m := VALID.search(line):
            stats = json.loads(m.group(1))
            valid = {k.removeprefix("valid_"): float(v) for k, v in stats.items()
                     if k.startswith("valid_") and k not in ("valid_wps", "valid_wpb",
                                                             "valid_bsz")}
            updates = int(valid["num_updates"])
            # a run resumed after a kill may validate the same update again: keep the last
            history = [h for h in history if h[0] < updates]
            # a language model's cross_entropy logs its NLL as `loss`
            history.append([updates, valid.get("nll_loss", valid["loss"])])
        elif m := DONE.search(line):
            wall = float(m.group(1))
            seconds = round(earlier + wall, 1)
    if params is None or valid is None:
        raise ValueError(f"{log}: no parameter count or validation line; is the run finished "
                         "and logged with --log-format json?")
    return Training(params=params[0], params_trained=params[1], valid=valid,
                    valid_history=history, train_seconds=seconds)


def read_stop(run_dir: Path) -> Stop | None:
    """When and why the stopping rule ended the run (``train.done``), None without a rule."""
    done = run_dir / TRAIN_DONE
    stop = json.loads(done.read_text()).get("stop") if done.is_file() else None
    return None if stop is None else Stop(**stop)


def plateau_summary(run_dir: Path) -> dict[str, Any]:
    """Under the plateau rule: ``stop`` (epoch, update, reason) from ``train.done`` and the
    per-epoch validations ``valid_epochs`` ([epoch, update, value] of the watched metric)."""
    if (stop := read_stop(run_dir)) is None:
        return {}
    history = json.loads((run_dir / VALID_HISTORY).read_text())
    return {"stop": stop, "valid_metric": history["metric"],
            "valid_epochs": [[h["epoch"], h["update"], h["value"]] for h in history["epochs"]]}


def train_facts(run_dir: Path) -> Training:
    """A record's ``train``: what fairseq's log and the plateau rule's files say, and the
    device, processor, torch version and end date of its training (``ranks/rank0.json``, the
    date else ``train.done``'s; a record made before the rank file held one of them has none of
    that one)."""
    logs = sorted((run_dir / "logs").glob("train.rank0*.log"))
    if not logs:
        raise FileNotFoundError(f"{run_dir}/logs/train.rank0.log: missing")
    rank0 = run_dir / RANKS / "rank0.json"
    where = json.loads(rank0.read_text()) if rank0.is_file() else {}
    if "date" not in where and (run_dir / TRAIN_DONE).is_file():
        # a rank file older than its date: the day train.done was written (the job's clock)
        finished = json.loads((run_dir / TRAIN_DONE).read_text()).get("finished")
        where["date"] = finished[:10] if finished else None
    continued = None
    if (path := run_dir / CONTINUED_FROM).is_file():  # its first epochs: another run's
        continued = {k: v for k, v in json.loads(path.read_text()).items()
                     if k in ("run", "epochs")}
    return replace(training_summary(logs[-1]), **plateau_summary(run_dir),
                   **{k: where[k] for k in ("device", "cpu", "torch", "date") if where.get(k)},
                   continued_from=continued)


def _row_norms(ckpt: Path, required: bool) -> list[float] | None:
    """The output matrix's row norms in the evaluated checkpoint; None (recorded as null) when
    it is not on this machine and the caller accepted that (``--without-row-norms``)."""
    if not ckpt.is_file():
        if not required:
            return None
        raise FileNotFoundError(
            f"{ckpt}: the evaluated checkpoint is not here, and the record needs its output row "
            "norms; export on the machine that holds the checkpoints, or pass "
            "--without-row-norms to record them as null (no norm histogram for that run)")
    _, row_norms = norms.row_norms(ckpt)
    return [round(float(x), 4) for x in row_norms]


def read_evaluation(path: Path, checkpoint: bool = True) -> Result:
    """An evaluation's JSON (``eval.json``, ``eval.TAG.json``), with the ``checkpoint`` it
    evaluated unless not needed."""
    result = read_result(path)
    if checkpoint and result.checkpoint is None:
        raise ValueError(f"{path} lacks ['checkpoint']: it was not written by `evaluate` "
                         "(`evaluate-lm`); run it again on that run")
    return result


def _evaluation(result: Result, tagged: bool = False) -> Evaluation:
    """The record's part of an evaluation (a tagged one names its checkpoint's file)."""
    kind = Perplexity if isinstance(result, PerplexityResult) else Translation
    values = {f.name: getattr(result, f.name, None) for f in fields(kind)}
    values.update(checkpoint=Path(result.checkpoint).name if tagged else None,
                  averaged=result.averaged or None)
    return kind(**values)


def build_record(run_dir: str | os.PathLike, row_norms: bool = True, scores_only: bool = False,
                 eval_name: str = EVAL_JSON) -> Record:
    """The record of one evaluated run (its ``eval_name``, each tagged ``eval.TAG.json``) with
    its hypotheses (none for a language model). ``row_norms=False`` accepts a run whose
    checkpoints were left on another machine; ``scores_only`` leaves out the training facts and
    row norms (``collect``, which compares scores, on runs that may have no fairseq log)."""
    run_dir = Path(run_dir)
    result = read_evaluation(run_dir / eval_name, checkpoint=not scores_only)
    facts = RunFacts.read(run_dir, recorded=result.run)
    lm = isinstance(result, PerplexityResult)
    # a translation model's record has no task; a tagged grid block's run keeps its tag, the
    # cell it is compared as ("dot+zloss", Identity.cell_layer)
    identity = replace(facts.identity, task=LM_TASK if lm else None)
    tagged = {}
    for extra in sorted(run_dir.glob("eval.*.json")):
        evaluation = read_evaluation(extra)
        tagged[evaluation.tag] = _evaluation(evaluation, tagged=True)
    ckpt = Path(result.checkpoint or "")
    norms_of = None if lm or scores_only else _row_norms(ckpt, required=row_norms)
    return Record(identity, _evaluation(result), ckpt.name or None,
                  None if scores_only else train_facts(run_dir), tagged, norms_of,
                  None if lm else read_lines(run_dir / result.hypotheses), facts.run_dir)


def export(runs_root: str | os.PathLike, records_dir: str | os.PathLike,
           row_norms: bool = True) -> list[str]:
    """Write a record for every evaluated run under ``runs_root`` not yet in ``records_dir``
    (written atomically, hypotheses first); return the names written."""
    records = Path(records_dir)
    records.mkdir(parents=True, exist_ok=True)
    written = []
    for ev in sorted(Path(runs_root).glob(f"*/{EVAL_JSON}")):
        run_dir = ev.parent
        if (records / f"{run_dir.name}.json").exists():
            continue
        build_record(run_dir, row_norms).save(records / f"{run_dir.name}.json")
        written.append(run_dir.name)
    return written


def load(records_dir: str | os.PathLike, allow_empty: bool = False, hypotheses: bool = True,
         select: Sequence[str] = ()) -> list[Record]:
    """Every record of a study with its hypotheses (a language model has none; none are read
    without ``hypotheses``); with ``select``, those whose run name matches one of its globs."""
    out = [Record.load(path, hypotheses) for path in selected(records_dir, select)]
    if not out and not allow_empty:
        raise FileNotFoundError(f"{records_dir}: no study records (*.json)"
                                + (f" matching {', '.join(select)}" if select else ""))
    return out


def selected(records_dir: str | os.PathLike, select: Sequence[str] = ()) -> list[Path]:
    """The record files in ``records_dir``: all, or those whose run name matches a glob of
    ``select`` (e.g. a study's pre-registered runs among those added later)."""
    paths = sorted(Path(records_dir).glob("*.json"))
    if not select:
        return paths
    return [p for p in paths if any(fnmatch.fnmatchcase(p.stem, g) for g in select)]


def load_evaluated(root: str | os.PathLike) -> list[Record]:
    """The records of every ``eval.json`` under ``root`` (``build_record``'s scores only),
    named by their folder (relative to ``root`` when two folders share a name)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"RUNS_ROOT {root} is not a directory")
    paths = sorted(root.rglob(EVAL_JSON))
    if not paths:
        raise FileNotFoundError(f"no {EVAL_JSON} under {root}; run `evaluate` on the runs first")
    records = [build_record(p.parent, scores_only=True)
               for p in tqdm(paths, desc=f"reading {EVAL_JSON}", unit="run")]
    names = [r.name for r in records]
    if len(set(names)) != len(names):  # same folder name in two places: use relative paths
        records = [r.renamed(str(r.run_dir.relative_to(root.resolve()))) for r in records]
    return records
