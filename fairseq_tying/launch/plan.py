"""What a launch will do to each run, decided before anything runs: a :class:`Plan` of one
:class:`Action` per run, computed from the sweep and the run folders alone (:func:`make_plan`).
The executors (``submit.py``, ``local.py``) carry it out and decide nothing.

A run that has trained (checkpoints, ``train.done``) under settings other than the sweep's
(the training arguments, the budget, the data: what its ``run.json`` recorded) is refused: a
resumed run would mix two trainings under the new settings' name. ``--restart-changed`` starts
those runs afresh instead, their old folder moved aside (``OUTPUT.replaced/``), never deleted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fairseq_tying.common import EVAL_JSON, RUN_JSON, TRAIN_DONE
from fairseq_tying.common.run_spec import RunSpec, read_run_json
from fairseq_tying.core import checkpoint_compat
from fairseq_tying.launch.continuation import differences, same_dictionaries, source_epochs
from fairseq_tying.sweeps.config import Run, Sweep, SweepError

checkpoint_compat.allow_fairseq_checkpoints()  # what fairseq pickles besides tensors

TRAIN, RESUME, CONTINUE, RESTART = "train", "resume", "continue", "restart"
EVALUATE, SKIP, REFUSE = "evaluate", "skip", "refuse"
TRAINS = (TRAIN, RESUME, CONTINUE, RESTART)  # the actions that start a training job


@dataclass(frozen=True)
class Action:
    """What the launch does to ``run``: ``kind`` (one of TRAINS, EVALUATE, SKIP, REFUSE),
    ``evaluate`` whether an evaluation follows, ``epoch`` the epoch it resumes at or continues
    from, ``source`` the run it continues from (``continue_from:``), ``why`` the reason shown."""

    run: Run
    kind: str
    evaluate: bool = False
    epoch: int | None = None
    source: Path | None = None
    why: str = ""

    @property
    def trains(self) -> bool:
        return self.kind in TRAINS

    def describe(self) -> str:
        """One line: ``NAME: resume at epoch 4, then evaluate``."""
        what = {TRAIN: "train from epoch 1",
                RESUME: f"resume at epoch {self.epoch}" if self.epoch else "resume",
                CONTINUE: f"continue from {self.source} epoch {self.epoch}",
                RESTART: "start afresh",
                EVALUATE: "evaluate", SKIP: "skip", REFUSE: "refuse"}[self.kind]
        then = ", then evaluate" if self.evaluate and self.trains else ""
        return f"{self.run.name}: {what}{then}" + (f" ({self.why})" if self.why else "")


@dataclass(frozen=True)
class Plan:
    sweep: Sweep
    actions: list[Action]
    skip_recorded: Path | None = None  # runs with a study record there are skipped

    def refused(self) -> list[Action]:
        return [a for a in self.actions if a.kind == REFUSE]

    def show(self) -> str:
        """The plan, a line per run, after a heading."""
        head = f"# plan of sweep {self.sweep.name} ({len(self.actions)} runs) -> " \
               f"{self.sweep.output_dir}"
        return "\n".join([head, *(a.describe() for a in self.actions)])

    def check(self) -> None:
        """Refuse the whole launch, before anything starts, if a run is refused."""
        refused = self.refused()
        if not refused:
            return
        lines = "\n".join(f"  {a.run.name} ({a.run.run_dir}): {a.why}" for a in refused)
        raise SweepError(
            f"{len(refused)} run(s) refused, nothing was started:\n{lines}\nLaunch into a new "
            f"output folder (--output-dir DIR), or pass --restart-changed to start the runs "
            f"trained with other settings afresh (their folders are moved to "
            f"{replaced_dir(self.sweep)}/)")


def replaced_dir(sweep: Sweep) -> Path:
    """Where ``--restart-changed`` moves the folders of the runs it restarts: beside the output
    folder, not in it, so that no tool reading the sweep's runs finds the old ones."""
    return sweep.output_dir.with_name(sweep.output_dir.name + ".replaced")


def replaced_path(sweep: Sweep, run: Run) -> Path:
    return replaced_dir(sweep) / f"{run.name}.{time.strftime('%Y%m%dT%H%M%S')}"


def has_trained(run_dir: Path) -> bool:
    """Whether training has left anything the next training would build on."""
    ckpts = run_dir / "checkpoints"
    return (run_dir / TRAIN_DONE).is_file() or (ckpts.is_dir() and any(ckpts.iterdir()))


def _flat(prefix: str, d: dict[str, Any] | None) -> dict[str, Any]:
    return {f"{prefix}.{k}": v for k, v in (d or {}).items()}


def changed_settings(planned: RunSpec, recorded: RunSpec) -> list[str]:
    """What differs between the run the sweep asks for and the one its ``run.json`` records:
    each training argument, the budget (``stopping``), the data (dictionaries); [] if none."""
    out = []
    if planned.identity.train_args != recorded.identity.train_args:
        if recorded.identity.train_args is None:
            out.append(f"{RUN_JSON} records no training arguments")
        else:
            out += differences(planned.identity.train_args or [], recorded.identity.train_args,
                               here="now", there=f"in its {RUN_JSON}")
    ours, theirs = _flat("stopping", planned.stopping), _flat("stopping", recorded.stopping)
    out += [f"{k} {ours.get(k, '(absent)')} now, {theirs.get(k, '(absent)')} in its "
            f"{RUN_JSON}" for k in sorted(set(ours) | set(theirs)) if ours.get(k) != theirs.get(k)]
    mine, before = Path(planned.data_bin or ""), Path(recorded.data_bin or "")
    if mine != before and not same_dictionaries(mine, before):
        out.append(f"data {mine} now, {before} in its {RUN_JSON}, whose dictionaries differ "
                   "(or are gone)")
    return out


def resume_epoch(run_dir: Path) -> int | None:
    """The epoch fairseq resumes at from ``checkpoint_last.pt`` (its iterator's state), None
    when there is none or it cannot be read (fairseq then says why)."""
    last = run_dir / "checkpoints" / "checkpoint_last.pt"
    if not last.is_file():
        return None
    try:  # mapped, not read: a plan of large runs reads one small entry of each
        state = checkpoint_compat.load(last, mmap=True)
    except Exception:  # noqa: BLE001 - a plan shows what it can; the training job reports it
        return None
    itr = (state.get("extra_state") or {}).get("train_iterator") or {}
    return itr.get("epoch")


def plan_run(sweep: Sweep, run: Run, restart_changed: bool = False) -> Action:
    """The action for one run, from the sweep and the run's folder (and the folder it would
    continue from)."""
    evaluate = sweep.eval_enabled and not (run.run_dir / EVAL_JSON).is_file()
    if has_trained(run.run_dir):
        recorded = read_run_json(run.run_dir)
        changed = (changed_settings(sweep.spec(run), recorded) if recorded is not None
                   else [f"no {RUN_JSON}: its folder was not written by this launcher"])
        if changed and restart_changed:
            return Action(run, RESTART, sweep.eval_enabled, why="trained with other settings: "
                          + "; ".join(changed) + f"; its folder moves to {replaced_dir(sweep)}/")
        if changed:
            return Action(run, REFUSE, why="trained with other settings: " + "; ".join(changed))
        if (run.run_dir / TRAIN_DONE).is_file():
            return Action(run, EVALUATE if evaluate else SKIP, why="trained"
                          + ("" if evaluate else " and evaluated" if sweep.eval_enabled else ""))
        return Action(run, RESUME, evaluate, epoch=resume_epoch(run.run_dir),
                      why="from checkpoint_last.pt")
    if sweep.continue_from is None:
        return Action(run, TRAIN, evaluate)
    source = sweep.continue_from / run.name
    try:
        epochs, why = source_epochs(run, source)
    except SweepError as err:
        return Action(run, REFUSE, why=str(err))
    if epochs is None:
        return Action(run, TRAIN, evaluate, why=why)
    return Action(run, CONTINUE, evaluate, epoch=epochs, source=source)


def make_plan(sweep: Sweep, runs: list[Run], restart_changed: bool = False,
              skip_recorded: Path | None = None) -> Plan:
    """The plan of ``runs``: those with a study record in ``skip_recorded`` skipped, the
    others as :func:`plan_run` finds them."""
    actions = []
    for run in runs:
        if skip_recorded is not None and (skip_recorded / f"{run.name}.json").is_file():
            actions.append(Action(run, SKIP, why=f"a study record in {skip_recorded}"))
        else:
            actions.append(plan_run(sweep, run, restart_changed))
    return Plan(sweep, actions, skip_recorded)
