"""Turning a validated sweep into submitit jobs: SLURM arrays, a local run, or a dry run."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from fairseq_tying.common import LM_TASK, PLUGIN_DIR, RUN_JSON, atomic
from fairseq_tying.common.extras import require
from fairseq_tying.launch import FOR_WHAT
from fairseq_tying.launch.config import Resources, Run, Sweep, SweepError
from fairseq_tying.launch.continuation import start_from
from fairseq_tying.launch.job import (
    DONE,
    CollectJob,
    EvalJob,
    LocalRunJob,
    TrainJob,
    hold_run,
    write_json,
)
from fairseq_tying.launch.plateau import Plateau, read_history

submitit = require("submitit", "launch", FOR_WHAT)
_make_sbatch_string = require("submitit.slurm.slurm", "launch", FOR_WHAT)._make_sbatch_string

# how often the local progress bar redraws while runs train: its clock, and each run's epoch
REFRESH_S = 30.0
POLL_S = 0.2  # how often a local job's end is looked for


@dataclass
class Submitted:
    train: dict[str, Any] = field(default_factory=dict)  # run name -> job
    evaluate: list[Any] = field(default_factory=list)
    collect: Any = None
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


def prepare_run_dir(sweep: Sweep, run: Run) -> None:
    """The run's own directory with its resolved config and the exact training command."""
    run.run_dir.mkdir(parents=True, exist_ok=True)
    config = {**run.describe(), "sweep": sweep.name, "sweep_file": str(sweep.path),
              "resources": vars(run.resources), "update_freq": sweep.update_freq}
    write_json(run.run_dir / RUN_JSON, config)
    if sweep.continue_from and (said := start_from(run, sweep.continue_from / run.name)):
        print(said, file=sys.stderr)
    cmd = TrainJob(run.describe(), PLUGIN_DIR).command()
    atomic.write_text(run.run_dir / "command.sh",
                      "# per-rank distributed flags are added in the job (see command.json)\n"
                      + shlex.join(cmd) + "\n")


def dry_run(sweep: Sweep, runs: list[Run]) -> None:
    folder = sweep.output_dir / ".submitit" / "%j"
    params = train_params(sweep, f"{sweep.name}-train")
    array = f" (a job array of {len(runs)})" if len(runs) > 1 else ""
    print(f"# sweep {sweep.name}: {len(runs)} training job(s){array} -> {sweep.output_dir}")
    if len(runs) > 1:
        params["map_count"] = len(runs)
    print(_make_sbatch_string(command="<python -m submitit.core._submit FOLDER>",
                              folder=folder, **params))
    for run in runs:
        cmd = TrainJob(run.describe(), PLUGIN_DIR).command()
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
            print(f"# then: python -m fairseq_tying.studies collect {sweep.output_dir} "
                  f"--out {sweep.output_dir}")


def submit_slurm(sweep: Sweep, runs: list[Run]) -> Submitted:
    check_cluster(sweep.resources)
    out = Submitted()
    to_train = [r for r in runs if not (r.run_dir / DONE).exists()]
    out.skipped = [r.name for r in runs if r not in to_train]
    for run in to_train:
        prepare_run_dir(sweep, run)
    folder = sweep.output_dir / ".submitit" / "%j"
    ex = submitit.SlurmExecutor(folder, max_num_timeout=sweep.resources.max_num_timeout)
    if to_train:
        ex.update_parameters(**train_params(sweep, f"{sweep.name}-train"))
        with ex.batch():
            for run in to_train:
                out.train[run.name] = ex.submit(TrainJob(run.describe(), PLUGIN_DIR))
    if not sweep.eval_enabled:
        return out
    to_eval = [r for r in runs if not (r.run_dir / "eval.json").exists()]
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
                job = EvalJob(run.describe(), sweep.evaluation, sweep.evaluation_also)
                out.evaluate.append(ex.submit(job))
    if sweep.task == LM_TASK:  # collect compares BLEU; `study` reports an LM sweep
        return out
    params = eval_params(sweep, f"{sweep.name}-collect")
    params.update(cpus_per_task=1, additional_parameters={})
    params.pop("gpus_per_node", None)
    if out.evaluate:
        params["dependency"] = f"afterany:{out.evaluate[0].job_id.split('_')[0]}"
    ex.update_parameters(**params)
    out.collect = ex.submit(CollectJob(str(sweep.output_dir), str(sweep.output_dir)))
    return out


def _local_executor(sweep: Sweep, tasks: int, gpus: int) -> submitit.LocalExecutor:
    ex = submitit.LocalExecutor(sweep.output_dir / ".submitit" / "%j")
    ex.update_parameters(timeout_min=sweep.resources.time_min, tasks_per_node=tasks, nodes=1,
                         gpus_per_node=gpus)
    return ex


class Stopped(SweepError):
    """The local launcher was stopped (Ctrl-C, SIGTERM); its jobs were stopped with it."""


class LocalJobs:
    """The local jobs now running, so that stopping the launcher stops them too: submitit's
    local jobs ignore SIGTERM and Ctrl-C reaches the launcher only, whose threads would wait
    for its jobs to end (hours), and a launcher killed outright leaves them training."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[Any, str] = {}  # job -> run name
        self.stopping = threading.Event()

    def run(self, executor: submitit.LocalExecutor, fn: Callable[[], Any], name: str,
            started: Callable[[Any], None] = lambda job: None) -> Any:
        """``fn`` as a job of ``executor``, waited for; none is started once stopping."""
        with self._lock:
            if self.stopping.is_set():
                raise Stopped(f"{name}: not started, the launcher is stopping")
            job = executor.submit(fn)
            self._running[job] = name
        started(job)
        try:
            while not job.done():  # as job.results() waits, but every POLL_S, not every 1 s
                time.sleep(POLL_S)
            if self.stopping.is_set():  # cancelled: job.results() would wait 15 s for a result
                raise Stopped(f"{name}: stopped with the launcher")
            job.results()
        finally:
            with self._lock:
                self._running.pop(job, None)
        return job

    def stop(self) -> list[str]:
        """Cancel every running job (submitit sends its tasks SIGINT, then SIGKILL); the names
        of their runs."""
        with self._lock:
            self.stopping.set()
            for job in self._running:
                job.cancel(check=False)
            return sorted(set(self._running.values()))


def _run_one_local(sweep: Sweep, run: Run, out: Submitted, deadline: float | None,
                   jobs: LocalJobs) -> bool:
    """Train (or resume) one run and evaluate it (in one local job when it runs as one task);
    False if its training was due after ``deadline`` (``time.monotonic()``) and it was left
    for later."""
    res = sweep.resources
    evaluation = None
    if sweep.eval_enabled and not (run.run_dir / "eval.json").exists():
        evaluation = EvalJob(run.describe(), sweep.evaluation, sweep.evaluation_also)
    if (run.run_dir / DONE).exists():
        out.skipped.append(run.name)
    elif deadline is not None and time.monotonic() > deadline:
        out.not_started.append(run.name)
        return False
    else:
        hold_run(run.run_dir).close()  # another process trains it: refuse now, by name
        prepare_run_dir(sweep, run)
        ex = _local_executor(sweep, res.world_size, res.gpus_per_node * res.nodes)
        log = run.run_dir / "logs" / "train.rank0.log"
        one_task = evaluation is not None and res.world_size == 1
        job = (LocalRunJob(run.describe(), PLUGIN_DIR, evaluation) if one_task
               else TrainJob(run.describe(), PLUGIN_DIR))
        out.train[run.name] = jobs.run(
            ex, job, run.name,
            lambda job: tqdm.write(f"training {run.name} (local job {job.job_id}, log {log})",
                                   file=sys.stderr))
        if one_task:
            return True
    if evaluation is not None:
        ex = _local_executor(sweep, 1, min(res.gpus_per_node, 1))
        jobs.run(ex, evaluation, run.name)
    return True


class _Signalled(BaseException):
    """SIGTERM in the launcher, raised in its main thread like Ctrl-C's KeyboardInterrupt."""


def _raise_signalled(signum: int, frame: Any) -> None:
    raise _Signalled(signal.Signals(signum).name)


def _ignore(signum: int, frame: Any) -> None:
    """SIGINT in a launcher started with it ignored: still ignored, by a handler that the
    processes it starts do not inherit (they would inherit SIG_IGN)."""


def training_now(runs: list[Run]) -> str:
    """Each run's last validated epoch and the value the plateau rule watches, for the progress
    bar: ``none.dot.s3 epoch 4 (6.434)``, its name without the dataset and arch all share."""
    def label(run: Run) -> str:
        name = run.name.removeprefix(f"{run.dataset}.{run.arch}.")
        history = read_history(run.run_dir)
        if not history:
            return f"{name} starting"
        return f"{name} epoch {history[-1]['epoch']} ({history[-1]['value']:.4g})"

    return ", ".join(label(r) for r in runs)


def epochs_done(run: Run) -> int:
    """Epochs the run has validated so far (its valid_history.json)."""
    history = read_history(run.run_dir)
    return history[-1]["epoch"] if history else 0


def stop_epoch(run: Run) -> int | None:
    """The epoch at which a finished run stopped (its train.done), None if not known."""
    done = run.run_dir / DONE
    if not done.is_file():
        return None
    return json.loads(done.read_text()).get("stop", {}).get("epoch")


def _duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


class Forecast:
    """Time left for a sweep of plateau-stopped runs, at the pace since it started here: the
    epochs validated by all workers together, over the time from the start to the last epoch
    seen to end (so the estimate holds still between epochs). A run is expected to stop at the
    mean stop epoch of the finished runs (``stops``: recorded ones, and those that finish
    here); while none has finished, at the rule's earliest stop, and the estimate is a lower
    bound. The pace counts only time the sweep was running: a gap between two calls longer
    than ``max_gap`` seconds (the bar refreshes every ``REFRESH_S``) is a suspended process
    (SIGSTOP, a machine asleep) and counts as ``max_gap``; None counts every gap whole."""

    def __init__(self, runs: list[Run], stops: Iterable[int],
                 clock: Callable[[], float] = time.monotonic,
                 max_gap: float | None = 4 * REFRESH_S) -> None:
        self.rule = Plateau(**runs[0].stopping) if runs and runs[0].stopping else None
        self.stops = list(stops)
        self.runs = runs
        self.start = self.seen = sum(map(epochs_done, runs))
        self.clock, self.max_gap = clock, max_gap
        self.last = clock()
        self.running = self.t_seen = 0.0  # seconds the sweep has run here, at the last epoch

    def _tick(self) -> None:
        now = self.clock()
        gap = now - self.last
        self.running += gap if self.max_gap is None else min(gap, self.max_gap)
        self.last = now

    def finished(self, run: Run) -> None:
        if (epoch := stop_epoch(run)) is not None:
            self.stops.append(epoch)

    def __call__(self, unfinished: list[Run]) -> str:
        """``≈ 2 h 05 min left (runs of 13.5 epochs)`` for the ``unfinished`` runs; "" without
        a plateau rule or before an epoch has ended here."""
        if self.rule is None or not unfinished:
            return ""
        self._tick()
        if (total := sum(map(epochs_done, self.runs))) != self.seen:
            self.seen, self.t_seen = total, self.running
        trained, elapsed = self.seen - self.start, self.t_seen
        if trained <= 0 or elapsed <= 0:
            return ""
        if not self.rule.plateau:  # a fixed budget: every run trains to the cap
            sign, expected = "≈", self.rule.max_epoch
        elif self.stops:
            sign, expected = "≈", min(sum(self.stops) / len(self.stops), self.rule.max_epoch)
        else:
            sign, expected = "≥", self.rule.earliest_stop
        left = sum(max(expected - epochs_done(r), 0) for r in unfinished) * elapsed / trained
        more = "" if self.stops or not self.rule.plateau else " or more"
        return f"{sign} {_duration(left)} left (runs of {expected:.3g} epochs{more})"


def local_order(runs: list[Run]) -> list[Run]:
    """The order of a local sweep: by the grids' ``priority``, then seed by seed (so that a
    partial sweep has whole seeds), then as listed."""
    return sorted(runs, key=lambda r: (r.priority, r.seed))


def run_local(sweep: Sweep, runs: list[Run], workers: int = 1,
              recorded_stops: Iterable[int] = (), no_start_after: float | None = None
              ) -> Submitted:
    """The same jobs on this machine without SLURM: ``workers`` runs side by side (all ranks of
    a run on this host), seed by seed so that a partial sweep has whole seeds, with a progress
    bar over runs that names the epoch each running run has reached. A rerun skips finished
    runs and resumes unfinished ones from their ``checkpoint_last.pt``. Under a plateau rule
    the bar's estimate of the time left is a :class:`Forecast` (``recorded_stops``: the stop
    epochs of runs finished elsewhere), not tqdm's runs per second. With ``no_start_after``
    (minutes), no training starts or resumes after that long: on a machine that is only
    yours for a while, a run that cannot finish is better left whole for the next call."""
    out = Submitted()
    deadline = None if no_start_after is None else time.monotonic() + 60 * no_start_after
    order = local_order(runs)
    finished = [r for r in order if (r.run_dir / DONE).exists()
                and (not sweep.eval_enabled or (r.run_dir / "eval.json").exists())]
    todo = [r for r in order if r not in finished]
    out.skipped += [r.name for r in finished]
    forecast = Forecast(todo, [*recorded_stops, *filter(None, map(stop_epoch, finished))])
    bar_format = "{l_bar}{bar}| {n_fmt}/{total_fmt} runs [{elapsed}{postfix}]" \
        if forecast.rule else None
    jobs = LocalJobs()
    main_thread = threading.current_thread() is threading.main_thread()  # signals go there
    previous = signal.signal(signal.SIGTERM, _raise_signalled) if main_thread else None
    ignored = main_thread and signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:  # a background job (`&`, nohup): the launcher keeps ignoring Ctrl-C, but the
        signal.signal(signal.SIGINT, _ignore)  # jobs it starts must not: cancelling is a SIGINT
    try:
        with tqdm(total=len(order), initial=len(finished), unit="run", desc=sweep.name,
                  file=sys.stderr, dynamic_ncols=True, smoothing=0, bar_format=bar_format) as bar, \
                ThreadPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(_run_one_local, sweep, run, out, deadline, jobs): run
                       for run in todo}
            pending: set[Future] = set(futures)
            try:
                while pending:
                    done, pending = wait(pending, timeout=REFRESH_S, return_when=FIRST_COMPLETED)
                    for future in done:
                        if future.exception() is not None:
                            pool.shutdown(wait=False, cancel_futures=True)  # start no other run
                        if future.result():  # a failed run stops the sweep with its error
                            forecast.finished(futures[future])
                            bar.update()
                    left = forecast([futures[f] for f in pending])
                    now = training_now([futures[f] for f in pending if f.running()])
                    bar.set_postfix_str("; ".join(filter(None, (now, left))))
            except (KeyboardInterrupt, _Signalled) as stop:
                pool.shutdown(wait=False, cancel_futures=True)
                names = jobs.stop()  # the pool's threads end as their jobs do, in seconds
                why = "Ctrl-C" if isinstance(stop, KeyboardInterrupt) else str(stop)
                raise Stopped(f"stopped by {why}; the jobs of {', '.join(names) or 'no run'} "
                              "were stopped with it. The same command resumes each unfinished "
                              "run from its last checkpoint") from None
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    if out.not_started:
        tqdm.write(f"not started (--no-start-after {no_start_after:g} min): "
                   f"{', '.join(out.not_started)}; the same command trains them", file=sys.stderr)
    if sweep.eval_enabled and sweep.task != LM_TASK:  # collect compares BLEU
        CollectJob(str(sweep.output_dir), str(sweep.output_dir))()
    return out


def record(sweep: Sweep, sub: Submitted) -> None:
    """``OUTPUT/jobs.json``: which job trained/evaluated which run."""
    sweep.output_dir.mkdir(parents=True, exist_ok=True)
    jobs = {"train": {name: j.job_id for name, j in sub.train.items()},
            "evaluate": [j.job_id for j in sub.evaluate],
            "collect": sub.collect.job_id if sub.collect is not None else None,
            "skipped": sub.skipped, "not_started": sub.not_started}
    write_json(sweep.output_dir / "jobs.json", jobs)
    print(json.dumps(jobs, indent=1))
