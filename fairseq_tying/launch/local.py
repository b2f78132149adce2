"""Carrying out a launch's plan on this machine without SLURM: runs side by side as submitit local
jobs, a progress bar with each run's epoch and the time left, stopped cleanly by Ctrl-C or
SIGTERM."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tqdm import tqdm

from fairseq_tying.common import LM_TASK, PLUGIN_DIR
from fairseq_tying.common.extras import require
from fairseq_tying.launch import FOR_WHAT
from fairseq_tying.launch.job import EvalJob, LocalRunJob, SummaryJob, TrainJob, hold_run
from fairseq_tying.launch.plan import SKIP, Action, Plan
from fairseq_tying.launch.submit import Inline, Submitted, prepare_run_dir
from fairseq_tying.sweeps.config import Run, Sweep, SweepError
from fairseq_tying.sweeps.plateau import Plateau, epochs_done, read_history, stop_epoch

submitit = require("submitit", "launch", FOR_WHAT)

# how often the local progress bar redraws while runs train: its clock, and each run's epoch
REFRESH_S = 30.0
POLL_S = 0.2  # how often a local job's end is looked for


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


def _run_one_local(sweep: Sweep, action: Action, out: Submitted, deadline: float | None,
                   jobs: LocalJobs) -> bool:
    """Carry out one run's action: train (or resume, continue, restart) it and evaluate it (in
    one local job when it runs as one task), or only evaluate it; False if its training was due
    after ``deadline`` (``time.monotonic()``) and it was left for later."""
    res, run = sweep.resources, action.run
    evaluation = None
    if action.evaluate:
        evaluation = EvalJob(sweep.spec(run), sweep.evaluation, sweep.evaluation_also)
    if action.trains:
        if deadline is not None and time.monotonic() > deadline:
            out.not_started.append(run.name)
            return False
        hold_run(run.run_dir).close()  # another process trains it: refuse now, by name
        prepare_run_dir(sweep, action)
        ex = _local_executor(sweep, res.world_size, res.gpus_per_node * res.nodes)
        log = run.run_dir / "logs" / "train.rank0.log"
        one_task = evaluation is not None and res.world_size == 1
        job = (LocalRunJob(sweep.spec(run), PLUGIN_DIR, evaluation) if one_task
               else TrainJob(sweep.spec(run), PLUGIN_DIR))
        out.train[run.name] = jobs.run(
            ex, job, run.name,
            lambda job: tqdm.write(f"training {run.name} (local job {job.job_id}, log {log})",
                                   file=sys.stderr))
        if one_task:  # trained and evaluated by one job
            out.evaluate.append(out.train[run.name])
            return True
    if evaluation is not None:
        ex = _local_executor(sweep, 1, min(res.gpus_per_node, 1))
        out.evaluate.append(jobs.run(ex, evaluation, run.name))
    return True


class Signalled(BaseException):
    """SIGTERM in the launcher, raised in its main thread like Ctrl-C's KeyboardInterrupt."""


def _raise_signalled(signum: int, frame: Any) -> None:
    raise Signalled(signal.Signals(signum).name)


def _ignore(signum: int, frame: Any) -> None:
    """SIGINT in a launcher started with it ignored: still ignored, by a handler that the
    processes it starts do not inherit (they would inherit SIG_IGN)."""


def training_now(runs: list[Run]) -> str:
    """Each run's last validated epoch and the value the plateau rule watches, for the progress
    bar: ``none.dot.s3 epoch 4 (6.434)``, its name without the dataset and arch all share."""
    def label(run: Run) -> str:
        name = run.name.removeprefix(f"{run.identity.dataset}.{run.identity.arch}.")
        history = read_history(run.run_dir)
        if not history:
            return f"{name} starting"
        return f"{name} epoch {history[-1]['epoch']} ({history[-1]['value']:.4g})"

    return ", ".join(label(r) for r in runs)


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


@contextmanager
def stoppable() -> Iterator[None]:
    """SIGTERM stops the launcher as Ctrl-C does (raised in the main thread, where signals go).
    A launcher started as a background job (`&`, nohup) keeps ignoring Ctrl-C, by a handler its
    jobs do not inherit: they must not ignore it, as cancelling a job is a SIGINT."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_signalled)
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, _ignore)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextmanager
def jobs_stderr(path: Path) -> Iterator[None]:
    """The local jobs' controllers write their stderr to ``path``, the launcher still to the
    terminal. A controller inherits the launcher's stderr, and Ctrl-C (sent to the whole
    process group) or a cancelled job ends it with a KeyboardInterrupt traceback, which would
    follow the launcher's one-line message; its tasks write to their own logs anyway."""
    if _fileno(sys.stderr) != 2:  # a captured stderr (pytest), a closed one
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    terminal, launcher = os.dup(2), sys.stderr
    with open(path, "a") as log:
        os.dup2(log.fileno(), 2)  # what processes started from now on inherit
    sys.stderr = os.fdopen(terminal, "w", buffering=1, encoding=launcher.encoding,
                           errors=launcher.errors)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(terminal, 2)
        sys.stderr.close()
        sys.stderr = launcher


def _fileno(stream: Any) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def _follow(futures: dict[Future, Run], pool: ThreadPoolExecutor, bar: tqdm,
            forecast: Forecast) -> None:
    """Wait for the runs, redrawing the bar every REFRESH_S with the epoch of each running run
    and the time left; after a failed run or a stop no other run starts."""
    pending: set[Future] = set(futures)
    try:
        while pending:
            done, pending = wait(pending, timeout=REFRESH_S, return_when=FIRST_COMPLETED)
            for future in done:
                if future.result():  # a failed run raises: the sweep stops with its error
                    forecast.finished(futures[future])
                    bar.update()
            left = forecast([futures[f] for f in pending])
            now = training_now([futures[f] for f in pending if f.running()])
            bar.set_postfix_str("; ".join(filter(None, (now, left))))
    except BaseException:  # a failed run, Ctrl-C or SIGTERM: start no other run
        pool.shutdown(wait=False, cancel_futures=True)
        raise


def local_order(runs: list[Run]) -> list[Run]:
    """The order of a local sweep: by the grids' ``priority``, then seed by seed (so that a
    partial sweep has whole seeds), then as listed."""
    return sorted(runs, key=lambda r: (r.priority, r.identity.seed))


def run_local(plan: Plan, workers: int = 1, recorded_stops: Iterable[int] = (),
              no_start_after: float | None = None) -> Submitted:
    """The plan's jobs on this machine without SLURM: ``workers`` runs side by side (all ranks
    of a run on this host), seed by seed so that a partial sweep has whole seeds, with a
    progress bar over runs that names the epoch each running run has reached. Under a plateau
    rule the bar's estimate of the time left is a :class:`Forecast` (``recorded_stops``: the
    stop epochs of runs finished elsewhere), not tqdm's runs per second. With
    ``no_start_after`` (minutes), no training starts or resumes after that long: on a machine
    that is only yours for a while, a run that cannot finish is better left whole for the next
    call."""
    sweep, out = plan.sweep, Submitted()
    deadline = None if no_start_after is None else time.monotonic() + 60 * no_start_after
    by_run = {id(a.run): a for a in plan.actions}
    order = [by_run[id(r)] for r in local_order([a.run for a in plan.actions])]
    finished = [a.run for a in order if a.kind == SKIP]
    todo = [a for a in order if a.kind != SKIP]
    out.skipped += [r.name for r in finished]
    forecast = Forecast([a.run for a in todo],
                        [*recorded_stops, *filter(None, map(stop_epoch, finished))])
    bar_format = "{l_bar}{bar}| {n_fmt}/{total_fmt} runs [{elapsed}{postfix}]" \
        if forecast.rule else None
    jobs = LocalJobs()
    with jobs_stderr(sweep.output_dir / ".submitit" / "controllers.log"), stoppable(), \
            tqdm(total=len(order), initial=len(finished), unit="run", desc=sweep.name,
                 file=sys.stderr, dynamic_ncols=True, smoothing=0, bar_format=bar_format
                 ) as bar, ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(_run_one_local, sweep, action, out, deadline, jobs): action.run
                   for action in todo}
        try:
            _follow(futures, pool, bar, forecast)
        except (KeyboardInterrupt, Signalled) as stop:  # inside the pool's `with`, whose end
            names = jobs.stop()  # waits for its threads: they end as their jobs do, in seconds
            why = "Ctrl-C" if isinstance(stop, KeyboardInterrupt) else str(stop)
            raise Stopped(f"stopped by {why}; the jobs of {', '.join(names) or 'no run'} were "
                          "stopped with it. The same command resumes each unfinished run from "
                          "its last checkpoint") from None
    if out.not_started:
        tqdm.write(f"not started (--no-start-after {no_start_after:g} min): "
                   f"{', '.join(out.not_started)}; the same command trains them", file=sys.stderr)
    if sweep.eval_enabled and sweep.task != LM_TASK:  # the answer compares BLEU
        SummaryJob(sweep, plan.skip_recorded)()
        out.summary = Inline()
    return out
