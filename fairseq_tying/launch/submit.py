"""Carrying out a launch's plan (``plan.py``) as submitit jobs: SLURM arrays, or a dry run
that prints it (on this machine: ``local.py``)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from fairseq_tying.common import LM_TASK, PLUGIN_DIR, atomic
from fairseq_tying.common.extras import require
from fairseq_tying.common.run_spec import write_run_json
from fairseq_tying.launch import FOR_WHAT
from fairseq_tying.launch.continuation import copy_from
from fairseq_tying.launch.job import EvalJob, SummaryJob, TrainJob, write_json
from fairseq_tying.launch.plan import CONTINUE, RESTART, SKIP, Action, Plan, replaced_path
from fairseq_tying.sweeps.config import Resources, Sweep, SweepError

submitit = require("submitit", "launch", FOR_WHAT)
_make_sbatch_string = require("submitit.slurm.slurm", "launch", FOR_WHAT)._make_sbatch_string


@dataclass
class Inline:
    """A step the launcher ran in its own process (a local sweep's summary)."""

    job_id: str = "launcher"


@dataclass
class Submitted:
    train: dict[str, Any] = field(default_factory=dict)  # run name -> job
    evaluate: list[Any] = field(default_factory=list)
    summary: Any = None  # the job of the sweep's summary (its answer)
    skipped: list[str] = field(default_factory=list)
    not_started: list[str] = field(default_factory=list)  # left for a later call (--no-start-after)


def train_params(sweep: Sweep, name: str) -> dict[str, Any]:
    res = sweep.resources
    params: dict[str, Any] = {
        "job_name": name, "nodes": res.nodes, "ntasks_per_node": res.tasks_per_node,
        "cpus_per_task": res.cpus_per_task, "mem": f"{res.mem_gb}GB", "time": res.time_min,
        "signal_delay_s": res.signal_delay_s, "array_parallelism": res.array_parallelism,
        "stderr_to_stdout": True,
    }
    if res.gpu:
        params["gpus_per_node"] = res.gpus_per_node
    for key in ("partition", "constraint", "account", "qos"):
        if getattr(res, key):
            params[key] = getattr(res, key)
    return params


def eval_params(sweep: Sweep, name: str) -> dict[str, Any]:
    params = train_params(sweep, name)
    params.update(nodes=1, ntasks_per_node=1, cpus_per_task=sweep.eval_cpus,
                  mem=f"{sweep.eval_mem_gb}GB", time=sweep.eval_time_min)
    if sweep.resources.gpu:
        params["gpus_per_node"] = 1
    return params


def check_cluster(res: Resources) -> None:
    """Refuse resources the cluster's partition cannot ever satisfy (read with ``sinfo``)."""
    fmt = ["sinfo", "-h", "-o", "%P %D %c %m %G"]
    try:
        out = subprocess.run(fmt + (["-p", res.partition] if res.partition else []),
                             capture_output=True, text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as err:
        raise SweepError(f"resources: cannot query the cluster with sinfo ({err})") from err
    lines = [line.split() for line in out.splitlines() if line.strip()]
    if not res.partition:
        lines = [f for f in lines if f[0].endswith("*")] or lines
    if not lines:
        raise SweepError(f"resources.partition: no partition {res.partition!r} on this cluster")
    part, nodes, cpus, mem = lines[0][0].rstrip("*"), int(lines[0][1]), lines[0][2], lines[0][3]
    cpus_n = int(cpus.rstrip("+"))
    mem_mb = int(mem.rstrip("+"))
    if res.nodes > nodes:
        raise SweepError(f"resources.nodes: {res.nodes} requested, partition {part} has {nodes}")
    if res.tasks_per_node * res.cpus_per_task > cpus_n:
        raise SweepError(f"resources.cpus_per_task: {res.tasks_per_node} task(s) x "
                         f"{res.cpus_per_task} CPUs per node, nodes of {part} have {cpus_n}")
    if res.mem_gb * 1024 > mem_mb:
        raise SweepError(f"resources.mem_gb: {res.mem_gb} GB requested, nodes of {part} have "
                         f"{mem_mb} MB")


def prepare_run_dir(sweep: Sweep, action: Action) -> None:
    """The run's own directory, as the plan's ``action`` says (the old folder moved aside for a
    restart, another run's checkpoints copied for a continuation), with its resolved config and
    the exact training command."""
    run = action.run
    if action.kind == RESTART and run.run_dir.exists():
        moved = replaced_path(sweep, run)
        moved.parent.mkdir(parents=True, exist_ok=True)
        run.run_dir.rename(moved)
        print(f"{run.name}: its folder trained with other settings is now {moved}",
              file=sys.stderr)
    run.run_dir.mkdir(parents=True, exist_ok=True)
    write_run_json(sweep.spec(run))
    if action.kind == CONTINUE and action.source is not None:
        print(copy_from(run, action.source), file=sys.stderr)
    cmd = TrainJob(sweep.spec(run), PLUGIN_DIR).command()
    atomic.write_text(run.run_dir / "command.sh",
                      "# per-rank distributed flags are added in the job (see command.json)\n"
                      + shlex.join(cmd) + "\n")


def dry_run(plan: Plan) -> None:
    """The plan, then the sbatch parameters and the commands of the runs it trains."""
    print(plan.show())
    sweep, runs = plan.sweep, [a.run for a in plan.actions if a.trains]
    folder = sweep.output_dir / ".submitit" / "%j"
    params = train_params(sweep, f"{sweep.name}-train")
    array = f" (a job array of {len(runs)})" if len(runs) > 1 else ""
    print(f"# sweep {sweep.name}: {len(runs)} training job(s){array} -> {sweep.output_dir}")
    if len(runs) > 1:
        params["map_count"] = len(runs)
    print(_make_sbatch_string(command="<python -m submitit.core._submit FOLDER>",
                              folder=folder, **params))
    for run in runs:
        cmd = TrainJob(sweep.spec(run), PLUGIN_DIR).command()
        print(f"# {run.name}\n{shlex.join(cmd)}")
    if sweep.eval_enabled:
        params = eval_params(sweep, f"{sweep.name}-eval")
        params["dependency"] = "aftercorr:<TRAIN_ARRAY_ID>"
        if len(runs) > 1:
            params["map_count"] = len(runs)
        print("# evaluation array, each task after its training task (aftercorr):")
        print(_make_sbatch_string(command="<python -m fairseq_tying.evaluation RUN_DIR>",
                                  folder=folder, **params))
        if sweep.task != LM_TASK:
            answer = shlex.join(["python", "-m", "fairseq_tying.studies", "answer",
                                 str(sweep.path), "--runs", str(sweep.output_dir), "--out",
                                 str(sweep.output_dir / "answer")])
            print(f"# then, after the evaluations (afterany), the sweep's summary "
                  f"{sweep.output_dir / 'results.md'}: its answer ({answer})")


def submit_slurm(plan: Plan) -> Submitted:
    """The plan as SLURM arrays: its training jobs, each evaluation after its training."""
    sweep = plan.sweep
    check_cluster(sweep.resources)
    out = Submitted()
    to_train = [a.run for a in plan.actions if a.trains]
    out.skipped = [a.run.name for a in plan.actions if a.kind == SKIP]
    for action in plan.actions:
        if action.trains:
            prepare_run_dir(sweep, action)
    folder = sweep.output_dir / ".submitit" / "%j"
    ex = submitit.SlurmExecutor(folder, max_num_timeout=sweep.resources.max_num_timeout)
    if to_train:
        ex.update_parameters(**train_params(sweep, f"{sweep.name}-train"))
        with ex.batch():
            for run in to_train:
                out.train[run.name] = ex.submit(TrainJob(sweep.spec(run), PLUGIN_DIR))
    if not sweep.eval_enabled:
        return out
    to_eval = [a.run for a in plan.actions if a.evaluate]
    if to_eval:
        params = eval_params(sweep, f"{sweep.name}-eval")
        params["additional_parameters"] = {"kill_on_invalid_dep": "yes"}
        if out.train:
            array_id = next(iter(out.train.values())).job_id.split("_")[0]
            corr = len(out.train) > 1 and to_eval == to_train
            params["dependency"] = f"{'aftercorr' if corr else 'afterok'}:{array_id}"
        ex.update_parameters(**params)
        with ex.batch():
            for run in to_eval:
                job = EvalJob(sweep.spec(run), sweep.evaluation, sweep.evaluation_also)
                out.evaluate.append(ex.submit(job))
    if sweep.task == LM_TASK:  # the answer compares BLEU; `study` reports an LM sweep
        return out
    params = eval_params(sweep, f"{sweep.name}-summary")
    params.update(cpus_per_task=1, additional_parameters={})
    params.pop("gpus_per_node", None)
    if out.evaluate:
        params["dependency"] = f"afterany:{out.evaluate[0].job_id.split('_')[0]}"
    ex.update_parameters(**params)
    out.summary = ex.submit(SummaryJob(sweep, plan.skip_recorded))
    return out


def record(sweep: Sweep, sub: Submitted) -> None:
    """``OUTPUT/jobs.json``: which job trained/evaluated which run."""
    sweep.output_dir.mkdir(parents=True, exist_ok=True)
    jobs = {"train": {name: j.job_id for name, j in sub.train.items()},
            "evaluate": [j.job_id for j in sub.evaluate],
            "summary": sub.summary.job_id if sub.summary is not None else None,
            "skipped": sub.skipped, "not_started": sub.not_started}
    write_json(sweep.output_dir / "jobs.json", jobs)
    print(json.dumps(jobs, indent=1))
